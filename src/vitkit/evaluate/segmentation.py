"""Semantic segmentation metrics as mmsegmentation reports them (``intersect_and_union`` summed over the set, then
``total_area_to_metrics``): per-class IoU and accuracy, their mean, and the accuracy over all pixels, from the
per-class areas of a whole evaluation set, not from per-image scores averaged."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, InputError

Maps = np.ndarray | torch.Tensor


def to_tensor(values: Maps, device: torch.device | None = None) -> torch.Tensor:
    """``values`` as a tensor (a tensor as it is, a NumPy array without a copy where torch can share it), moved to
    ``device`` when given. Unsigned NumPy integers wider than a byte, which torch barely computes with, become
    int64."""
    if isinstance(values, torch.Tensor):
        return values if device is None else values.to(device)
    array = np.asarray(values)
    if array.dtype.kind == "u" and array.itemsize > 1:
        array = array.astype(np.int64)
    return torch.as_tensor(array, device=device)


def paired(first: Maps | Sequence[Maps], second: Maps | Sequence[Maps],
           names: tuple[str, str] = ("pred", "target")) -> list[tuple[Maps, Maps]]:
    """The pairs of one evaluation set: ``[(first, second)]`` for two arrays, or the members of two lists of equal
    length taken side by side. One list with one array, or lists of unequal length, are refused naming
    ``names``."""
    first_list, second_list = isinstance(first, (list, tuple)), isinstance(second, (list, tuple))
    if first_list != second_list:
        raise InputError(f"expected {names[0]} and {names[1]} both arrays or both lists of arrays, got "
                         f"{type(first).__name__} and {type(second).__name__}")
    if not first_list:
        return [(first, second)]
    if len(first) != len(second):
        raise InputError(f"expected as many {names[1]} as {names[0]} maps, got {len(first)} {names[0]} and "
                         f"{len(second)} {names[1]}")
    return list(zip(first, second))


def check_same_shape(pred: torch.Tensor, target: torch.Tensor, names: tuple[str, str] = ("pred", "target")) -> None:
    """Refuse two maps of different shapes, naming both shapes."""
    if pred.shape != target.shape:
        raise InputError(f"expected {names[0]} and {names[1]} of the same shape, got {names[0]} "
                         f"{tuple(pred.shape)} and {names[1]} {tuple(target.shape)}")


class SegmentationMeter:
    """Per-class areas of a segmentation evaluation accumulated over any number of (prediction, target) maps of
    ``num_classes`` classes, as mmsegmentation's ``intersect_and_union`` sums them: the pixels whose target is
    ``ignore_index`` are left out; a predicted id outside ``[0, num_classes)`` counts in its pixel's label area only
    (mmseg's histogram over ``[0, num_classes - 1]`` drops it), so the pixel is wrong and no class's prediction.

    The counts are one (K, K + 1) matrix on the CPU (rows the target class, columns the predicted class, the last
    column a prediction outside the classes), each update adding one ``bincount`` computed where the maps are."""

    def __init__(self, num_classes: int, ignore_index: int = 255):
        if num_classes < 1:
            raise ConfigError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.counts = torch.zeros(num_classes, num_classes + 1, dtype=torch.int64)

    def update(self, pred: Maps, target: Maps) -> None:
        """Add one prediction map and its target, integer class ids of the same shape (any number of dimensions, a
        batch as well as one image), tensors on any device or NumPy arrays. A target id outside
        ``[0, num_classes)`` that is not ``ignore_index`` is refused, naming it and the range expected."""
        pred = to_tensor(pred)
        target = to_tensor(target, pred.device)
        check_same_shape(pred, target)
        for name, values in (("pred", pred), ("target", target)):
            if values.is_floating_point() or values.is_complex():
                raise InputError(f"expected {name} to hold integer class ids, got {values.dtype}")
        target = target.long()  # compared as int64: a uint8 map would read an ignore_index of -1 as 255
        kept = target != self.ignore_index
        label, predicted = target[kept], pred[kept].long()
        classes = self.num_classes
        outside = (label < 0) | (label >= classes)
        if outside.any():
            ids = torch.unique(label[outside]).tolist()
            shown = ", ".join(map(str, ids[:10])) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            raise InputError(f"target holds class id(s) {shown}: expected ids in [0, {classes}) or the "
                             f"ignore_index {self.ignore_index}")
        predicted = torch.where((predicted >= 0) & (predicted < classes), predicted, classes)
        counts = torch.bincount(label * (classes + 1) + predicted, minlength=classes * (classes + 1))
        self.counts += counts.reshape(classes, classes + 1).cpu()

    def compute(self) -> dict[str, Any]:
        """The metrics of the maps added so far, as fractions of 1: ``IoU`` per class (intersection over union,
        NaN for a class in neither the predictions nor the targets), ``Acc`` per class (its target pixels predicted
        right, NaN for a class absent from the targets), ``mIoU`` the mean of the IoUs that are not NaN (NaN when
        all are) and ``aAcc`` the fraction of all non-ignored pixels predicted right (NaN when there are none)."""
        counts = self.counts.double().numpy()
        intersect = np.diagonal(counts).copy()
        area_label = counts.sum(axis=1)
        area_pred = counts[:, :-1].sum(axis=0)
        union = area_pred + area_label - intersect
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = intersect / union
            accuracy = intersect / area_label
        total = area_label.sum()
        return {"mIoU": float(np.nanmean(iou)) if not np.isnan(iou).all() else math.nan,
                "aAcc": float(intersect.sum() / total) if total else math.nan,
                "IoU": [float(value) for value in iou],
                "Acc": [float(value) for value in accuracy]}


def miou(pred: Maps | Sequence[Maps], target: Maps | Sequence[Maps], num_classes: int,
         ignore_index: int = 255) -> dict[str, Any]:
    """mmsegmentation's mIoU, aAcc and per-class IoU and accuracy (see ``SegmentationMeter.compute``) of one
    evaluation set: a prediction map and its target (integer arrays or tensors of one shape, any dimensions), or a
    list of predictions and a list of their targets, each pair of one shape, whose areas are summed over the
    set."""
    meter = SegmentationMeter(num_classes, ignore_index)
    for one_pred, one_target in paired(pred, target):
        meter.update(one_pred, one_target)
    return meter.compute()


def json_ready(metrics: Any) -> Any:
    """A copy of ``metrics`` (numbers in dicts and lists, nested) that ``json.dumps`` writes as standard JSON: each
    NaN becomes None (``null``), the IoU of an absent class for instance."""
    if isinstance(metrics, dict):
        return {key: json_ready(value) for key, value in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return [json_ready(value) for value in metrics]
    if isinstance(metrics, float) and math.isnan(metrics):
        return None
    return metrics
