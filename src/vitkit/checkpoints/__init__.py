"""Reading and writing checkpoints."""

from .loading import CheckpointError, load

__all__ = ["CheckpointError", "load"]
