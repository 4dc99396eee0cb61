"""Transform presets (torchvision.transforms.v2) for the paper's pre-training, fine-tuning and evaluation.

Images arrive as uint8 (C, H, W) tensors; every preset ends with float images in the checkpoint
family's normalisation and with the model's number of channels (see ``ToChannels``). The module takes
plain sizes and statistics, not a model's config, so that ``data`` depends on nothing above it; the step
from a checkpoint to these arguments is ``vitkit.evaluate.preprocessing``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torchvision.transforms.v2.functional as TF
from torchvision import tv_tensors
from torchvision.transforms import v2

from ..errors import ConfigError, DatasetError
from ..normalization import normalization
from .dense import IGNORE_INDEX

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
"""AugReg's augmentation levels (Steiner et al. 2021): name -> (RandAugment (ops, magnitude) or None, Mixup alpha)."""
TRANSFORM_PRESETS = ("pretrain", "finetune", "eval")
RESIZE_MODES = ("crop", "stretch")  # evaluation geometry: keep the aspect ratio and centre-crop, or stretch
"""How evaluation fits an image to the model's size: ``crop`` (scale, aspect kept, centre-crop) or ``stretch``."""


def augreg_level(level: str) -> tuple[tuple[int, int] | None, float]:
    """The (RandAugment (ops, magnitude) or None, Mixup alpha) of an AugReg level name such as ``medium1``."""
    if level not in AUGREG_LEVELS:
        raise ValueError(f"unknown augmentation level {level!r}; expected one of {list(AUGREG_LEVELS)}")
    return AUGREG_LEVELS[level]


