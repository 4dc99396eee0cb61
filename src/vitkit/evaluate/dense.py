"""One evaluation pass of a dense model (a segmentation or depth head) over a split, and its report: the model's
outputs brought to each target's own size (``models.dense.resized``), then mIoU and aAcc (``segmentation``) or
the depth metrics of Eigen et al. (``depth``) over the whole split."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..models.dense import resized
from ..progress import track
from ..runtime import autocast
from .depth import DepthMeter
from .segmentation import SegmentationMeter, json_ready

HEADLINE = {"segmentation": ("mIoU", "aAcc"), "depth": ("abs_rel", "rmse", "a1")}
"""The metrics of each dense task a run logs and sums up (all are in the report)."""
BEST = {"segmentation": "mIoU", "depth": "a1"}
"""The metric, higher being better, that picks a run's best checkpoint."""


@dataclass
class DenseEvaluation:
    """The metrics of one pass: ``mIoU``, ``aAcc`` and per-class ``IoU``/``Acc`` lists (segmentation), or the
    depth metrics with ``images`` (depth); fractions, unrounded, NaN where undefined."""

    task: str
    metrics: dict[str, Any]
    images: int

    def summary(self, prefix: str) -> dict[str, float]:
        """The task's headline metrics as ``{prefix}/mIoU`` ..., as metrics.jsonl and summary.json hold them."""
        return {f"{prefix}/{name}": self.metrics[name] for name in HEADLINE[self.task]}


def eval_crop_mask(shape: torch.Size, crop: tuple[int, int, int, int] | None, device: torch.device
                   ) -> torch.Tensor | None:
    """The pixels a depth map is measured on: the (top, bottom, left, right) box of ``crop`` (NYU's Eigen crop),
    or all of them (None)."""
    if crop is None:
        return None
    top, bottom, left, right = crop
    mask = torch.zeros(shape, dtype=torch.bool, device=device)
    mask[..., top:bottom, left:right] = True
    return mask


@torch.no_grad()
def evaluate_dense(model: nn.Module, loader, task: str, num_classes: int, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32, ignore_index: int = 255, max_depth: float | None = None,
                   eval_crop: tuple[int, int, int, int] | None = None) -> DenseEvaluation:
    """Run ``model`` (switched to eval mode, on ``device``) over ``(images, targets)`` batches, the targets a list
    of masks or depth maps at their own sizes; each output is resized to its target and measured there: the
    argmax class against the mask (pixels ``ignore_index`` left out), or depth against the map (pixels with
    depth up to ``max_depth``, within ``eval_crop``)."""
    device = torch.device(device)
    model.eval()
    meter = SegmentationMeter(num_classes, ignore_index) if task == "segmentation" else DepthMeter(max_depth=max_depth)
    images = 0
    for batch, targets in track(loader, "evaluate"):
        with autocast(device, dtype):
            outputs = model(batch.to(device, non_blocking=True))
        for output, target in zip(outputs.float(), targets):
            target = target.to(device)
            output = resized(output[None], target.shape[-2:])[0]
            if task == "segmentation":
                meter.update(output.argmax(dim=0), target)
            else:
                meter.update(output[0], target, eval_crop_mask(target.shape, eval_crop, device))
            images += 1
    return DenseEvaluation(task, meter.compute(), images)


def write_dense_report(evaluation: DenseEvaluation, classes: list[str], out_dir: str | Path | None,
                       split: str) -> dict:
    """``eval-<split>.json`` in ``out_dir`` (None: nowhere): the split, its images and the metrics, per-class
    IoU and accuracy keyed by class name (``null`` where a class is in neither the masks nor the predictions);
    returns the JSON content."""
    import json

    from ..atomic import atomic_file

    metrics = json_ready(evaluation.metrics)
    report: dict[str, Any] = {"split": split, "task": evaluation.task, "images": evaluation.images}
    if evaluation.task == "segmentation":
        report.update({"mIoU": metrics["mIoU"], "aAcc": metrics["aAcc"],
                       "IoU": dict(zip(classes, metrics["IoU"])), "Acc": dict(zip(classes, metrics["Acc"]))})
    else:
        report.update({key: value for key, value in metrics.items() if key != "images"})
    if out_dir is not None:
        with atomic_file(Path(out_dir) / f"eval-{split}.json") as handle:
            json.dump(report, handle, indent=1)
    return report
