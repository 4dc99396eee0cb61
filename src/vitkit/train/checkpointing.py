"""Run checkpoints: the model plus everything needed to continue the run exactly.

``run_dir/checkpoints/step-00000100/`` holds ``config.json``, ``model.safetensors`` and
``training_state.pt`` (optimiser, RNG, EMA, counters: tensors and plain values only, read back with
``weights_only=True``). Each is written atomically, so the previous one survives a crash at any
moment; only the last ``keep_last`` are kept.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..atomic import atomic_directory
from ..checkpoints.loading import read_native

STATE_FILE = "training_state.pt"
PREFIX = "step-"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:08d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (half-written ones are hidden temporaries, never listed)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / STATE_FILE).is_file())


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, state: dict[str, Any], keep_last: int) -> Path:
    path = checkpoint_dir(run_dir, step)
    with atomic_directory(path) as staging:
        model.save(staging)
        torch.save(state, staging / STATE_FILE)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: Path, model: nn.Module) -> dict[str, Any]:
    """Load the weights into ``model`` (same architecture) and return the training state."""
    config, weights = read_native(Path(path))
    if config.to_dict() != model.config.to_dict():
        raise ValueError(f"{path}: checkpoint config differs from the model being trained; resume with "
                         f"the same recipe")
    model.load_state_dict(weights, strict=True)
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
