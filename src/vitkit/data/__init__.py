"""Datasets read by their sources (``sources``), transform presets and the loaders of a run, whose batches are
fixed by (seed, step); it knows images, labels and sizes, nothing of models, so it imports only leaf utilities."""

from .datasets import STREAMED, DatasetError, dataset_info, default_split, load_dataset, load_splits, split_names
from .images import read_image
from .loading import CORRUPT, StepSampler, Transformed, eval_loader, step_loader
from .map_style import SplitSpec
from .pipelines import default_num_workers, evaluation_loader, training_loader
from .shards import ShardedSplit
from .sources.imagefolder import scan_folder
from .splits import ALL, SPLITS
from .transforms import AUGREG_LEVELS, RESIZE_MODES, augreg_level, build_transform, evaluation_transform

__all__ = ["ALL", "AUGREG_LEVELS", "CORRUPT", "RESIZE_MODES", "SPLITS", "STREAMED", "DatasetError", "ShardedSplit",
           "SplitSpec", "StepSampler", "Transformed", "augreg_level", "build_transform", "dataset_info",
           "default_num_workers", "default_split", "eval_loader", "evaluation_loader", "evaluation_transform",
           "load_dataset", "load_splits", "read_image", "scan_folder", "split_names", "step_loader", "training_loader"]
