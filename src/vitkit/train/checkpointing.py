"""Run checkpoints: the model plus everything needed to continue the run exactly.

``run_dir/checkpoints/step-00000100/`` holds ``config.json``, ``model.safetensors`` and
``training_state.pt`` (optimiser, RNG, EMA, counters: tensors and plain values only, read back with
``weights_only=True``). When the trained module wraps a ViT as ``.encoder`` (masked patch prediction),
the directory is still a plain ViT checkpoint, and the wrapper's own weights (its [mask] embedding and
prediction head) go beside it in ``objective.safetensors``. Each is written once, under its own step's name, and
published by one rename (``atomic.atomic_directory``), so the earlier ones survive a crash at any moment; only the
last ``keep_last`` are kept. The files hold whole tensors whether the run
was one process, DDP or FSDP (``distributed.full_state`` gathers the shards), and every rank's random generator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from safetensors.torch import save_file

from ..atomic import atomic_directory, os_errors, retire, sweep
from ..checkpoints.files import load_torch_file, read_safetensors
from ..errors import CheckpointError, ConfigError, abridged
from ..checkpoints.adapters import copy_of
from ..checkpoints.loading import read_native
from ..models.vit import VisionTransformer, save_native
from .distributed import load_full_state

STATE_FILE = "training_state.pt"
OBJECTIVE_FILE = "objective.safetensors"
_ENCODER = "encoder."
PREFIX = "step-"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:08d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (half-written ones are hidden temporaries, never listed)."""
    root = Path(run_dir) / "checkpoints"
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"{root} is a file; expected the run's checkpoint directory")
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / STATE_FILE).is_file())


def sweep_run(run_dir: Path) -> None:
    """Finish what writers killed mid-write left in a run directory: a checkpoint published but not yet moved in is
    moved in, one not yet published (a checkpoint's size) deleted."""
    for directory in (Path(run_dir), Path(run_dir) / "checkpoints"):
        sweep(directory)


def vit_of(model: nn.Module) -> VisionTransformer:
    """The ViT being trained: the model itself, or the ``encoder`` of a pre-training wrapper."""
    return getattr(model, "encoder", model)


def split_weights(model: nn.Module, weights: dict[str, torch.Tensor]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the ViT's weights, a pre-training wrapper's own) from the state dict of the trained module."""
    if vit_of(model) is model:
        return weights, {}
    vit = {k[len(_ENCODER):]: t for k, t in weights.items() if k.startswith(_ENCODER)}
    return vit, {k: t for k, t in weights.items() if not k.startswith(_ENCODER)}


def plain_vit(model: nn.Module, weights: dict[str, torch.Tensor]) -> VisionTransformer:
    """A stand-alone ViT (on the CPU, unsharded; adapted as the model is) with the ViT part of ``weights``."""
    return copy_of(vit_of(model), split_weights(model, weights)[0]).eval()


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, weights: dict[str, torch.Tensor],
                    state: dict[str, Any], keep_last: int) -> Path:
    """Write ``weights`` (the whole state dict of ``model``) and the training ``state``."""
    path = checkpoint_dir(run_dir, step)
    vit, own = split_weights(model, weights)
    with atomic_directory(path) as staging:
        save_native(staging, vit_of(model).config, vit)
        with os_errors(path):
            if own:
                save_file({k: t.detach().cpu().contiguous() for k, t in own.items()}, staging / OBJECTIVE_FILE)
            torch.save(state, staging / STATE_FILE)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        retire(old)
    return path


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load the weights and the optimiser state into ``model`` (same architecture, sharded or not) and
    ``optimizer``; return the rest of the training state."""
    config, weights = read_native(Path(path))
    differences = config_differences(config.to_dict(), vit_of(model).config.to_dict())
    if differences:
        raise ConfigError(f"{path}: the checkpoint's model differs from the one the recipe builds "
                              f"({'; '.join(differences)}); resume with the recipe the run was started with")
    if vit_of(model) is not model:
        weights = {**{_ENCODER + k: t for k, t in weights.items()}, **read_safetensors(Path(path) / OBJECTIVE_FILE)}
    earlier = f"; delete {path} to resume from the checkpoint before it"
    try:
        state = load_torch_file(Path(path) / STATE_FILE)
    except CheckpointError as error:
        raise CheckpointError(f"{error}{earlier}") from error
    missing = [key for key in _STATE_KEYS if key not in state] if isinstance(state, dict) else _STATE_KEYS
    if missing:
        raise CheckpointError(f"{Path(path) / STATE_FILE}: not a vitkit training state (missing {missing})"
                              + earlier)
    load_full_state(model, optimizer, weights, state.pop("optimizer"))
    return state


_STATE_KEYS = ["step", "optimizer", "best", "rng_cpu"]


def config_differences(saved: dict[str, Any], built: dict[str, Any], within: str = "") -> list[str]:
    """Each field (``provenance.classes`` for a nested one) where two config dicts differ, as
    ``depth: 3 in the checkpoint, 4 in the recipe``."""
    found = []
    for key in sorted(set(saved) | set(built)):
        old, new = saved.get(key), built.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            found += config_differences(old, new, f"{within}{key}.")
        elif old != new:
            found.append(f"{within}{key}: {abridged(old, 40)} in the checkpoint, {abridged(new, 40)} in the recipe")
    return found
