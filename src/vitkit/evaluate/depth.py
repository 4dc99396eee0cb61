"""Monocular depth metrics of Eigen et al. (2014) as BTS, DINOv2's depth evaluation and the Monocular Depth
Estimation Toolbox compute them: each image scored over its valid pixels, then the scores averaged over the
images."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import ConfigError, InputError
from .segmentation import Maps, check_same_shape, paired, to_tensor

METRICS = ("a1", "a2", "a3", "abs_rel", "sq_rel", "rmse", "rmse_log", "log10", "silog")


class DepthMeter:
    """The depth metrics of a set of images, added a batch at a time. A pixel counts where its true depth lies in
    ``(min_depth, max_depth)`` (no upper bound when ``max_depth`` is None) and, where a ``valid`` mask is given
    (the Eigen or Garg crop, say), the mask is true. Predictions are clamped to ``[min_depth, max_depth]`` first and
    a NaN prediction set to ``min_depth``, as those code bases do. With gt the true depth, pred the prediction and
    d = log pred - log gt over an image's valid pixels:

    - ``a1``, ``a2``, ``a3``: the fraction of pixels whose max(gt / pred, pred / gt) is below 1.25, 1.25², 1.25³;
    - ``abs_rel``: mean |gt - pred| / gt; ``sq_rel``: mean (gt - pred)² / gt;
    - ``rmse``: sqrt(mean (gt - pred)²); ``rmse_log``: sqrt(mean d²); ``log10``: mean |log10 gt - log10 pred|;
    - ``silog``: sqrt(mean d² - (mean d)²) * 100 (0 where rounding makes the variance negative).

    Each metric is computed per image and averaged over the images; an image without a valid pixel is left out of
    the average and counted in ``images_without_depth``."""

    def __init__(self, min_depth: float = 1e-3, max_depth: float | None = None):
        if max_depth is not None and max_depth <= min_depth:
            raise ConfigError(f"max_depth must exceed min_depth ({min_depth}), got {max_depth}")
        self.min_depth = min_depth
        self.max_depth = max_depth
        self.sums = torch.zeros(len(METRICS), dtype=torch.float64)
        self.images = 0
        self.images_without_depth = 0

    def update(self, pred: Maps, target: Maps, valid: Maps | None = None) -> None:
        """Add a batch of predicted depth maps and their true depths, (B, H, W) or one image (H, W), tensors on any
        device or NumPy arrays, with an optional boolean mask of the pixels to score, of the same shape."""
        pred = to_tensor(pred)
        target = to_tensor(target, pred.device)
        check_same_shape(pred, target)
        if pred.dim() not in (2, 3):
            raise InputError(f"expected depth maps of shape (batch, height, width) or (height, width), got "
                             f"{tuple(pred.shape)}")
        mask = target > self.min_depth
        if self.max_depth is not None:
            mask &= target < self.max_depth
        if valid is not None:
            valid = to_tensor(valid, pred.device)
            check_same_shape(pred, valid, ("pred", "valid"))
            mask &= valid.bool()
        if pred.dim() == 2:
            pred, target, mask = pred[None], target[None], mask[None]
        pred = pred.double()
        pred = torch.where(pred.isnan(), self.min_depth, pred).clamp(self.min_depth, self.max_depth)
        gt = torch.where(mask, target.double(), 1.0)  # masked-out pixels score 1 against 1, then weigh 0
        pred = torch.where(mask, pred, 1.0)
        weight = mask.double()
        pixels = weight.sum(dim=(1, 2))

        def mean(values: torch.Tensor) -> torch.Tensor:
            return (values * weight).sum(dim=(1, 2)) / pixels

        ratio = torch.maximum(gt / pred, pred / gt)
        log_error = pred.log() - gt.log()
        squared_log = mean(log_error ** 2)
        scores = torch.stack([
            mean((ratio < 1.25).double()),
            mean((ratio < 1.25 ** 2).double()),
            mean((ratio < 1.25 ** 3).double()),
            mean((gt - pred).abs() / gt),
            mean((gt - pred) ** 2 / gt),
            mean((gt - pred) ** 2).sqrt(),
            squared_log.sqrt(),
            mean((gt.log10() - pred.log10()).abs()),
            (squared_log - mean(log_error) ** 2).clamp(min=0).sqrt() * 100,
        ])
        scored = pixels > 0
        self.sums += scores[:, scored].sum(dim=1).cpu()
        self.images += int(scored.sum())
        self.images_without_depth += int((~scored).sum())

    def compute(self) -> dict[str, float | int]:
        """The mean of each metric over the images with depth (NaN when there are none), with ``images`` their
        number and ``images_without_depth`` the number left out."""
        means = (self.sums / self.images).tolist() if self.images else [math.nan] * len(METRICS)
        return {**dict(zip(METRICS, means)), "images": self.images,
                "images_without_depth": self.images_without_depth}


def depth_metrics(pred: Maps | Sequence[Maps], target: Maps | Sequence[Maps], min_depth: float = 1e-3,
                  max_depth: float | None = None, valid: Maps | Sequence[Maps] | None = None) -> dict[str, float | int]:
    """The depth metrics (see ``DepthMeter``) of one evaluation set: predicted and true depths as arrays or
    tensors of shape (B, H, W) or (H, W), or as two lists of such maps (each pair of one shape, sizes free), with
    ``valid`` a mask, or a list of masks, matching them."""
    meter = DepthMeter(min_depth, max_depth)
    pairs = paired(pred, target)
    masks = [None] * len(pairs) if valid is None else [mask for _, mask in paired(pred, valid, ("pred", "valid"))]
    for (one_pred, one_target), mask in zip(pairs, masks):
        meter.update(one_pred, one_target, mask)
    return meter.compute()
