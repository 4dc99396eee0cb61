"""Datasets, transform presets and the step-indexed batch order of training."""

from .datasets import DatasetError, SplitSpec, load_dataset, read_image, scan_folder
from .loading import StepSampler, Transformed, eval_loader, step_loader
from .transforms import (AUGREG_LEVELS, augreg_level, build_transform, checkpoint_transform, trained_normalization,
                         trained_statistics)

__all__ = ["AUGREG_LEVELS", "DatasetError", "SplitSpec", "StepSampler", "Transformed", "augreg_level",
           "build_transform", "checkpoint_transform", "eval_loader", "load_dataset", "read_image", "scan_folder",
           "step_loader", "trained_normalization", "trained_statistics"]
