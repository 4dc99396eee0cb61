"""Run checkpoints: the model plus everything needed to continue the run exactly.

``run_dir/checkpoints/step-00000100/`` holds ``config.json``, ``model.safetensors`` and
``training_state.pt`` (optimiser, RNG, EMA, counters: tensors and plain values only, read back with
``weights_only=True``). When the trained module wraps a ViT as ``.encoder`` (masked patch prediction),
the directory is still a plain ViT checkpoint, and the wrapper's own weights (its [mask] embedding and
prediction head) go beside it in ``objective.safetensors``. Each is written atomically, so the previous one survives a crash at any
moment; only the last ``keep_last`` are kept.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from safetensors.torch import save_file

from ..atomic import atomic_directory
from ..checkpoints.loading import read_native, read_safetensors
from ..models.vit import VisionTransformer

STATE_FILE = "training_state.pt"
OBJECTIVE_FILE = "objective.safetensors"
_ENCODER = "encoder."
PREFIX = "step-"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:08d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (half-written ones are hidden temporaries, never listed)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / STATE_FILE).is_file())


def vit_of(model: nn.Module) -> VisionTransformer:
    """The ViT being trained: the model itself, or the ``encoder`` of a pre-training wrapper."""
    return getattr(model, "encoder", model)


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, state: dict[str, Any], keep_last: int) -> Path:
    path = checkpoint_dir(run_dir, step)
    with atomic_directory(path) as staging:
        vit_of(model).save(staging)
        if vit_of(model) is not model:
            own = {k: t.detach().cpu().contiguous() for k, t in model.state_dict().items() if not k.startswith(_ENCODER)}
            save_file(own, staging / OBJECTIVE_FILE)
        torch.save(state, staging / STATE_FILE)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: Path, model: nn.Module) -> dict[str, Any]:
    """Load the weights into ``model`` (same architecture) and return the training state."""
    config, weights = read_native(Path(path))
    if config.to_dict() != vit_of(model).config.to_dict():
        raise ValueError(f"{path}: checkpoint config differs from the model being trained; resume with "
                         f"the same recipe")
    if vit_of(model) is not model:
        weights = {**{_ENCODER + k: t for k, t in weights.items()}, **read_safetensors(Path(path) / OBJECTIVE_FILE)}
    model.load_state_dict(weights, strict=True)
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
