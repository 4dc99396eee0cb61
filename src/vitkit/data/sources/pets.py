"""Oxford-IIIT Pets (``pets:DIR``) as torchvision's ``OxfordIIITPet`` downloads it: ``DIR/oxford-iiit-pet/``
with ``images/<name>.jpg`` and ``annotations/{trainval,test}.txt``, lines of ``<name> <class 1..37> <species>
<breed>``. Splits: ``trainval`` and ``test`` as published; ``train`` and ``val`` part ``trainval`` by the held-out
fraction (the paper picks its learning rate on 10% of it). Class names as torchvision gives them (``Great
Pyrenees`` from ``great_pyrenees_12``), ordered by their number.
"""

from __future__ import annotations

from pathlib import Path

from torchvision import datasets as tvd

from ...errors import DatasetError
from ...paths import resolved
from ..listed import concatenated, inside, list_lines, listed_dataset, number, torchvision_folder
from ..map_style import FileDataset, with_val
from ..splits import ALL
from .base import ReadOptions, Source

KIND = tvd.OxfordIIITPet
FOLDER = "oxford-iiit-pet"
OWN_SPLITS = ("trainval", "test")


def _entries(folder: Path, split: str) -> list[tuple[str, int]]:
    path = folder / "annotations" / f"{split}.txt"
    entries = []
    for line, fields in enumerate(list_lines(path, "the Pets split list"), 1):
        if len(fields) != 4:
            raise DatasetError(f"{path}:{line}: expected '<image> <class> <species> <breed>'")
        entries.append((fields[0], number(fields[1], path, line, "class") - 1))
    return entries


def class_names(entries: list[tuple[str, int]]) -> list[str]:
    """The breeds, each named by its images' names (``english_cocker_spaniel_3`` is English Cocker Spaniel)."""
    names: dict[int, str] = {}
    for image, label in entries:
        names.setdefault(label, " ".join(part.title() for part in image.rsplit("_", 1)[0].split("_")))
    if sorted(names) != list(range(len(names))):
        raise DatasetError(f"Pets classes {sorted(set(range(max(names) + 1)) - set(names))} have no image; "
                           "expected classes 1..37 in trainval.txt and test.txt")
    return [names[label] for label in range(len(names))]


class Pets(Source):
    """``pets:DIR``."""

    argument = "DIR"
    known_splits = ("train", "val", "test", "trainval")

    def recognises(self, path: Path) -> int:
        return 2 * any((folder / "annotations" / "trainval.txt").is_file() for folder in (path / FOLDER, path))

    def splits(self, path: str) -> tuple[str, ...]:
        return self.known_splits

    def open(self, path: str, split: str, options: ReadOptions) -> FileDataset:
        if split in ("train", "val"):
            return with_val(self.open(path, "trainval", options), None, split, options.holdout)
        if split == ALL:
            return concatenated([self.open(path, part, options) for part in OWN_SPLITS], str(path))
        return read(Path(path), split)


def read(root: Path, split: str) -> FileDataset:
    """The ``trainval`` or ``test`` split of the Pets folder ``root``."""
    folder = torchvision_folder(root, KIND, FOLDER, "annotations")
    entries = {name: _entries(folder, name) for name in OWN_SPLITS}
    classes = class_names(entries["trainval"] + entries["test"])
    real = resolved(folder)
    files = [inside(real, f"images/{image}.jpg") for image, _ in entries[split]]
    return listed_dataset(files, [label for _, label in entries[split]], classes, f"{folder}[{split}]")
