"""Transform presets (torchvision.transforms.v2) for the paper's pre-training, fine-tuning and evaluation.

Images arrive as uint8 (C, H, W) tensors; every preset ends with float images in the checkpoint
family's normalisation and with the model's number of channels (grey images are repeated).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torchvision.transforms import v2

from ..errors import DatasetError
from ..models.config import ViTConfig
from ..normalization import normalization

# AugReg (Steiner et al. 2021) augmentation levels: RandAugment (ops, magnitude) and Mixup alpha.
AUGREG_LEVELS = {
    "none": (None, 0.0),
    "light1": ((2, 0), 0.0),
    "light2": ((2, 10), 0.2),
    "medium1": ((2, 15), 0.2),
    "medium2": ((2, 15), 0.5),
    "strong1": ((2, 20), 0.5),
    "strong2": ((2, 20), 0.8),
}
TRANSFORM_PRESETS = ("pretrain", "finetune", "eval")


def augreg_level(level: str) -> tuple[tuple[int, int] | None, float]:
    if level not in AUGREG_LEVELS:
        raise ValueError(f"unknown augmentation level {level!r}; expected one of {list(AUGREG_LEVELS)}")
    return AUGREG_LEVELS[level]


class ToChannels(torch.nn.Module):
    """Repeat a grey image to ``channels`` channels (or check that the channels already match)."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        have = image.shape[-3]
        if have == self.channels:
            return image
        if have == 1:
            return image.expand(*image.shape[:-3], self.channels, *image.shape[-2:])
        raise DatasetError(f"cannot turn a {have}-channel image into {self.channels} channels (the model's "
                           f"in_chans): give the model {have} input channels, or images with {self.channels}")


@dataclass
class Preset:
    """A transform split where it is cheapest: the random and size-changing steps per image (uint8),
    conversion to float and normalisation once per batch."""

    per_image: Callable[[torch.Tensor], torch.Tensor]
    per_batch: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.per_batch(self.per_image(image)[None])[0]


def build_transform(preset: str, image_size: tuple[int, int], channels: int, family: str = "google",
                    hflip: bool = True, crop_scale: tuple[float, float] = (0.08, 1.0),
                    aug_level: str = "none") -> Preset:
    """``pretrain``: Inception crop (random area in ``crop_scale``, aspect 3/4..4/3) + flip;
    ``finetune``: resize to the target resolution, random crop with 1/8 padding + flip;
    ``eval``: resize only. RandAugment at the AugReg ``aug_level`` for the two training presets."""
    if preset not in TRANSFORM_PRESETS:
        raise ValueError(f"unknown transform preset {preset!r}; expected one of {TRANSFORM_PRESETS}")
    size = list(image_size)
    steps: list = [ToChannels(channels)]
    if preset == "pretrain":
        steps.append(v2.RandomResizedCrop(size, scale=tuple(crop_scale), antialias=True))
    else:
        steps.append(v2.Resize(size, antialias=True))
        if preset == "finetune":
            steps.append(v2.RandomCrop(size, padding=max(1, min(size) // 8)))
    if preset != "eval":
        if hflip:
            steps.append(v2.RandomHorizontalFlip())
        randaug, _ = augreg_level(aug_level)
        if randaug:
            steps.append(v2.RandAugment(num_ops=randaug[0], magnitude=randaug[1]))
    mean, std = normalization(family, channels)
    return Preset(v2.Compose(steps), v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]))


def trained_normalization(config: ViTConfig) -> str:
    """The normalisation family a checkpoint was trained with (set by training and by the readers);
    Google's [-1, 1] when the file does not say."""
    return config.provenance.normalization


def trained_statistics(config: ViTConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The (mean, std) a checkpoint's inputs are normalised with, one per channel."""
    return normalization(trained_normalization(config), config.in_chans)


def checkpoint_transform(config: ViTConfig) -> Preset:
    """How a checkpoint wants its test images: its size, channels and normalisation."""
    return build_transform("eval", config.image_size, config.in_chans, trained_normalization(config))
