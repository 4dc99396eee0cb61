"""Datasets by name: the embedded ``digits``, torchvision's MNIST / Fashion-MNIST / CIFAR, arrays in
``.npz`` files, ``imagefolder:PATH`` (listed, decoded on access) and the sharded ``webdataset:`` (see
``shards.py``) and ``hf:`` (``hf.py``).

Every dataset yields ``(image, label)`` with the image a uint8 ``(C, H, W)`` tensor and keeps its
class names in ``.classes``. Splits are ``train``, ``val`` and ``test``; a dataset without a
validation (or test) split gets one held out of its training images, the same for every seed-equal
call, so a run's validation images never leak into its training images. ``all`` is every image of the
dataset, whatever its split: what a folder of images that names no split holds.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import zipfile
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset
from torchvision import datasets as tvd
from torchvision.transforms.v2.functional import pil_to_tensor

from ..errors import DatasetError, DatasetNameError
from ..paths import open_regular
from .folders import class_folders, folder_listing
from .splits import ALL, SPLITS, held_out, split_of

# Without class names the classes are the labels 0..largest; a label beyond this is taken for a damaged one
# rather than asking for that many classes (ImageNet-21k has 21,843, JFT 18,291).
MAX_UNNAMED_CLASSES = 1_000_000
# The folders listed so far inside one load_splits call: a flat image folder gives every split from one listing.
_LISTINGS: ContextVar[dict | None] = ContextVar("vitkit_folder_listings", default=None)
TORCHVISION = {"mnist": tvd.MNIST, "fashion-mnist": tvd.FashionMNIST, "cifar10": tvd.CIFAR10,
               "cifar100": tvd.CIFAR100}
DIGITS_TEST_FRACTION = 0.2
STREAMED = ("webdataset:", "hf:")  # read in shards, in an order that depends on the workers (see shards.py)
"""Dataset prefixes read as streams of shards, whose order depends on the number of workers."""


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


# Larger images are refused before they are decoded (Pillow's own limit: a 3-byte-per-pixel image of
# this size takes 256 MiB, and a few hundred bytes of PNG can claim it).
MAX_PIXELS = Image.MAX_IMAGE_PIXELS


def read_image(source: str | Path | BinaryIO, name: str | None = None) -> torch.Tensor:
    """Decode an image fully (a truncated file fails here) as uint8 (C, H, W), the way it is meant to be
    seen: EXIF orientation applied, 16-bit and float grey scaled (not clipped) to 0..255, palette, CMYK and
    other modes converted to RGB, grey kept as 1 channel (the model decides channels: ``ToChannels``).
    Transparency is composited over white, as a page shows it and as HF's image processors do: the colour
    under a transparent pixel is undefined (often black), so dropping alpha would show that instead.
    Errors name the image ``name`` (default: the path)."""
    name = name or str(source)
    try:
        # A path is opened as a regular file only: a FIFO or a device in its place is refused, never waited on.
        with open_regular(source) if isinstance(source, str | Path) else contextlib.nullcontext(source) as handle, \
                Image.open(handle) as image:
            if image.width * image.height > MAX_PIXELS:
                raise DatasetError(f"{name}: refusing to decode a {image.width}x{image.height} image "
                                   f"({image.width * image.height:,} pixels, more than {MAX_PIXELS:,}): "
                                   f"a decompression bomb, or an image to downscale first")
            image.load()
            return pil_to_tensor(_eight_bit(ImageOps.exif_transpose(image)))
    except DatasetError:
        raise
    except Image.DecompressionBombError as error:
        raise DatasetError(f"{name}: refusing to decode a decompression bomb ({error})") from error
    except (OSError, ValueError, SyntaxError) as error:
        raise DatasetError(f"{name}: not a readable image ({error})") from error


def _eight_bit(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit grey ("L") or RGB."""
    if image.mode in ("L", "RGB"):
        return image
    if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit integer or float grey
        pixels = np.asarray(image, dtype=np.float64)
        scale = 255 / 65535 if image.mode.startswith("I") else 255.0  # integers: 16 bits; floats: 0..1
        return Image.fromarray(np.clip(np.rint(pixels * scale), 0, 255).astype(np.uint8), "L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("1", "L"):
        return image.convert("L")
    if image.mode in ("LA", "La", "PA", "RGBA", "RGBa"):
        grey = image.mode in ("LA", "La")
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image).convert("RGB")
        return image.convert("L") if grey else image
    return image.convert("RGB")


@dataclass
class SplitSpec:
    """How much of the training images to hold out for the splits a dataset lacks."""

    val_fraction: float = 0.1
    seed: int = 0


