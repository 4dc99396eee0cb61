"""``vitkit.load``: find out what a path holds, read it, and build the model it describes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..models.config import ViTConfig
from ..models.vit import CONFIG_FILE, WEIGHTS_FILE, VisionTransformer

# Overrides that change the shape of weights are applied after loading, by model surgery.
_SURGERY = ("image_size", "num_classes")


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit the model it describes."""


def load(path: str | Path, **overrides: Any) -> VisionTransformer:
    """Load a checkpoint as a ready ``VisionTransformer`` (in eval mode).

    ``overrides`` change config fields: numerics and regularisation (``ln_eps``, ``dropout``, ...) are
    set before the weights are loaded; ``image_size`` resamples the position table and ``num_classes``
    puts a new zero-initialised head on, after loading.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    if path.is_dir() and (path / CONFIG_FILE).exists() and (path / WEIGHTS_FILE).exists():
        config, state = read_native(path)
        return build(config, state, overrides, source=str(path))
    raise CheckpointError(f"{path} is not a checkpoint vitkit can read: expected a directory with "
                          f"{CONFIG_FILE} and {WEIGHTS_FILE}")


def read_native(directory: Path) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    try:
        config = ViTConfig.from_dict(json.loads(config_path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as error:
        raise CheckpointError(f"{config_path}: not a valid vitkit config ({error})") from error
    return config, read_safetensors(weights_path)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({error})") from error


def build(config: ViTConfig, state: dict[str, torch.Tensor], overrides: dict[str, Any],
          source: str) -> VisionTransformer:
    """Build the model of ``config`` (plus overrides), load ``state`` strictly, then apply surgery."""
    surgery = {key: overrides[key] for key in _SURGERY if key in overrides}
    rest = {key: value for key, value in overrides.items() if key not in _SURGERY}
    try:
        config = config.replace(**rest)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{source}: bad override ({error})") from error
    with torch.device("meta"):
        model = VisionTransformer(config)
    load_state_strict(model, state, source)
    if "image_size" in surgery:
        model.resize_image(surgery["image_size"])
    if "num_classes" in surgery and surgery["num_classes"] != config.num_classes:
        model.reset_head(surgery["num_classes"], keep_pre_logits=True)
    return model.eval()


def load_state_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load every weight of ``model`` (built on the meta device) from ``state`` onto the CPU, or fail
    with one error that lists every missing key, unexpected key and shape conflict."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    conflicts = [f"{key}: checkpoint {tuple(state[key].shape)} vs model {tuple(expected[key].shape)}"
                 for key in sorted(set(expected) & set(state)) if state[key].shape != expected[key].shape]
    if missing or unexpected or conflicts:
        lines = [f"{source} does not fit the model it describes:"]
        for title, items in (("missing keys", missing), ("unexpected keys", unexpected),
                             ("shape conflicts", conflicts)):
            if items:
                lines.append(f"  {title} ({len(items)}): " + ", ".join(items[:20])
                             + (" ..." if len(items) > 20 else ""))
        raise CheckpointError("\n".join(lines))
    # Fresh allocations rather than the file's buffers: aligned memory keeps the kernels (and so the
    # logits, bit for bit) the same as those of a model built in the usual way.
    model.to_empty(device="cpu")
    model.load_state_dict(state, strict=True)
