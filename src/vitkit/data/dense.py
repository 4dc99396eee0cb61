"""Dense datasets: images paired with a target of one value a pixel, a segmentation mask of class ids or a depth
map in metres (``DenseDataset``), the readers of those targets (``read_mask``, ``read_depth``) and the listing
helpers the dense sources share (``sources/segmentation.py``, ``sources/depth.py``).

A source lists the pairs (names only: nothing is opened, so a split of any size is ready at once; every listed file
must lie inside the dataset's folder, links resolved, and exist). An item is decoded when asked for: the image by
``images.read_image``, the target by its own reader, since the image reader makes palette PNGs RGB and 16-bit
images 8-bit, which would destroy class ids and millimetres alike. A target that does not fit its image, or holds a
value that names no class, is refused then, naming the file; a mask is never resized to fit.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from ..errors import DatasetError
from ..paths import resolved, within
from .folders import entries
from .images import decoded, read_image
from .map_style import SplitSpec, with_val
from .splits import ALL, SPLITS

SEGMENTATION, DEPTH = "segmentation", "depth"
IGNORE_INDEX = 255
"""The class id of pixels that count for nothing (void, unlabelled, object borders)."""
NOT_A_CLASS = -1
"""A lookup entry: a stored mask value that names no class, refused where it is met."""
DEPTH_SCALE = 1000.0
"""Stored units a metre: every depth layout read here stores millimetres."""
TARGET_KINDS = {SEGMENTATION: "mask", DEPTH: "depth map"}
TARGET_KEYS = {SEGMENTATION: "mask", DEPTH: "depth"}
"""What a sample's target is called in streamed formats: ``KEY.mask.png`` / ``KEY.depth.png`` in tar shards, the
``mask`` / ``depth`` column of ``hf:`` files."""
Crop = tuple[int, int, int, int]  # (top, bottom, left, right): rows top:bottom, columns left:right


def class_lookup(count: int) -> np.ndarray:
    """The lookup of masks that store class ids as they are: 0..count-1 kept, 255 ignored, any other value no
    class."""
    lookup = np.full(256, NOT_A_CLASS, dtype=np.int64)
    lookup[:count] = np.arange(count)
    lookup[IGNORE_INDEX] = IGNORE_INDEX
    return lookup


class DenseDataset(Dataset):
    """Images listed with their targets, decoded on access: item ``i`` is ``(image, target)``, the image uint8
    ``(C, H, W)`` and the target a ``tv_tensors.Mask`` of the image's ``(H, W)``: int64 class ids in
    ``[0, len(classes))`` or ``ignore_index`` for segmentation, float32 metres (0 where there is no depth) for
    depth. A segmentation mask's stored values become class ids through ``lookup`` (256 entries, see
    ``read_mask``; by default the ids as stored), an RGB mask's colours through ``palette``.

    ``max_depth`` caps the depth (metres) worth predicting and evaluating, ``eval_crop`` the region
    ``(top, bottom, left, right)`` where depth is evaluated; None where the dataset has none. The paths live in
    two numpy byte arrays, as ``FileDataset``'s do, so forked workers share their pages."""

    ignore_index = IGNORE_INDEX

    def __init__(self, pairs: Sequence[tuple[str | Path, str | Path]], task: str, classes: Sequence[str], name: str,
                 *, lookup: np.ndarray | None = None, palette: dict[int, int] | None = None,
                 max_depth: float | None = None, eval_crop: Crop | None = None):
        if not len(pairs):
            raise DatasetError(f"{name}: the dataset is empty")
        self.images = np.array([os.fsencode(image) for image, _ in pairs])
        self.targets = np.array([os.fsencode(target) for _, target in pairs])
        self.task, self.classes, self.name = task, list(classes), name
        self.lookup = class_lookup(len(self.classes)) if lookup is None and task == SEGMENTATION else lookup
        self.palette, self.max_depth, self.eval_crop = palette, max_depth, eval_crop

    def __len__(self) -> int:
        return len(self.images)

    def path(self, index: int) -> Path:
        """The image file of item ``index`` (what names an unreadable item)."""
        return Path(os.fsdecode(self.images[index]))

    def target_path(self, index: int) -> Path:
        """The mask or depth map file of item ``index``."""
        return Path(os.fsdecode(self.targets[index]))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, tv_tensors.Mask]:
        image_path, target_path = self.path(index), self.target_path(index)
        image = read_image(image_path, orient=False)  # as stored, as its mask was drawn on it
        target = (read_mask(target_path, self.lookup, self.palette) if self.task == SEGMENTATION
                  else read_depth(target_path))
        return paired(image, target, self.task, str(image_path), str(target_path))

    def subset(self, indices: np.ndarray, name: str) -> DenseDataset:
        """The items at ``indices``, in that order, as a dataset named ``name`` (a held-out split, a part of one)."""
        rows = np.asarray(indices, dtype=np.int64)
        if not len(rows):
            raise DatasetError(f"{name}: the dataset is empty")
        part = copy.copy(self)
        part.images, part.targets, part.name = self.images[rows], self.targets[rows], name
        return part

    @staticmethod
    def joined(parts: list[DenseDataset], name: str) -> DenseDataset:
        """The items of ``parts`` (splits of one dataset), one part after the other."""
        whole = copy.copy(parts[0])
        whole.images = np.concatenate([part.images for part in parts])
        whole.targets = np.concatenate([part.targets for part in parts])
        whole.name = name
        return whole


