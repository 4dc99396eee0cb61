"""Image folders (``imagefolder:PATH``): one sub-folder per class, ``PATH/<class>/<image>``, or the same under
split folders ``PATH/{train,val,test}/`` (``validation/`` for ``val``). The files are listed, never opened, and
decoded on access (``FileDataset``); the listing is cached (``folders``), so a folder of any size is ready at once.
Missing splits are held out of the training images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import DatasetError
from ..folders import class_folders, folder_listing
from ..map_style import FileDataset, SplitSpec, held_part, with_val
from ..splits import ALL, SPLITS, split_of
from .base import ReadOptions, Source, measured_split

Listings = dict[tuple[str, tuple[str, ...]], FileDataset]  # the folders listed so far, by (folder, classes)


class ImageFolder(Source):
    """``imagefolder:PATH``."""

    def recognises(self, path: Path) -> int:
        return int(path.is_dir())

    def splits(self, path: str) -> tuple[str, ...]:
        folders = split_folders(Path(path))
        return ("train", "val") if folders and "test" not in folders else SPLITS  # ImageNet's layout: train/ + val/

    def default_split(self, path: str) -> str:
        """Its own test folder, else its own validation folder (ImageNet's ``train/`` + ``val/``), else all of it:
        a folder of images that names no split is the user's to measure whole, not a part held out of it."""
        return measured_split(tuple(split_folders(Path(path))))

    def open(self, path: str, split: str, options: ReadOptions) -> FileDataset:
        return folder_split(Path(path), split, options.holdout, None)

    def open_splits(self, path: str, splits: tuple[str, ...], options: ReadOptions) -> dict:
        """The splits from one listing of each folder (a flat folder gives every split from one)."""
        listings: Listings = {}
        return {split: folder_split(Path(path), split, options.holdout, listings) for split in splits}


def split_folders(root: Path) -> dict[str, Path]:
    """The split folders of ``root`` (``train/``, ``val/`` or ``validation/``, ``test/``), by split, when it has
    a training folder; none when it is a folder of class folders."""
    found: dict[str, Path] = {}
    for name in class_folders(root) if root.is_dir() else []:
        split = split_of(name)
        if split in found:  # val/ and validation/: neither is read as the other's
            raise DatasetError(f"{root}: both {found[split].name}/ and {name}/ name the {split} split; keep one")
        if split is not None:
            found[split] = root / name
    return {split: found[split] for split in SPLITS if split in found} if "train" in found else {}


def folder_split(root: Path, split: str, spec: SplitSpec, listings: Listings | None) -> FileDataset:
    """``root/<class>/*`` images, or ``root/{train,val,test}/<class>/*``; missing splits are held out
    (test from train with the validation fraction, then val from the rest). The split folders share one
    class list, the union of their class folders, so that a label means the same class in each. A folder
    listed before into ``listings`` is not listed again."""
    if not root.is_dir():
        raise DatasetError(f"{root}: no such image folder")
    folders = split_folders(root)
    if not folders:
        whole = scan_folder(root, None, listings)
        if split == ALL:
            return whole
        if split == "test":
            return held_part(whole, spec.val_fraction, spec.seed + 1, True, f"{root}[test]")
        return with_val(held_part(whole, spec.val_fraction, spec.seed + 1, False, f"{root}[train]"), None, split, spec)
    classes = sorted({name for folder in folders.values() for name in class_folders(folder)})
    if split == ALL:
        return FileDataset.joined([scan_folder(folder, classes, listings) for folder in folders.values()], str(root))
    if split in folders and (split != "train" or "val" in folders):  # else val is held out of train
        return scan_folder(folders[split], classes, listings)
    if split == "test":
        raise DatasetError(f"{root}: has train/ but no test/ folder")
    return with_val(scan_folder(folders["train"], classes, listings), None, split, spec)


def scan_folder(root: Path, classes: list[str] | None = None, listings: Listings | None = None) -> FileDataset:
    """One sub-folder per class, listed (names and labels only: nothing is opened; hidden files are left
    out; the listing cached, see ``folders.py``), so a folder of any size is ready at once. ``classes``
    (default: the sub-folders) fixes the labels; a class without a folder here has no image in this split.
    A folder already in ``listings`` is taken from there, a new one kept there."""
    key = (str(root), tuple(classes or ()))
    if listings is None:
        return _list_folder(Path(root), classes)
    if key not in listings:
        listings[key] = _list_folder(Path(root), classes)
    return listings[key]


def _list_folder(root: Path, classes: list[str] | None) -> FileDataset:
    listing = folder_listing(root)
    if not listing.classes:
        raise DatasetError(f"{root}: no class folders (expected {root}/<class>/<image>)")
    for name, count in zip(listing.classes, listing.counts):
        if count == 0:
            raise DatasetError(f"{root / name}: class folder is empty")
    classes = classes or listing.classes
    position = {name: label for label, name in enumerate(classes)}  # not classes.index: 21k classes would take 3 s
    labels = np.array([position[name] for name in listing.classes], dtype=np.int64)
    return FileDataset(listing.files, np.cumsum(listing.counts), labels, classes, str(root))
