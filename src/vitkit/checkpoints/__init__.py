"""Checkpoints read into vitkit's model and written out of it, one module a format (vitkit's own, Google's .npz,
timm, HF transformers, torchvision, open_clip, ONNX, OpenVINO): above ``models``, below everything that runs one."""

from ..errors import CheckpointError
from .convert import convert, export
from .loading import load, read_checkpoint

__all__ = ["CheckpointError", "convert", "export", "load", "read_checkpoint"]
