"""The model: its configuration, layers, position embeddings (tables and rotary), the ViT and its named variants;
the bottom package above the leaf utilities, which imports nothing else of vitkit's."""

from .config import Provenance, ViTConfig
from .registry import create_model, list_models, model_config
from .vit import Intermediates, VisionTransformer

__all__ = ["Provenance", "ViTConfig", "VisionTransformer", "Intermediates", "create_model", "list_models", "model_config"]