class ToChannels(torch.nn.Module):
    """Give an image the model's number of channels: grey is repeated; colour becomes grey for a 1-channel
    model by ITU-R 601-2 luminance (the weights of PIL's ``convert("L")``, how grey images are usually made
    from colour ones), not by a plain mean, which would weigh blue as much as green."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        have = image.shape[-3]
        if have == self.channels:
            return image
        if have == 1:
            return image.expand(*image.shape[:-3], self.channels, *image.shape[-2:])
        if have == 3 and self.channels == 1:
            return TF.rgb_to_grayscale(image.float()).round_().to(image.dtype)  # rounded, as PIL does
        raise DatasetError(f"cannot turn a {have}-channel image into {self.channels} channels (the model's "
                           f"in_chans): give the model {have} input channels, or images with {self.channels}")


# Resizing by more than this factor (either way) is said, not done silently: an 8 px model fed 32 px photos,
# or 32 px images blown up to 384, is most often a default nobody chose.
NOTED_SCALE = 2.0


def input_conversion(channels: int, size: Sequence[int], to_channels: int, to_size: Sequence[int]) -> str:
    """What happens to images of ``channels`` x ``size`` on their way to a model of ``to_channels`` x
    ``to_size``, in words (empty when nothing worth saying: same channels, resized by at most 2x): the
    channel mapping of ``ToChannels`` and a resize beyond ``NOTED_SCALE``."""
    changes = []
    if channels != to_channels:
        how = "turned grey (luminance)" if to_channels == 1 else "repeated" if channels == 1 else "converted"
        changes.append(f"{channels}-channel images {how} for a {to_channels}-channel model")
    scale = max(to / have for to, have in zip(to_size, size))
    if scale > NOTED_SCALE or scale < 1 / NOTED_SCALE:
        verb = "upscaled" if scale > 1 else "downscaled"
        factor = scale if scale > 1 else 1 / scale
        changes.append(f"{size[0]}x{size[1]} images {verb} {factor:.3g}x to {to_size[0]}x{to_size[1]}")
    return "; ".join(changes)


class ResizeToCover(torch.nn.Module):
    """Scale an image, aspect ratio kept, to the smallest size that covers ``size`` (height, width): for a
    square size the shorter side becomes ``size`` (torchvision's ``Resize(int)``), otherwise the side whose
    ratio to its target is smaller does (timm's ``ResizeKeepRatio``)."""

    def __init__(self, size: Sequence[int]):
        super().__init__()
        self.size = tuple(size)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        target_height, target_width = self.size
        if target_height == target_width:
            return TF.resize(image, [target_height], antialias=True)
        height, width = image.shape[-2:]
        ratio = min(height / target_height, width / target_width)
        return TF.resize(image, [round(height / ratio), round(width / ratio)], antialias=True)


@dataclass
class Preset:
    """A transform split where it is cheapest: the random and size-changing steps per image (uint8), then
    conversion to float and normalisation, which can wait for the batch's arrival on an accelerator. A ``joint``
    preset's ``per_image`` takes and returns ``(image, target)`` pairs: a dense target (a mask, a depth map) is
    cropped, scaled and flipped with its image."""

    per_image: Callable
    per_batch: ToModelInput | torch.nn.Identity  # the identity where the pixels stay uint8 (for a device)
    joint: bool = False

    def __call__(self, image: torch.Tensor, target: torch.Tensor | None = None):
        """One image as the model takes it; a joint preset takes its dense target too and returns both."""
        if not self.joint:
            return self.per_batch(self.per_image(image)[None])[0]
        if target is None:
            raise TypeError("a joint preset transforms an image with its dense target: preset(image, target)")
        image, target = self.per_image(image, target)
        return self.per_batch(image[None])[0], target


class ToModelInput(torch.nn.Module):
    """uint8 pixels (..., C, H, W) to ``(x / 255 - mean) / std`` with the checkpoint family's statistics, as
    one float copy and two in-place passes: about half the time of torchvision's ToDtype + Normalize
    (17.5 against 37 ms for 64 images at 224 px on one core, in a one-off probe whose script was not kept:
    benchmarks/results/loader_probe.md). The copy
    can go straight into ``out`` (a row of a batch), so that no float image is made only to be copied."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.mean, self.std = tuple(mean), tuple(std)
        self.shift = torch.tensor([255 * m for m in mean]).view(-1, 1, 1)
        self.scale = torch.tensor([1 / (255 * s) for s in std]).view(-1, 1, 1)

    def forward(self, pixels: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty(pixels.shape, dtype=torch.float32, device=pixels.device)
        elif out.shape != pixels.shape or out.dtype != torch.float32 or out.device != pixels.device:
            raise ValueError(f"out must be float32 {tuple(pixels.shape)} on {pixels.device}, like the pixels; "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        shift, scale = self.statistics(pixels.device)
        return out.copy_(pixels).sub_(shift).mul_(scale)

    def statistics(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The shift and scale on ``device``, copied there once (a copy per batch would wait for the device)."""
        if self.shift.device != device:
            self.shift, self.scale = self.shift.to(device), self.scale.to(device)
        return self.shift, self.scale


def evaluation_transform(image_size: tuple[int, int], channels: int, mean: Sequence[float], std: Sequence[float],
                         crop_pct: float = 1.0, resize: str = "crop") -> Preset:
    """What a model sees at test time, in every command: ``crop`` scales the image to cover
    ``image_size / crop_pct`` (each side floored, as timm does) and centre-crops ``image_size``, so nothing
    is distorted; ``stretch`` resizes straight to ``image_size``. Both are the same for a square image at
    crop_pct 1."""
    if resize not in RESIZE_MODES:
        raise ConfigError(f"unknown resize mode {resize!r}; expected one of {RESIZE_MODES}")
    if not 0 < crop_pct <= 1:
        raise ConfigError(f"crop_pct={crop_pct!r}: expected a number in (0, 1]")
    size = list(image_size)
    if resize == "stretch":
        geometry = [v2.Resize(size, antialias=True)]
    else:
        geometry = [ResizeToCover([math.floor(side / crop_pct) for side in size]), v2.CenterCrop(size)]
    return Preset(v2.Compose([ToChannels(channels), *geometry]), ToModelInput(mean, std))


class RandomErasing(torch.nn.Module):
    """Random erasing (Zhong et al. 2020, as DeiT trains): with probability ``p``, a rectangle of 2% to 1/3 of the
    image, of aspect 0.3 to 3.3, filled with noise (uniform pixels: DeiT's per-pixel mode, before normalisation).
    Draws from torch's default generator, which the loader seeds per image."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if torch.rand(()) >= self.p:
            return image
        top, left, height, width, _ = v2.RandomErasing.get_params(image, scale=(0.02, 1 / 3), ratio=(0.3, 3.3),
                                                                  value=[0])
        erased = image.clone()
        erased[..., top:top + height, left:left + width] = torch.randint(
            0, 256, (*image.shape[:-2], height, width), dtype=torch.uint8).to(image.dtype)
        return erased


class InceptionCrop(torch.nn.Module):
    """Inception's crop: a random area in ``scale`` of the image at an aspect ratio in 3/4..4/3, resized to ``size``
    (antialiased), then a horizontal flip with probability ``flip``. The same random draws and the same pixels as
    torchvision's ``v2.RandomResizedCrop`` then ``v2.RandomHorizontalFlip``, without v2's dispatch on every call
    (which costs most where the images are small)."""

    def __init__(self, size: Sequence[int], scale: tuple[float, float], flip: float = 0.5):
        super().__init__()
        self.crop, self.flip = v2.RandomResizedCrop(list(size), scale=scale, antialias=True), flip

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        box = self.crop.make_params([image])
        image = TF.resized_crop(image, box["top"], box["left"], box["height"], box["width"], list(self.crop.size),
                                antialias=True)
        if self.flip and torch.rand(1) < self.flip:  # v2's random-apply draw
            image = TF.horizontal_flip(image)
        return image


def build_transform(preset: str, image_size: tuple[int, int], channels: int, family: str = "google",
                    hflip: bool = True, crop_scale: tuple[float, float] = (0.08, 1.0),
                    aug_level: str = "none", erasing: float = 0.0) -> Preset:
    """``pretrain``: Inception crop (random area in ``crop_scale``, aspect 3/4..4/3) + flip;
    ``finetune``: resize to the target resolution, random crop with 1/8 padding + flip;
    ``eval``: the evaluation geometry of the whole image (crop_pct 1). RandAugment at the AugReg
    ``aug_level`` and random erasing with probability ``erasing`` for the two training presets."""
    if preset not in TRANSFORM_PRESETS:
        raise ValueError(f"unknown transform preset {preset!r}; expected one of {TRANSFORM_PRESETS}")
    mean, std = normalization(family, channels)
    if preset == "eval":
        return evaluation_transform(image_size, channels, mean, std)
    size = list(image_size)
    steps: list = [ToChannels(channels)]
    if preset == "pretrain":
        steps.append(InceptionCrop(size, tuple(crop_scale), flip=0.5 if hflip else 0.0))
    else:
        steps += [v2.Resize(size, antialias=True), v2.RandomCrop(size, padding=max(1, min(size) // 8))]
        if hflip:
            steps.append(v2.RandomHorizontalFlip())
    randaug, _ = augreg_level(aug_level)
    if randaug:
        steps.append(v2.RandAugment(num_ops=randaug[0], magnitude=randaug[1]))
    if erasing:
        steps.append(RandomErasing(erasing))
    return Preset(v2.Compose(steps), ToModelInput(mean, std))


DENSE_TASKS = ("segmentation", "depth")
DENSE_SCALES = (0.5, 2.0)  # the random rescale of a training image, relative to the model's size (mmseg's ratio range)


class JointSteps:
    """The image's channels made the model's, then ``steps`` (torchvision v2) on the image and its target
    together: a ``tv_tensors.Mask`` is resampled by nearest neighbour and padded with its own fill."""

    def __init__(self, channels: int, steps: list):
        self.to_channels, self.steps = ToChannels(channels), v2.Compose(steps)

    def __call__(self, image: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.steps(self.to_channels(image), target)


class ImageOnly:
    """The evaluation geometry on the image alone: its target keeps its own size, where the metrics are taken."""

    def __init__(self, transform: Callable[[torch.Tensor], torch.Tensor]):
        self.transform = transform

    def __call__(self, image: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(image), target


SLIDE_LONG_SIDE = 4  # the longest an image's longer side may become, in multiples of the model's shorter side


def kept_ratio_size(height: int, width: int, shorter: int, longest: int) -> tuple[int, int]:
    """(height, width) scaled alike so that the shorter side becomes ``shorter`` unless the longer one would then
    pass ``longest`` (it becomes ``longest``): the factor min(shorter / short side, longest / long side), each side
    rounded half up, at least 1; the rule of mmseg's ``Resize(scale=(longest, shorter), keep_ratio=True)``."""
    factor = min(shorter / min(height, width), longest / max(height, width))
    return max(1, int(height * factor + 0.5)), max(1, int(width * factor + 0.5))


class KeepRatioResize(torch.nn.Module):
    """Resize an image, its aspect ratio kept, to ``kept_ratio_size`` for the model's shorter side ``shorter`` and
    a longer side of at most ``SLIDE_LONG_SIDE`` times it (bilinear, antialiased where it shrinks): the image a
    sliding-window evaluation walks over, as DINOv2's and mmseg's segmentation tests prepare it."""

    def __init__(self, shorter: int):
        super().__init__()
        self.shorter, self.longest = shorter, SLIDE_LONG_SIDE * shorter

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        size = kept_ratio_size(*image.shape[-2:], self.shorter, self.longest)
        return TF.resize(image, list(size), antialias=True) if size != tuple(image.shape[-2:]) else image


def dense_transform(task: str, training: bool, image_size: tuple[int, int], channels: int,
                    family: str = "google", hflip: bool = True, random: bool = True,
                    keep_ratio: bool = False) -> Preset:
    """The joint preset of a dense ``task``. Training: segmentation rescales the shorter side at random to 0.5-2x
    the model's (mmseg's ratio range), depth brings it to the model's (depth in metres does not change with the
    picture's scale); then a random crop of ``image_size``, padded where the image is smaller (pixels 0, masks
    255, depth 0: no depth), and a horizontal flip; without ``random``, image and target stretched to
    ``image_size`` (the same pixels every epoch: a frozen backbone's features can be kept). Evaluation: the whole
    image stretched to ``image_size``, or with ``keep_ratio`` resized at its own aspect ratio (``KeepRatioResize``:
    the shorter side the model's, for a sliding-window evaluation), its target left at its own size (outputs are
    brought to it: ``models.dense.resized``)."""
    if task not in DENSE_TASKS:
        raise ConfigError(f"unknown dense task {task!r}; expected one of {DENSE_TASKS}")
    mean, std = normalization(family, channels)
    size = list(image_size)
    if not training:
        resize = KeepRatioResize(min(size)) if keep_ratio else v2.Resize(size, antialias=True)
        return Preset(ImageOnly(v2.Compose([ToChannels(channels), resize])), ToModelInput(mean, std), joint=True)
    if not random:
        return Preset(JointSteps(channels, [v2.Resize(size, antialias=True)]), ToModelInput(mean, std), joint=True)
    side = min(size)
    if task == "segmentation":
        steps: list = [v2.RandomResize(round(DENSE_SCALES[0] * side), round(DENSE_SCALES[1] * side) + 1,
                                       antialias=True)]
    else:
        steps = [v2.Resize(side, antialias=True)]
    fill = {tv_tensors.Mask: IGNORE_INDEX if task == "segmentation" else 0, "others": 0}  # padding: ignored, no depth
    steps.append(v2.RandomCrop(size, pad_if_needed=True, fill=fill))
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    return Preset(JointSteps(channels, steps), ToModelInput(mean, std), joint=True)
