"""ImageNet-1k (``imagenet:DIR``) as people hold it: ``DIR/train/<wnid>/`` and ``DIR/val/<wnid>/`` class folders
(torchvision's ``ImageNet`` layout once prepared), or ``DIR/val/`` holding the 50,000 validation images flat
(``ILSVRC2012_val_00000001.JPEG``...) beside the devkit (``ILSVRC2012_devkit_t12.tar.gz`` or its extracted
folder), whose ground truth labels them. Classes are the WordNet ids in sorted order, the order of the class
folders and of every published checkpoint's head; names come from the devkit when it is there.

A validation image's number (``ILSVRC2012_val_00000042`` is 42) orders the reassessed ReaL labels, whichever
layout holds it (see ``vitkit.evaluate.metrics``).
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

from ...errors import DatasetError
from ...paths import TEXT_LIMIT, open_regular, read_capped, resolved
from ..folders import class_folders
from ..listed import concatenated, inside, listed_dataset
from ..map_style import FileDataset
from ..matlab import records
from ..splits import ALL
from .base import ReadOptions, Source
from .imagefolder import scan_folder

DEVKIT = "ILSVRC2012_devkit_t12"
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
META = "data/meta.mat"
VAL_IMAGE = re.compile(r"ILSVRC2012_val_(\d{8})\.(?:jpe?g|png)$", re.IGNORECASE)
OWN_SPLITS = ("train", "val")


def val_number(path: str | Path) -> int | None:
    """The number of an ImageNet validation image from its file name (1-based), None for another name."""
    found = VAL_IMAGE.search(Path(path).name)
    return int(found.group(1)) if found else None


def devkit_file(root: Path, member: str) -> bytes | None:
    """The devkit's file ``member`` from its extracted folder or its archive in ``root``; None without a devkit.
    The archive is read in memory, never extracted."""
    folder = root / DEVKIT
    if folder.is_dir():
        return read_capped(folder / member, f"the devkit's {member}")
    archive = root / f"{DEVKIT}.tar.gz"
    if not archive.exists():
        return None
    try:
        with open_regular(archive) as handle, tarfile.open(fileobj=handle, mode="r:gz") as tar:
            info = tar.getmember(f"{DEVKIT}/{member}")
            if not info.isfile() or info.size > TEXT_LIMIT:
                raise DatasetError(f"{archive}: {info.name} is not a file of at most {TEXT_LIMIT} bytes")
            return tar.extractfile(info).read()
    except KeyError:
        raise DatasetError(f"{archive}: has no {DEVKIT}/{member}; expected ImageNet's 2012 devkit") from None
    except (tarfile.TarError, EOFError, OSError) as error:
        raise DatasetError(f"{archive}: not a readable gzip tar ({error})") from None


def synsets(root: Path) -> dict[int, str] | None:
    """The wnid of each ILSVRC2012 class id (1..1000), from the devkit's meta.mat; None without a devkit."""
    data = devkit_file(root, META)
    if data is None:
        return None
    synset = records(data, "synsets", ("ILSVRC2012_ID", "WNID", "num_children"), root / DEVKIT / META)
    return {int(record["ILSVRC2012_ID"]): str(record["WNID"]) for record in synset if int(record["num_children"]) == 0}


def _flat_val(root: Path, val: Path, meta: dict[int, str] | None) -> tuple[list[Path], list[str]]:
    """The flat validation images, in number order, and the wnid the devkit's ground truth (with ``meta``, the
    devkit's wnid of each class id) gives each."""
    truth = devkit_file(root, GROUND_TRUTH)
    if truth is None or meta is None:
        raise DatasetError(f"{val}: validation images without class folders need the devkit "
                           f"({root}/{DEVKIT}.tar.gz or {root}/{DEVKIT}/) for their labels")
    try:
        ids = [int(line) for line in truth.decode().split()]
    except (UnicodeDecodeError, ValueError):
        raise DatasetError(f"{root}: the devkit's {GROUND_TRUTH} is not one class id a line") from None
    numbered = sorted((number, path.name) for path in val.iterdir() if (number := val_number(path)) is not None)
    if not numbered:
        raise DatasetError(f"{val}: no ILSVRC2012_val_<number>.JPEG images and no class folders")
    if numbered[-1][0] > len(ids):
        raise DatasetError(f"{val}: image {numbered[-1][1]} has no ground truth; expected numbers 1..{len(ids)}")
    unknown = sorted({ids[number - 1] for number, _ in numbered} - set(meta))
    if unknown:
        raise DatasetError(f"{root}: ground-truth class ids {unknown[:5]} are not in the devkit's 1000 classes")
    real = resolved(root)
    return [inside(real, f"{val.name}/{name}") for _, name in numbered], [meta[ids[n - 1]] for n, _ in numbered]


def class_list(root: Path, meta: dict[int, str] | None) -> list[str]:
    """ImageNet's wnids in sorted order: the devkit's (``meta``), else ``train/``'s class folders."""
    if meta is not None:
        return sorted(meta.values())
    train = root / "train"
    if not train.is_dir():
        raise DatasetError(f"{root}: no train/ folder and no devkit to name ImageNet's classes")
    return class_folders(train)


class ImageNet(Source):
    """``imagenet:DIR``."""

    argument = "DIR"
    known_splits = OWN_SPLITS

    def recognises(self, path: Path) -> int:
        return 2 * any((path / name).exists() for name in (DEVKIT, f"{DEVKIT}.tar.gz"))

    def open(self, path: str, split: str, options: ReadOptions) -> FileDataset:
        if split == ALL:
            return concatenated([read(Path(path), part) for part in OWN_SPLITS], path)
        return read(Path(path), split)


def read(root: Path, split: str) -> FileDataset:
    """The ``train`` or ``val`` split of the ImageNet folder ``root``."""
    folder = root / split
    if not folder.is_dir():
        raise DatasetError(f"{root}: no {split}/ folder; expected ImageNet as train/ and val/")
    meta = synsets(root)  # the devkit, read once: its archive is decompressed for each read
    classes = class_list(root, meta)
    if split == "val" and is_flat(folder):
        files, wnids = _flat_val(root, folder, meta)
        position = {wnid: label for label, wnid in enumerate(classes)}
        return listed_dataset(files, [position[wnid] for wnid in wnids], classes, f"{root}[val]")
    return scan_folder(folder, classes)


def is_flat(folder: Path) -> bool:
    """Whether ``folder`` holds validation images itself rather than class folders."""
    return any(val_number(path) is not None for path in folder.iterdir())
