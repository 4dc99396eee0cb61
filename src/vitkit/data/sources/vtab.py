"""A VTAB-1k task (``vtab:DIR``) in the file-list layout most people hold it in (the VPT and NOAH code bases'):
the task's folder holds its images and four lists, ``train800.txt``, ``val200.txt``, ``train800val200.txt`` and
``test.txt``, lines of ``<image path relative to the folder> <label>``. The splits are those four, and
``train``, ``val`` and ``trainval`` name the first three. A task has exactly 800 + 200 training examples: a
shorter list is refused (it is not VTAB-1k). Classes are the labels' numbers.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import DatasetError
from ...paths import resolved
from ..listed import inside, list_lines, listed_dataset, number
from ..map_style import FileDataset
from ..splits import ALL
from .base import ReadOptions, Source

LISTS = ("train800", "val200", "train800val200", "test")
ALIASES = {"train": "train800", "val": "val200", "trainval": "train800val200"}
SIZES = {"train800": 800, "val200": 200, "train800val200": 1000}


def entries(root: Path, split: str) -> list[tuple[str, int]]:
    """The (image, label) lines of the list of ``split``, checked for VTAB-1k's sizes."""
    path = root / f"{split}.txt"
    if not root.is_dir():
        raise DatasetError(f"{root}: no such VTAB-1k task folder")
    rows = []
    for line, fields in enumerate(list_lines(path, f"VTAB-1k's {split} list"), 1):
        if len(fields) < 2:
            raise DatasetError(f"{path}:{line}: expected '<image> <label>'")
        rows.append((" ".join(fields[:-1]), number(fields[-1], path, line, "label")))
    if split in SIZES and len(rows) != SIZES[split]:
        raise DatasetError(f"{path}: {len(rows)} examples; a VTAB-1k task has exactly {SIZES[split]} in {split}")
    return rows


class Vtab(Source):
    """``vtab:DIR``, a task's folder."""

    argument = "DIR"
    known_splits = (*LISTS, *ALIASES)

    def recognises(self, path: Path) -> int:
        return 2 * (path / "train800val200.txt").is_file()

    def splits(self, path: str) -> tuple[str, ...]:
        return LISTS

    def open(self, path: str, split: str, options: ReadOptions) -> FileDataset:
        return read(Path(path), split)


def read(root: Path, split: str) -> FileDataset:
    """The ``split`` of the VTAB-1k task folder ``root``."""
    split = ALIASES.get(split, split)
    lists = {name: entries(root, name) for name in LISTS}
    count = 1 + max(label for rows in lists.values() for _, label in rows)
    rows = lists["train800val200"] + lists["test"] if split == ALL else lists[split]
    real = resolved(root)
    return listed_dataset([inside(real, image) for image, _ in rows], [label for _, label in rows],
                          [str(label) for label in range(count)], f"{root}[{split}]")
