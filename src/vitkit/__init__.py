"""vitkit: Vision Transformers as in *An Image is Worth 16x16 Words* (Dosovitskiy et al., ICLR 2021)."""

from .checkpoints import load
from .errors import CheckpointError, ConfigError, DatasetError, DeviceError, InputError, TrainingDiverged, VitkitError
from .models import ViTConfig, VisionTransformer, create_model, list_models

__version__ = "0.1.0"
__all__ = ["ViTConfig", "VisionTransformer", "create_model", "list_models", "load", "VitkitError", "CheckpointError",
           "ConfigError", "DatasetError", "DeviceError", "InputError", "TrainingDiverged"]
