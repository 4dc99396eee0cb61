"""The datasets known by name: the embedded ``digits`` and torchvision's MNIST, Fashion-MNIST, CIFAR-10 and
CIFAR-100, each with a fixed train and test split held in memory (the validation split is held out of train)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torchvision import datasets as tvd

from ...errors import DatasetError
from ..map_style import ArrayDataset, with_val
from ..splits import held_out
from .base import ReadOptions, Source

DIGITS_TEST_FRACTION = 0.2


def default_data_dir() -> Path:
    return Path(os.environ.get("VITKIT_DATA", Path.home() / ".cache" / "vitkit" / "data"))


class Digits(Source):
    """scikit-learn's 8x8 digits (grey levels 0..16, scaled to 0..255), embedded in the package; 20% fixed as
    the test split."""

    def open(self, path: str, split: str, options: ReadOptions) -> ArrayDataset:
        with resources.files("vitkit.data").joinpath("digits.npz").open("rb") as handle:
            arrays = np.load(handle, allow_pickle=False)
            images, labels = arrays["images"], arrays["labels"]
        images = torch.from_numpy((images.astype(np.float32) * (255 / 16)).round().astype(np.uint8))
        full = ArrayDataset(images, torch.from_numpy(labels), [str(d) for d in range(10)], "digits")
        train, test = held_out(len(full), DIGITS_TEST_FRACTION, seed=0)
        return with_val(full.subset(train, "digits[train]"), full.subset(test, "digits[test]"), split,
                        options.holdout)


class Torchvision(Source):
    """One of torchvision's datasets (``name``, read by ``kind``) from its files in ``--data-dir``, downloaded
    there only when they are absent."""

    def __init__(self, name: str, kind: type):
        self.name, self.kind = name, kind

    def open(self, path: str, split: str, options: ReadOptions) -> ArrayDataset:
        train, test = (self.read(is_train, options.data_dir) for is_train in (True, False))
        return with_val(train, test, split, options.holdout)

    def read(self, train: bool, data_dir: str | Path | None) -> ArrayDataset:
        root = Path(data_dir) if data_dir else default_data_dir()
        try:
            dataset = self.kind(root, train=train, download=False)
        except RuntimeError:
            try:
                dataset = self.kind(root, train=train, download=True)
            except (RuntimeError, OSError) as error:
                raise DatasetError(f"{self.name}: not found under {root} and could not be downloaded ({error}); "
                                   f"pass --data-dir with the dataset in torchvision's layout") from error
        images = torch.as_tensor(np.asarray(dataset.data))
        if images.ndim == 4:  # CIFAR: (N, H, W, C)
            images = images.permute(0, 3, 1, 2).contiguous()
        split = "train" if train else "test"
        return ArrayDataset(images, torch.as_tensor(dataset.targets), dataset.classes, f"{self.name}[{split}]")


TORCHVISION = {"mnist": tvd.MNIST, "fashion-mnist": tvd.FashionMNIST, "cifar10": tvd.CIFAR10,
               "cifar100": tvd.CIFAR100}
NAMED = {"digits": Digits(), **{name: Torchvision(name, kind) for name, kind in TORCHVISION.items()}}
"""The datasets known by name, each its own source."""
