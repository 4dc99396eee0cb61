"""Writing a model in any supported format: what ``vitkit convert`` does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..models.vit import VisionTransformer
from .common import CheckpointError
from .google import write_npz
from .hf import write_hf
from .hf_families import hf_family_of, write_hf_family
from .timm import write_timm
from .loading import load

WRITERS: dict[str, Callable[[VisionTransformer, Path], Path]] = {
    "native": lambda model, path: model.save(path),
    "npz": write_npz,
    "hf": lambda model, path: (write_hf_family if hf_family_of(model.config) else write_hf)(model, path),
    "timm": write_timm,
}


def export(model: VisionTransformer, path: str | Path, to: str) -> Path:
    """Write ``model`` to ``path`` as a vitkit directory, a Google ``.npz``, an HF directory or a timm state dict."""
    if to not in WRITERS:
        raise CheckpointError(f"unknown export format {to!r}; expected one of {sorted(WRITERS)}")
    return WRITERS[to](model, Path(path))


def convert(source: str | Path, destination: str | Path, to: str, **overrides: Any) -> VisionTransformer:
    """Read ``source`` in whatever format it is, write it to ``destination`` in format ``to``."""
    model = load(source, **overrides)
    export(model, destination, to)
    return model
