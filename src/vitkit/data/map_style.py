"""The map-style datasets the sources give (``ArrayDataset``: images in memory; ``FileDataset``: files listed,
decoded on access) and the splits held out of them for a dataset that lacks one (``SplitSpec``, ``with_val``).

A dataset without a validation (or test) split gets one held out of its training images, the same for every
seed-equal call, so a run's validation images never leak into its training images.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DatasetError
from .images import read_image
from .splits import ALL, held_out

# Without class names the classes are the labels 0..largest; a label beyond this is taken for a damaged one
# rather than asking for that many classes (ImageNet-21k has 21,843, JFT 18,291).
MAX_UNNAMED_CLASSES = 1_000_000


class ArrayDataset(Dataset):
    """Images held in memory as one uint8 ``(N, C, H, W)`` tensor."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: list[str], name: str):
        if images.ndim == 3:
            images = images[:, None]
        if images.ndim != 4 or images.dtype != torch.uint8:
            raise DatasetError(f"{name}: expected uint8 images (N, C, H, W), got {images.dtype} "
                               f"{tuple(images.shape)}")
        if len(images) != len(labels):
            raise DatasetError(f"{name}: {len(images)} images but {len(labels)} labels")
        if len(images) == 0:
            raise DatasetError(f"{name}: the dataset is empty")
        self.images, self.labels, self.classes, self.name = images, labels.long(), list(classes), name

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])

    def subset(self, indices: np.ndarray, name: str) -> "ArrayDataset":
        rows = torch.from_numpy(np.array(indices, dtype=np.int64))  # a copy: ``held_out`` may give mapped ones
        return ArrayDataset(self.images[rows], self.labels[rows], self.classes, name)

    @staticmethod
    def joined(parts: list["ArrayDataset"], name: str) -> "ArrayDataset":
        """The images of ``parts`` (which share their class list), one after the other."""
        return ArrayDataset(torch.cat([part.images for part in parts]), torch.cat([part.labels for part in parts]),
                            parts[0].classes, name)


class FileDataset(Dataset):
    """Image files listed, not read (``imagefolder:``): each is decoded when a worker asks for it, so an
    unreadable one surfaces then (see ``loading.Transformed`` for what ``--corrupt`` does with it).
    The paths of the whole folder live in one numpy byte array, class after class (memory-mapped when the listing
    cache has it: ranks and forked workers share its pages); a split keeps only the rows it takes of it, and a
    row's label follows from the class it falls in. Nothing of a million entries is made before it is needed:
    fresh memory, not arithmetic, is what such arrays cost."""

    def __init__(self, listing: np.ndarray, class_ends: np.ndarray, class_labels: np.ndarray, classes: list[str],
                 name: str, rows: np.ndarray | None = None):
        if len(listing if rows is None else rows) == 0:
            raise DatasetError(f"{name}: the dataset is empty")
        self.listing, self.class_ends, self.class_labels, self.rows = listing, class_ends, class_labels, rows
        self.classes, self.name = classes, name

    def __len__(self) -> int:
        return len(self.listing if self.rows is None else self.rows)

    def _row(self, index: int) -> int:
        return index if self.rows is None else int(self.rows[index])

    @property
    def files(self) -> np.ndarray:
        return self.listing if self.rows is None else self.listing[self.rows]

    def _label_of(self, rows: int | np.ndarray) -> np.ndarray:
        """The labels of listing rows: each that of the class it falls in."""
        return self.class_labels[np.searchsorted(self.class_ends, rows, side="right")]

    @functools.cached_property
    def labels(self) -> torch.Tensor:
        return torch.from_numpy(self._label_of(np.arange(len(self.listing)) if self.rows is None else self.rows))

    def path(self, index: int) -> Path:
        return Path(os.fsdecode(self.listing[self._row(index)]))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return read_image(self.path(index)), int(self._label_of(self._row(index)))

    def subset(self, indices: np.ndarray, name: str) -> "FileDataset":
        indices = np.asarray(indices)
        return FileDataset(self.listing, self.class_ends, self.class_labels, self.classes, name,
                           indices if self.rows is None else self.rows[indices])

    @staticmethod
    def joined(parts: list["FileDataset"], name: str) -> "FileDataset":
        """The files of whole folder listings ``parts`` (labelled by one class list), one after the other."""
        starts = np.cumsum([0, *(len(part.listing) for part in parts[:-1])])
        return FileDataset(np.concatenate([part.listing for part in parts]),
                           np.concatenate([part.class_ends + start for part, start in zip(parts, starts)]),
                           np.concatenate([part.class_labels for part in parts]), parts[0].classes, name)


@dataclass
class SplitSpec:
    """How much of the training images to hold out for the splits a dataset lacks."""

    val_fraction: float = 0.1
    seed: int = 0


def with_val(train, test, split: str, spec: SplitSpec):
    """Carve the validation split out of ``train`` (which then loses those images); ``all`` is both."""
    if split == "test":
        return test
    if split == ALL:
        return train if test is None else type(train).joined([train, test], train.name.removesuffix("[train]"))
    if spec.val_fraction <= 0:
        if split == "val":
            raise DatasetError(f"{train.name}: no validation split (val_fraction is 0)")
        return train
    return held_part(train, spec.val_fraction, spec.seed, split == "val", f"{train.name}[{split}]")


def held_part(dataset, fraction: float, seed: int, held: bool, name: str):
    """The part of ``dataset`` held out (``held``) or kept when a ``fraction`` of it, drawn from ``seed``, is
    held out; a part with no image is refused saying why (a few images hold out none)."""
    kept, held_rows = held_out(len(dataset), fraction, seed)
    rows = held_rows if held else kept
    if not len(rows):
        raise DatasetError(f"{name}: holding out {fraction:g} of the {len(dataset)} image(s) of {dataset.name} "
                           f"(--val-fraction) leaves {'none held out' if held else 'none to keep'}")
    return dataset.subset(rows, name)
