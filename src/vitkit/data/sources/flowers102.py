"""Oxford Flowers-102 (``flowers102:DIR``) as torchvision's ``Flowers102`` downloads it: ``DIR/flowers-102/``
with ``jpg/image_00001.jpg``..., ``imagelabels.mat`` (a class 1..102 per image) and ``setid.mat`` (the image
numbers of ``trnid``, ``valid`` and ``tstid``). Splits ``train``, ``val`` and ``test`` as published, and
``trainval`` (the paper trains on both). MATLAB files are read with SciPy (``pip install vitkit[suite]``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from torchvision import datasets as tvd

from ...errors import DatasetError
from ...paths import resolved
from ..listed import inside, listed_dataset, torchvision_folder
from ..map_style import FileDataset
from ..splits import ALL
from .base import ReadOptions, Source
from ..matlab import integers

KIND = tvd.Flowers102
FOLDER = "flowers-102"
SET_KEYS = {"train": "trnid", "val": "valid", "test": "tstid"}
OWN_SPLITS = ("train", "val", "test", "trainval")


def class_names(count: int) -> list[str]:
    """torchvision's names of the 102 flowers, or the numbers 1..count where they do not fit."""
    names = list(getattr(tvd.Flowers102, "classes", []))
    return names if len(names) == count else [str(label + 1) for label in range(count)]


class Flowers102(Source):
    """``flowers102:DIR``."""

    argument = "DIR"
    known_splits = OWN_SPLITS

    def recognises(self, path: Path) -> int:
        return 2 * any((folder / "setid.mat").is_file() for folder in (path / FOLDER, path))

    def open(self, path: str, split: str, options: ReadOptions) -> FileDataset:
        return read(Path(path), split)


def read(root: Path, split: str) -> FileDataset:
    """The ``split`` of the Flowers-102 folder ``root``."""
    folder = torchvision_folder(root, KIND, FOLDER, "setid.mat")
    labels = integers(folder / "imagelabels.mat", "labels", folder / "imagelabels.mat") - 1
    parts = {"trainval": ("train", "val"), ALL: ("train", "val", "test")}.get(split, (split,))
    numbers = np.concatenate([integers(folder / "setid.mat", SET_KEYS[part], folder / "setid.mat") for part in parts])
    if numbers.min() < 1 or numbers.max() > len(labels):
        raise DatasetError(f"{folder / 'setid.mat'}: image numbers reach {int(numbers.max())}; expected 1.."
                           f"{len(labels)} (the images imagelabels.mat labels)")
    real = resolved(folder)
    files = [inside(real, f"jpg/image_{int(image):05d}.jpg") for image in numbers]
    classes = class_names(int(labels.max()) + 1)
    return listed_dataset(files, labels[numbers - 1], classes, f"{folder}[{split}]")