def load_dataset(name: str, split: str, data_dir: str | Path | None = None,
                 spec: SplitSpec | None = None, corrupt: str = "fail"):
    """The ``split`` of dataset ``name`` (see module doc): a map-style ``Dataset``, or for sharded data
    (``webdataset:``, ``hf:``) a ``shards.ShardedSplit``, whose index pass applies ``corrupt`` to the
    unusable samples it finds."""
    spec = spec or SplitSpec()
    check_named_path(name)
    name = dataset_name(name)
    if split not in (*SPLITS, ALL):
        raise DatasetError(f"unknown split {split!r}; expected one of {(*SPLITS, ALL)}")
    if name == "digits":
        train, test = _digits()
    elif name in TORCHVISION:
        train, test = (_torchvision(name, is_train, data_dir) for is_train in (True, False))
    elif name.startswith("npz:"):
        return _npz_split(Path(name[4:]), split, spec)
    elif name.startswith("imagefolder:"):
        return _folder_split(Path(name[len("imagefolder:"):]), split, spec)
    elif name.startswith("webdataset:"):
        from .shards import webdataset_split  # shards builds on this module
        return webdataset_split(name[len("webdataset:"):], split, corrupt)
    else:  # hf:PATH, the last form dataset_name lets through
        from .hf import hf_split
        return hf_split(name[len("hf:"):], split, corrupt)
    return _with_val(train, test, split, spec)


def own_splits(name: str) -> tuple[str, ...]:
    """The splits dataset ``name``'s files or folders name (none held out): none for a folder of class
    folders."""
    if name.startswith(STREAMED):
        return split_names(name)
    if name.startswith("imagefolder:"):
        return tuple(split_folders(Path(name[len("imagefolder:"):])))
    return ("train", "test")


def default_split(name: str) -> str:
    """The split an evaluation of dataset ``name`` measures when none is asked for: its own test split, else
    its own validation split (ImageNet's ``train/`` + ``val/``), else all of it: a folder of images that names
    no split is the user's to measure whole, not a part held out of it."""
    own = own_splits(name)
    return next((split for split in ("test", "val") if split in own), ALL)


PREFIXES = ("npz:", "imagefolder:", "webdataset:", "hf:")
DATASET_FORMS = f"digits, {', '.join(TORCHVISION)}, npz:PATH, imagefolder:PATH, webdataset:ROOT or hf:PATH"


def dataset_name(name: str) -> str:
    """``name`` as ``load_dataset`` knows it: a named dataset in any spelling (``cifar-10``, ``CIFAR_10``:
    ``cifar10``; ``fashion_mnist``, ``fashionmnist``: ``fashion-mnist``) or ``KIND:PATH``; anything else is
    refused with what was probably meant (``data.npz``: ``npz:data.npz``)."""
    if name.startswith(PREFIXES):
        return name
    squashed = {known.replace("-", ""): known for known in ("digits", *TORCHVISION)}
    known = squashed.get(name.lower().replace("-", "").replace("_", ""))
    if known:
        return known
    guess = _prefixed(Path(name)) or next(iter(difflib.get_close_matches(name.lower(), list(squashed.values()))), None)
    hint = f"; did you mean {guess}?" if guess else ""
    raise DatasetNameError(f"unknown dataset {name!r}: expected {DATASET_FORMS}{hint}")


def _prefixed(path: Path) -> str | None:
    """The ``KIND:PATH`` a bare path most likely meant: an .npz file, a folder of .tar shards or of parquet
    files, or another folder (of class folders)."""
    if path.suffix.lower() == ".npz":
        return f"npz:{path}"
    if not path.is_dir():
        return None
    if next(path.glob("*.tar"), None):
        return f"webdataset:{path}"
    if next(path.rglob("*.parquet"), None):
        return f"hf:{path}"
    return f"imagefolder:{path}"


def check_named_path(name: str) -> None:
    """A dataset given by its path (``npz:PATH``, ...) names one: an empty one would read the working folder."""
    kind, colon, path = name.partition(":")
    if colon and f"{kind}:" in PREFIXES and not path:
        raise DatasetError(f"dataset {name!r}: expected a path after '{kind}:' ({kind}:PATH)")


def split_names(name: str) -> tuple[str, ...]:
    """The splits dataset ``name`` can give: every one, held out where need be, except for shards, which
    have the splits their files name."""
    check_named_path(name)
    if name.startswith("webdataset:"):
        from .shards import shard_files
        return tuple(split for split, files in shard_files(name[len("webdataset:"):]).items() if files)
    if name.startswith("hf:"):
        from .hf import hf_root, split_files
        found = tuple(split_files(hf_root(name[len("hf:"):])))
        if not found:
            raise DatasetError(f"{name}: no split found; expected parquet files of a train, validation or test "
                               f"split (or a datasets save_to_disk folder)")
        return found
    if name.startswith("imagefolder:"):
        folders = split_folders(Path(name[len("imagefolder:"):]))
        if folders and "test" not in folders:  # ImageNet's layout: train/ and val/
            return ("train", "val")
    return SPLITS


def _with_val(train, test, split: str, spec: SplitSpec):
    """Carve the validation split out of ``train`` (which then loses those images); ``all`` is both."""
    if split == "test":
        return test
    if split == ALL:
        return train if test is None else type(train).joined([train, test], train.name.removesuffix("[train]"))
    if spec.val_fraction <= 0:
        if split == "val":
            raise DatasetError(f"{train.name}: no validation split (val_fraction is 0)")
        return train
    return _part(train, spec.val_fraction, spec.seed, split == "val", f"{train.name}[{split}]")


