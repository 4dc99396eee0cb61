"""Reading and writing checkpoints: vitkit's own, Google's .npz, timm, HF transformers, torchvision."""

from ..errors import CheckpointError
from .convert import convert, export
from .loading import load, read_checkpoint

__all__ = ["CheckpointError", "convert", "export", "load", "read_checkpoint"]
