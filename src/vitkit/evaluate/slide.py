"""Sliding-window inference of a dense model (mmseg's and DINOv2's "slide" test mode): windows of the model's size
walk over an image larger than it (resized at its own aspect ratio: ``data.transforms.KeepRatioResize``), and
each pixel's output is the average of the outputs of the windows that cover it.

The windows along a side of ``length`` pixels, for a window of ``crop`` and a step of ``stride``: ``max(length -
crop + stride - 1, 0) // stride + 1`` of them, the i-th from ``min(i * stride + crop, length) - crop`` (at least
0) to ``min(i * stride + crop, length)``, so the last one ends at the image's edge. A side shorter than the window
is padded at its end (bottom, right) with zeros of the normalised image, and the outputs over the padding dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..models.dense import resized
from ..runtime import autocast

DEFAULT_STRIDE = 2 / 3  # of the window, as DINOv2's ADE20K configs step (341 px for 512)


@dataclass(frozen=True)
class Slide:
    """The window (height, width) a sliding-window evaluation runs the model on, and its step down and across."""

    crop: tuple[int, int]
    stride: tuple[int, int]

    def record(self) -> dict[str, list[int]]:
        """The views' entry of the report: ``{"crop": [h, w], "stride": [sh, sw]}``."""
        return {"crop": list(self.crop), "stride": list(self.stride)}


def slide_for(image_size: tuple[int, int], stride: int | tuple[int, int] | None = None,
              flag: str = "--slide") -> Slide:
    """The sliding window of a model of ``image_size``: windows of that size, stepping by ``stride`` pixels (one
    number for both directions) or by default 2/3 of the window, rounded; a stride outside 1..window is refused,
    naming ``flag``."""
    crop = (int(image_size[0]), int(image_size[1]))
    if stride is None:
        steps = (round(crop[0] * DEFAULT_STRIDE), round(crop[1] * DEFAULT_STRIDE))
    else:
        steps = (stride, stride) if isinstance(stride, int) else (int(stride[0]), int(stride[1]))
    for step, side in zip(steps, crop):
        if not 1 <= step <= side:
            raise ConfigError(f"{flag} {step}: expected a stride of 1 to {side} pixels (the window is the model's "
                              f"{crop[0]}x{crop[1]}; default 2/3 of it)")
    return Slide(crop, steps)


def window_spans(length: int, crop: int, stride: int) -> list[tuple[int, int]]:
    """The (start, end) of each window along a side of ``length`` pixels: every ``stride`` pixels, the last moved
    back to end at the edge; one window, of the whole side, where the side is shorter than ``crop``."""
    count = max(length - crop + stride - 1, 0) // stride + 1
    spans = []
    for index in range(count):
        end = min(index * stride + crop, length)
        spans.append((max(end - crop, 0), end))
    return spans


def slide_windows(height: int, width: int, slide: Slide) -> list[tuple[int, int, int, int]]:
    """The (top, bottom, left, right) of every window over a ``height`` x ``width`` image, row by row."""
    rows = window_spans(height, slide.crop[0], slide.stride[0])
    columns = window_spans(width, slide.crop[1], slide.stride[1])
    return [(top, bottom, left, right) for top, bottom in rows for left, right in columns]


def padded_window(image: torch.Tensor, box: tuple[int, int, int, int], crop: tuple[int, int]) -> torch.Tensor:
    """The (C, crop) pixels of ``image`` (C, H, W) in ``box``, padded with zeros at the bottom and right where the
    box is smaller than the window (an image smaller than the model)."""
    top, bottom, left, right = box
    window = image[:, top:bottom, left:right]
    return F.pad(window, (0, crop[1] - (right - left), 0, crop[0] - (bottom - top)))


def slide_output(model: nn.Module, image: torch.Tensor, slide: Slide, device: torch.device, dtype: torch.dtype,
                 windows_per_pass: int = 32) -> torch.Tensor:
    """The (K, H, W) output of ``model`` over ``image`` (C, H, W, normalised): each window's output (up to
    ``windows_per_pass`` windows a forward pass) brought to the window's size (bilinear), its padding dropped,
    summed into the image's canvas and divided by the number of windows over each pixel. Segmentation sums
    logits, as mmseg does; depth sums depth."""
    height, width = image.shape[-2:]
    boxes = slide_windows(height, width, slide)
    canvas: torch.Tensor | None = None
    counts = torch.zeros((height, width), device=image.device)
    for first in range(0, len(boxes), windows_per_pass):
        group = boxes[first:first + windows_per_pass]
        windows = torch.stack([padded_window(image, box, slide.crop) for box in group])
        with autocast(device, dtype):
            outputs = model(windows).float()
        outputs = resized(outputs, slide.crop)
        if canvas is None:
            canvas = outputs.new_zeros((outputs.shape[1], height, width))
        for output, (top, bottom, left, right) in zip(outputs, group):
            canvas[:, top:bottom, left:right] += output[:, :bottom - top, :right - left]
            counts[top:bottom, left:right] += 1
    return canvas / counts
