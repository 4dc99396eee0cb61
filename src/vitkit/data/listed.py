"""Datasets whose images and labels a file lists (the evaluation suite's layouts: Pets, Flowers-102, ImageNet's
flat validation folder, VTAB-1k's file lists), as the same ``FileDataset`` a folder of class folders gives.

A listed file must lie inside the dataset's folder (links resolved, see ``vitkit.paths``); the list files are
read whole, capped like every text file vitkit reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..classnames import parse_class_list
from ..errors import DatasetError
from ..paths import read_capped, read_text, reason, within
from .map_style import FileDataset


def listed_dataset(files: Sequence[Path] | np.ndarray, labels: Sequence[int] | np.ndarray, classes: list[str],
                   name: str) -> FileDataset:
    """A ``FileDataset`` of ``files`` (paths, or a numpy array of their bytes) with ``labels``, in the order
    listed. Its listing is grouped class by class (how ``FileDataset`` finds a row's label) and its rows put the
    list's order back."""
    labels = np.asarray(labels, dtype=np.int64)
    if not isinstance(files, np.ndarray):
        files = np.array([os.fsencode(path) for path in files]) if len(files) else np.array([], dtype="S1")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
        bad = int(labels[(labels < 0) | (labels >= len(classes))][0])
        raise DatasetError(f"{name}: label {bad} is out of range; expected 0..{len(classes) - 1}")
    order = np.argsort(labels, kind="stable")
    listing = files[order]
    counts = np.bincount(labels, minlength=len(classes))
    present = np.flatnonzero(counts)
    rows = np.empty(len(order), dtype=np.int64)
    rows[order] = np.arange(len(order))
    return FileDataset(listing, np.cumsum(counts[present]), present, classes, name, rows)


def torchvision_folder(root: Path, kind: type, folder: str, marker: str) -> Path:
    """The folder ``folder`` of torchvision's dataset ``kind`` under ``root`` (``root`` itself when it is that
    folder), known by its file or folder ``marker``; downloaded there by torchvision (its own download and
    checksums) when ``root`` is absent or empty; else a DatasetError naming the layout expected."""
    for attempt in range(2):
        for candidate in (root / folder, root):
            if (candidate / marker).exists():
                return candidate
        if attempt == 0 and not any(root.iterdir() if root.is_dir() else ()):
            try:
                kind(root, download=True)
            except (RuntimeError, OSError) as error:
                raise DatasetError(f"{root}: no {folder} folder, and it could not be downloaded ({error}); expected "
                                   f"what torchvision.datasets.{kind.__name__}(DIR, download=True) writes") from error
    raise DatasetError(f"{root}: no {folder} folder; expected the dataset in torchvision's layout, as "
                       f"torchvision.datasets.{kind.__name__}(DIR, download=True) writes it")


def concatenated(parts: Sequence[FileDataset], name: str) -> FileDataset:
    """The images of ``parts`` (datasets over one class list), one part after the other."""
    return listed_dataset(np.concatenate([part.files for part in parts]),
                          np.concatenate([part.labels.numpy() for part in parts]), parts[0].classes, name)


def list_lines(path: Path, what: str) -> list[list[str]]:
    """The non-empty lines of the list file ``path``, each split on white space; a DatasetError naming it when
    it is absent."""
    if not path.is_file():
        raise DatasetError(f"{path}: no such file; expected {what}")
    try:
        text = read_text(path, what)
    except UnicodeDecodeError as error:
        raise DatasetError(f"{path}: not UTF-8 text; expected {what}") from error
    return [line.split() for line in text.splitlines() if line.strip()]


def inside(real_root: Path, name: str) -> Path:
    """The file ``name`` of a list, which must lie in the dataset's folder ``real_root`` (resolved once by the
    caller with ``paths.resolved``, not once per listed file)."""
    return within(real_root, name, DatasetError, "a listed image")


def number(text: str, path: Path, line: int, what: str) -> int:
    """An integer field of line ``line`` of ``path``, or a DatasetError naming both."""
    try:
        return int(text)
    except ValueError:
        raise DatasetError(f"{path}:{line}: {what} {text!r} is not an integer") from None


def read_class_names(path: Path) -> list[str] | None:
    """The class names of ``classes.txt`` (one a line, UTF-8, escaped as ``classnames`` says; bytes that are not
    UTF-8 kept as surrogate escapes), or None when there is no such file."""
    if not os.path.lexists(path):
        return None
    try:
        names = parse_class_list(read_capped(path, "class list").decode("utf-8", "surrogateescape"))
    except OSError as error:
        raise DatasetError(f"{path}: not a readable class list ({reason(error)}); expected UTF-8 text, one class "
                           f"name a line") from None
    if not names:
        raise DatasetError(f"{path}: names no class; expected one class name a line")
    return names
