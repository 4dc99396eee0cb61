"""How a checkpoint wants its images: the step from a model's config (size, channels, the provenance's
normalisation family and crop fraction) to the data layer's plain transform, taken here rather than in
``data`` so that ``data`` knows pixels and nothing of models."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torchvision.transforms.v2.functional as TF
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from ..data.loading import Item, Transformed, readable, worker_options
from ..data.transforms import Preset, ToChannels, ToModelInput, evaluation_transform
from ..errors import ConfigError
from ..models.config import ViTConfig
from ..models.naflex import PatchBatch, patch_batch, size_for_patch_budget


def checkpoint_transform(config: ViTConfig, resize: str = "crop", image_size: tuple[int, int] | None = None,
                         mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Preset:
    """The test-time transform of eval, predict, analyze, fewshot and training's evaluation: the
    checkpoint's size, channels, statistics and ``crop_pct`` unless given here."""
    trained_mean, trained_std = config.input_statistics
    return evaluation_transform(image_size or config.image_size, config.in_chans, mean or trained_mean,
                                std or trained_std, config.provenance.crop_pct, resize)


class ResizeToPatchBudget(torch.nn.Module):
    """Resize an image, aspect ratio kept, to the most ``patch_size`` patches ``max_patches`` allows (NaFlex)."""

    def __init__(self, patch_size: int, max_patches: int):
        super().__init__()
        self.patch_size, self.max_patches = patch_size, max_patches

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        size = size_for_patch_budget(image.shape[-2], image.shape[-1], self.patch_size, self.max_patches)
        return TF.resize(image, list(size), antialias=True)


def naflex_transform(config: ViTConfig, max_patches: int, mean: Sequence[float] | None = None,
                     std: Sequence[float] | None = None) -> Preset:
    """The checkpoint's test-time transform for NaFlex: each image at its own aspect ratio, resized to the most
    patches within ``max_patches`` (so the images of one batch differ in size), normalised as it was trained."""
    trained_mean, trained_std = config.input_statistics
    return Preset(v2.Compose([ToChannels(config.in_chans), ResizeToPatchBudget(config.patch_size, max_patches)]),
                  ToModelInput(mean or trained_mean, std or trained_std))


def naflex_loader(dataset, config: ViTConfig, max_patches: int, batch_size: int, num_workers: int = 0,
                  corrupt: str = "fail", device: torch.device | None = None) -> DataLoader:
    """Every image of ``dataset`` once, each at its own aspect ratio within ``max_patches`` patches, in
    :class:`PatchBatch` es with their labels (``corrupt='skip'`` leaves unreadable images out)."""
    if not hasattr(dataset, "__getitem__"):
        raise ConfigError(f"--max-patches reads datasets with indexed images (folders, npz, hf:); "
                          f"{type(dataset).__name__} streams its shards")
    preset = naflex_transform(config, max_patches)
    collate = partial(_naflex_collate, preset, config.patch_size, max_patches)
    return DataLoader(Transformed(dataset, preset, corrupt=corrupt), batch_size=batch_size, shuffle=False,
                      collate_fn=collate, generator=torch.Generator(), **worker_options(num_workers, device))


def _naflex_collate(preset: Preset, patch_size: int, max_patches: int, items: list[Item]
                    ) -> tuple[PatchBatch, torch.Tensor]:
    """uint8 images of different sizes normalised one by one, then cut into patches and padded together."""
    images, labels, _ = zip(*readable(items))
    normalised = [preset.per_batch(image[None])[0] for image in images]
    return patch_batch(normalised, patch_size, max_patches), torch.tensor(labels)
