"""The model: configuration, layers, position embeddings, the ViT and its named variants."""

from .config import Provenance, ViTConfig
from .registry import create_model, list_models, model_config
from .vit import Intermediates, VisionTransformer

__all__ = ["Provenance", "ViTConfig", "VisionTransformer", "Intermediates", "create_model", "list_models", "model_config"]
