"""Input statistics per checkpoint family: a leaf module, so that the model's provenance, the data
transforms and the checkpoint readers all name families without importing one another.

Google scales inputs to [-1, 1] (so do SigLIP's); torchvision's weights (and DeiT's, DINOv2's) use
ImageNet's statistics; OpenAI's CLIP has its own; TIPSv2 takes the [0, 1] pixels as they are ("unit": mean 0,
std 1).
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

NORMALIZATION = {
    "google": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "unit": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # [0, 1] pixels, unnormalised (TIPSv2, Gemma 4, which scales them itself)
}


def normalization(family: str, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A family's (mean, std) for ``channels`` channels: grey takes the mean over RGB, and statistics
    that are the same for every channel (Google's) fit any number of channels."""
    if family not in NORMALIZATION:
        raise ConfigError(f"unknown normalisation {family!r}; expected one of {list(NORMALIZATION)}")
    mean, std = NORMALIZATION[family]
    if channels == len(mean):
        return mean, std
    if channels == 1:
        return (sum(mean) / 3,), (sum(std) / 3,)
    if len(set(mean)) == len(set(std)) == 1:
        return (mean[0],) * channels, (std[0],) * channels
    raise ConfigError(f"the {family!r} normalisation has statistics for 1 or 3 channels, not {channels}")


def normalization_family(mean: Any, std: Any) -> str | None:
    """The family whose statistics these are (1 grey or 3 colour channels, to 3 decimals), or None."""
    given = [*mean, *std]
    for family in NORMALIZATION:
        try:
            expected = [value for stats in normalization(family, len(mean)) for value in stats]
        except ConfigError:  # a family without statistics for this many channels is not it
            continue
        if len(given) == len(expected) and all(abs(a - b) < 1e-3 for a, b in zip(given, expected)):
            return family
    return None