def paired(image: torch.Tensor, target: torch.Tensor, task: str, image_name: str, target_name: str
           ) -> tuple[torch.Tensor, tv_tensors.Mask]:
    """An image with its target, refused (naming both) when their sizes differ: a target is never resized."""
    if tuple(target.shape) != tuple(image.shape[-2:]):
        kind = TARGET_KINDS[task]
        raise DatasetError(f"{target_name}: the {kind} is {_size(target.shape)} but its image {image_name} is "
                           f"{_size(image.shape[-2:])}; expected the same size (a {kind} is never resized)")
    return image, tv_tensors.Mask(target)


def read_pair(task: str, classes: int, image: str | Path | BinaryIO, target: str | Path | BinaryIO,
              image_name: str, target_name: str) -> tuple[torch.Tensor, tv_tensors.Mask]:
    """An image with its mask (class ids as stored, ``classes`` of them) or depth map, each a file or bytes (a
    sample of shards), decoded and paired; errors name ``image_name`` and ``target_name``."""
    picture = read_image(image, image_name, orient=False)
    values = (read_mask(target, class_lookup(classes), name=target_name) if task == SEGMENTATION
              else read_depth(target, target_name))
    return paired(picture, values, task, image_name, target_name)


def _size(shape: Sequence[int]) -> str:
    return f"{shape[-1]}x{shape[-2]}"


def _pixels(source: str | Path | BinaryIO, name: str | None, what: str) -> tuple[str, np.ndarray]:
    """The mode and the stored values of the image file or bytes ``source`` (``images.decoded``: a regular file,
    no decompression bomb), a DatasetError naming it (``name``, else the path) as ``what`` when it cannot be
    read."""
    with decoded(source, name, what=what) as image:
        return image.mode, np.asarray(image)


def read_mask(source: str | Path | BinaryIO, lookup: np.ndarray, palette: dict[int, int] | None = None,
              name: str | None = None) -> torch.Tensor:
    """The class ids of the mask file (or bytes) ``source``, int64 ``(H, W)``: the value stored at each pixel (a
    palette ("P") PNG's index, a grey ("L") PNG's level) mapped through ``lookup`` (256 entries, each a class id,
    ``IGNORE_INDEX`` or ``NOT_A_CLASS``); values that name no class are refused, named. An RGB mask is read only
    with a ``palette`` (a colour packed as ``0xRRGGBB`` to the value it stands for: VOC's colour map), a colour
    outside it refused, named; without one an RGB mask is refused, as is any other mode. Errors name ``name``
    (default: the path)."""
    path = name or str(source)
    mode, pixels = _pixels(source, name, "mask")
    if mode == "RGB" and palette is not None:
        values = _by_colour(path, pixels, palette)
    elif mode in ("P", "L"):
        values = pixels
    else:
        raise DatasetError(f"{path}: a mask of mode {mode!r}; expected a palette ('P') or grey ('L') PNG whose "
                           f"values are class ids")
    ids = lookup[values]
    if (ids == NOT_A_CLASS).any():
        bad = np.unique(values[ids == NOT_A_CLASS]).tolist()
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        said = "values {} name" if len(bad) > 1 else "value {} names"
        raise DatasetError(f"{path}: mask {said.format(shown)} no class; expected "
                           f"{_spans(np.flatnonzero(lookup != NOT_A_CLASS))}")
    return torch.from_numpy(ids)


def _by_colour(path: str | Path, pixels: np.ndarray, palette: dict[int, int]) -> np.ndarray:
    """The values an RGB mask's colours stand for in ``palette``; a colour it lacks is refused, named."""
    packed = (pixels[..., 0].astype(np.int32) << 16) | (pixels[..., 1].astype(np.int32) << 8) | pixels[..., 2]
    colours, inverse = np.unique(packed, return_inverse=True)
    unknown = [int(colour) for colour in colours if int(colour) not in palette]
    if unknown:
        red, green, blue = unknown[0] >> 16, (unknown[0] >> 8) & 255, unknown[0] & 255
        more = f" (and {len(unknown) - 1} other colours)" if len(unknown) > 1 else ""
        raise DatasetError(f"{path}: colour ({red}, {green}, {blue}){more} stands for no class; expected the "
                           f"colours of the dataset's colour map, or a palette ('P') PNG of class ids")
    return np.array([palette[int(colour)] for colour in colours], dtype=np.int64)[inverse].reshape(packed.shape)


def _spans(values: np.ndarray) -> str:
    """Sorted integers written as runs: ``0..20, 255``."""
    runs: list[list[int]] = []
    for value in values.tolist():
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ", ".join(str(first) if first == last else f"{first}..{last}" for first, last in runs)


