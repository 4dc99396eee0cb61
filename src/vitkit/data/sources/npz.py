"""Arrays in an ``.npz`` file (``npz:PATH``): ``x_train, y_train, x_test, y_test``, optionally ``x_val, y_val``
and ``classes``; images uint8 as (N, H, W) or (N, H, W, C), held in memory."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from ...errors import DatasetError
from ..map_style import MAX_UNNAMED_CLASSES, ArrayDataset, SplitSpec, with_val
from ..splits import ALL, SPLITS
from .base import ReadOptions, Source


class Npz(Source):
    """``npz:PATH``."""

    def recognises(self, path: Path) -> int:
        return 2 * (path.suffix.lower() == ".npz")

    def open(self, path: str, split: str, options: ReadOptions) -> ArrayDataset:
        return npz_split(Path(path), split, options.holdout)


def npz_split(path: Path, split: str, spec: SplitSpec) -> ArrayDataset:
    """Arrays ``x_train, y_train, x_test, y_test`` (optionally ``x_val, y_val``, ``classes``); images
    uint8 as (N, H, W) or (N, H, W, C)."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such .npz file")
    try:
        arrays = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DatasetError(f"{path}: not a readable .npz file ({error})") from error

    def array(name: str) -> np.ndarray:
        try:
            return arrays[name]
        except (OSError, ValueError, zipfile.BadZipFile) as error:  # Python objects, a damaged member
            raise DatasetError(f"{path}: array {name} is not readable ({error})") from None

    def part(key: str) -> ArrayDataset:
        if f"x_{key}" not in arrays or f"y_{key}" not in arrays:
            raise DatasetError(f"{path}: needs arrays x_{key} and y_{key}; it has {sorted(arrays.files)}")
        images = torch.from_numpy(np.ascontiguousarray(array(f"x_{key}")))
        if images.ndim == 4:
            images = images.permute(0, 3, 1, 2).contiguous()
        labels = array(f"y_{key}")
        if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) and not (
                labels.min() >= 0 and labels.max() < MAX_UNNAMED_CLASSES):
            raise DatasetError(f"{path}: y_{key} holds {labels.dtype} of shape {labels.shape}"
                               + (f" in {labels.min()}..{labels.max()}" if labels.size and labels.dtype.kind in "iuf"
                                  else "") + f"; expected one class index in 0..{MAX_UNNAMED_CLASSES - 1} per image")
        classes = [str(c) for c in array("classes")] if "classes" in arrays else \
            [str(c) for c in range(int(labels.max(initial=-1)) + 1)]
        return ArrayDataset(images, torch.from_numpy(labels.astype(np.int64)), classes, f"{path.name}[{key}]")

    if split == "test":
        return part("test")
    if split == ALL:
        return ArrayDataset.joined([part(key) for key in SPLITS if f"x_{key}" in arrays], path.name)
    if "x_val" in arrays:
        return part(split)
    return with_val(part("train"), None, split, spec)
