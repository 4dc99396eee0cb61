"""Calibration images for static int8 exports: a seeded sample of a dataset's split, read through the checkpoint's
own evaluation preprocessing (size, channels, normalisation, crop), as the exported graph will see its inputs.
Here, not in ``checkpoints``, because reading a dataset is ``data``'s work, which ``checkpoints`` may not import."""

from __future__ import annotations

import numpy as np
import torch

from ..data import evaluation_loader, load_dataset
from ..errors import ConfigError
from ..models.config import ViTConfig
from .preprocessing import checkpoint_transform

CALIBRATION_IMAGES = 256  # the default sample: enough for stable min-max and NNCF's statistics on ViTs
CALIBRATION_SPLIT = "train"
_BATCH = 16


def calibration_batches(config: ViTConfig, dataset: str, images: int = CALIBRATION_IMAGES, seed: int = 0,
                        data_dir: str | None = None, split: str = CALIBRATION_SPLIT) -> list[np.ndarray]:
    """``images`` images of ``dataset``'s ``split`` drawn at random (``seed``), preprocessed for ``config``, as
    float32 batches. A dataset whose classes are not the model's, or which holds fewer images than asked for,
    is refused: calibrating on other data than the model sees costs int8 accuracy silently."""
    data = load_dataset(dataset, split, data_dir)
    where = f"--calibration {dataset} ({split} split)"
    if config.num_classes and len(data.classes) != config.num_classes:
        raise ConfigError(f"{where}: {len(data.classes)} classes, but the model predicts {config.num_classes}; "
                          f"calibrate on the data the model was trained for")
    if len(data) < images:
        raise ConfigError(f"{where}: {len(data)} images, fewer than the {images} asked for; pass --calibration-size "
                          f"{len(data)} or less, or a larger dataset")
    if hasattr(data, "subset"):  # a map-style split: a seeded sample; a sharded one is read in its order
        chosen = np.sort(torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:images].numpy())
        data = data.subset(chosen, f"{getattr(data, 'name', dataset)} calibration")
    batches, count = [], 0
    for batch, *_ in evaluation_loader(data, checkpoint_transform(config), _BATCH):
        batches.append(batch[:images - count].float().numpy().copy())
        count += len(batches[-1])
        if count >= images:
            break
    return batches