def read_depth(source: str | Path | BinaryIO, name: str | None = None) -> torch.Tensor:
    """The depth map file (or bytes) ``source`` in metres, float32 ``(H, W)``: a 16-bit PNG (mode "I;16" or "I")
    of millimetres (``DEPTH_SCALE``), 0 where there is no depth. Any other image is refused: an 8-bit one cannot
    hold millimetres. Errors name ``name`` (default: the path)."""
    path = name or str(source)
    mode, pixels = _pixels(source, name, "depth map")
    if not (mode == "I" or mode.startswith("I;16")):
        raise DatasetError(f"{path}: a depth map of mode {mode!r}; expected a 16-bit PNG of depth in millimetres")
    return torch.from_numpy(pixels.astype(np.float32) / np.float32(DEPTH_SCALE))


def entry_names(folder: Path, root: Path, folders: bool = False) -> list[str]:
    """The names of the files (or with ``folders``, the sub-folders) of ``folder`` that are not hidden, sorted
    (``folders.entries``: a link leading outside the dataset folder ``root`` refused; a DatasetError naming the
    folder when it cannot be listed)."""
    return sorted(os.fsdecode(name) for _, name, is_dir in entries(os.fsencode(folder), resolved(root))
                  if is_dir == folders)


def stem_pairs(root: Path, images: str, targets: str, kind: str, image_suffix: str = "") -> list[tuple[str, str]]:
    """The files of ``root/images`` (those whose names end in ``image_suffix``), each with the PNG of its stem in
    ``root/targets``, as names relative to ``root`` in the order of the images' names. Two images of one stem are
    refused: one ``kind`` (mask, depth map) cannot be both's."""
    named: dict[str, str] = {}
    for name in entry_names(root / images, root):
        if name.endswith(image_suffix):
            stem = os.path.splitext(name)[0]
            if stem in named:
                raise DatasetError(f"{root / images}: {named[stem]} and {name} share the stem {stem!r}; expected "
                                   f"one image a {kind}")
            named[stem] = name
    return [(f"{images}/{name}", f"{targets}/{stem}.png") for stem, name in named.items()]


def checked_pairs(root: Path, pairs: list[tuple[str, str]], where: Path, kind: str) -> list[tuple[Path, Path]]:
    """``pairs`` of names relative to the dataset folder ``root`` (as listed in ``where``: a list file or a
    folder) as the files they resolve to, once each is known to lie inside ``root`` (links resolved) and to exist;
    a DatasetError names the first that does not. No pair at all is an empty split, refused naming ``where``."""
    if not pairs:
        raise DatasetError(f"{where}: an empty split, no image listed or found; expected images with their {kind}s")
    real = resolved(root)
    checked = []
    for image, target in pairs:
        image_file = within(real, image, DatasetError, "a listed image")
        target_file = within(real, target, DatasetError, f"a listed {kind}")
        if not image_file.is_file():
            raise DatasetError(f"{image_file}: no such image (listed in {where})")
        if not target_file.is_file():
            raise DatasetError(f"{target_file}: no such {kind}; expected the {kind} of {image_file}")
        checked.append((image_file, target_file))
    return checked


def split_folder_pairs(root: Path, split: str, targets: str, kind: str) -> list[tuple[Path, Path]]:
    """The checked pairs (``checked_pairs``) of a folder of split folders: ``root/SPLIT/images/NAME.*`` with
    ``root/SPLIT/{targets}/NAME.png``."""
    images = root / split / "images"
    if not images.is_dir():
        raise DatasetError(f"{images}: no such folder; expected DIR/{split}/images/NAME.* with "
                           f"DIR/{split}/{targets}/NAME.png")
    return checked_pairs(root, stem_pairs(root, f"{split}/images", f"{split}/{targets}", kind), images, kind)


def present_splits(root: Path) -> tuple[str, ...]:
    """The splits of a folder of split folders that have an ``images/`` folder; every split when none has (so
    that opening one says what is missing)."""
    return tuple(split for split in SPLITS if (root / split / "images").is_dir()) or SPLITS


def dense_split(split: str, splits: Sequence[str], read: Callable[[str], DenseDataset], root: str,
                holdout: SplitSpec) -> DenseDataset:
    """``read(split)``; for ``all``, every one of the dataset's own ``splits`` read, one after the other. A dataset
    with training images and no validation split holds ``holdout``'s fraction of them out as ``val`` (the same
    for every seed-equal call), which its ``train`` then lacks, as for classification."""
    if split == ALL:
        return DenseDataset.joined([read(part) for part in splits], f"{root}[{ALL}]")
    if split in ("train", "val") and "val" not in splits and "train" in splits:
        return with_val(read("train"), None, split, holdout)
    return read(split)


def task_of(dataset) -> str:
    """What a dataset's labels are: ``segmentation`` or ``depth`` for a dense one, else ``classification``."""
    return getattr(dataset, "task", "classification")


def with_held_val(splits: tuple[str, ...]) -> tuple[str, ...]:
    """A dataset's splits as a run may ask for them: ``val`` too where it has training images and no validation
    split (held out of them: ``dense_split``)."""
    return splits if "val" in splits or "train" not in splits else (*splits, "val")
