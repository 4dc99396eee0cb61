"""How a checkpoint wants its images: the step from a model's config (size, channels, the provenance's
normalisation family and crop fraction) to the data layer's plain transform, taken here rather than in
``data`` so that ``data`` knows pixels and nothing of models."""

from __future__ import annotations

from collections.abc import Sequence

from ..data.transforms import Preset, evaluation_transform
from ..models.config import ViTConfig


def checkpoint_transform(config: ViTConfig, resize: str = "crop", image_size: tuple[int, int] | None = None,
                         mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Preset:
    """The test-time transform of eval, predict, analyze, fewshot and training's evaluation: the
    checkpoint's size, channels, statistics and ``crop_pct`` unless given here."""
    trained_mean, trained_std = config.input_statistics
    return evaluation_transform(image_size or config.image_size, config.in_chans, mean or trained_mean,
                                std or trained_std, config.provenance.crop_pct, resize)