def _part(dataset, fraction: float, seed: int, held: bool, name: str):
    """The part of ``dataset`` held out (``held``) or kept when a ``fraction`` of it, drawn from ``seed``, is
    held out; a part with no image is refused saying why (a few images hold out none)."""
    kept, held_rows = held_out(len(dataset), fraction, seed)
    rows = held_rows if held else kept
    if not len(rows):
        raise DatasetError(f"{name}: holding out {fraction:g} of the {len(dataset)} image(s) of {dataset.name} "
                           f"(--val-fraction) leaves {'none held out' if held else 'none to keep'}")
    return dataset.subset(rows, name)


def _digits() -> tuple[ArrayDataset, ArrayDataset]:
    """scikit-learn's 8x8 digits (grey levels 0..16, scaled to 0..255); 20% fixed as the test split."""
    with resources.files(__package__).joinpath("digits.npz").open("rb") as handle:
        arrays = np.load(handle, allow_pickle=False)
        images, labels = arrays["images"], arrays["labels"]
    images = torch.from_numpy((images.astype(np.float32) * (255 / 16)).round().astype(np.uint8))
    full = ArrayDataset(images, torch.from_numpy(labels), [str(d) for d in range(10)], "digits")
    train, test = held_out(len(full), DIGITS_TEST_FRACTION, seed=0)
    return full.subset(train, "digits[train]"), full.subset(test, "digits[test]")


def default_data_dir() -> Path:
    return Path(os.environ.get("VITKIT_DATA", Path.home() / ".cache" / "vitkit" / "data"))


def _torchvision(name: str, train: bool, data_dir: str | Path | None) -> ArrayDataset:
    """Read torchvision's files from ``data_dir``; download them there only when they are absent."""
    root = Path(data_dir) if data_dir else default_data_dir()
    cls = TORCHVISION[name]
    try:
        dataset = cls(root, train=train, download=False)
    except RuntimeError:
        try:
            dataset = cls(root, train=train, download=True)
        except (RuntimeError, OSError) as error:
            raise DatasetError(f"{name}: not found under {root} and could not be downloaded ({error}); "
                               f"pass --data-dir with the dataset in torchvision's layout") from error
    images = torch.as_tensor(np.asarray(dataset.data))
    if images.ndim == 4:  # CIFAR: (N, H, W, C)
        images = images.permute(0, 3, 1, 2).contiguous()
    split = "train" if train else "test"
    return ArrayDataset(images, torch.as_tensor(dataset.targets), dataset.classes, f"{name}[{split}]")


def _npz_split(path: Path, split: str, spec: SplitSpec) -> ArrayDataset:
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
    return _with_val(part("train"), None, split, spec)


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


def _folder_split(root: Path, split: str, spec: SplitSpec) -> FileDataset:
    """``root/<class>/*`` images, or ``root/{train,val,test}/<class>/*``; missing splits are held out
    (test from train with the validation fraction, then val from the rest). The split folders share one
    class list, the union of their class folders, so that a label means the same class in each."""
    if not root.is_dir():
        raise DatasetError(f"{root}: no such image folder")
    folders = split_folders(root)
    if not folders:
        whole = scan_folder(root)
        if split == ALL:
            return whole
        if split == "test":
            return _part(whole, spec.val_fraction, spec.seed + 1, True, f"{root}[test]")
        return _with_val(_part(whole, spec.val_fraction, spec.seed + 1, False, f"{root}[train]"), None, split, spec)
    classes = sorted({name for folder in folders.values() for name in class_folders(folder)})
    if split == ALL:
        return FileDataset.joined([scan_folder(folder, classes) for folder in folders.values()], str(root))
    if split in folders and (split != "train" or "val" in folders):  # else val is held out of train
        return scan_folder(folders[split], classes)
    if split == "test":
        raise DatasetError(f"{root}: has train/ but no test/ folder")
    return _with_val(scan_folder(folders["train"], classes), None, split, spec)


def load_splits(name: str, splits: tuple[str, ...], data_dir: str | Path | None = None,
                spec: SplitSpec | None = None, corrupt: str = "fail") -> dict:
    """Several splits of dataset ``name`` (as :func:`load_dataset` gives each), its folders listed once for
    all of them rather than once per split."""
    token = _LISTINGS.set({})
    try:
        return {split: load_dataset(name, split, data_dir, spec, corrupt) for split in splits}
    finally:
        _LISTINGS.reset(token)


def scan_folder(root: Path, classes: list[str] | None = None) -> FileDataset:
    """One sub-folder per class, listed (names and labels only: nothing is opened; hidden files are left
    out; the listing cached, see ``folders.py``), so a folder of any size is ready at once. ``classes``
    (default: the sub-folders) fixes the labels; a class without a folder here has no image in this split."""
    listings, key = _LISTINGS.get(), (str(root), tuple(classes or ()))
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
