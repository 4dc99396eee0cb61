"""vitkit: Vision Transformers as in *An Image is Worth 16x16 Words* (Dosovitskiy et al., ICLR 2021).

The public API in one place: ``load``, ``create_model``, ``VisionTransformer``, ``ViTConfig``, the errors, and
what the commands do (``evaluate_dataset``, ``predict``, ``bench_checkpoint`` ...), imported on first use."""

import importlib

from .checkpoints import load
from .errors import CheckpointError, ConfigError, DatasetError, DeviceError, InputError, TrainingDiverged, VitkitError
from .models import ViTConfig, VisionTransformer, create_model, list_models

__version__ = "0.1.0"

# What the commands do, exported here and imported on first use, so that ``import vitkit`` stays as light as
# loading a checkpoint (evaluation brings in the data pipeline and torchvision).
LAZY = {"predict": "vitkit.evaluate", "predict_files": "vitkit.evaluate", "evaluate_dataset": "vitkit.evaluate",
        "probe_dataset": "vitkit.evaluate", "analyze_checkpoint": "vitkit.evaluate",
        "bench_checkpoint": "vitkit.benchmark", "load_clip": "vitkit.text"}
__all__ = ["ViTConfig", "VisionTransformer", "create_model", "list_models", "load", "VitkitError", "CheckpointError",
           "ConfigError", "DatasetError", "DeviceError", "InputError", "TrainingDiverged", *LAZY]


def __getattr__(name: str):
    """The functions of ``LAZY``, from their module (PEP 562)."""
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'vitkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the lazy ones."""
    return sorted([*globals(), *LAZY])
