"""Semantic segmentation datasets as people hold them on disk, read as ``dense.DenseDataset``s (images with masks
of class ids, 255 ignored); nothing is downloaded.

- ``voc:DIR``: PASCAL VOC 2012 as torchvision's ``VOCSegmentation`` reads it: DIR holds ``VOCdevkit/VOC2012`` (or
  is ``VOCdevkit``, or ``VOC2012`` itself), with ``ImageSets/Segmentation/{train,val}.txt`` (one image name a line),
  ``JPEGImages/NAME.jpg`` and ``SegmentationClass/NAME.png``: palette masks whose indices are the 21 classes
  (background first), 255 ignored. A mask saved as RGB is read through VOC's colour map. Splits ``train`` and
  ``val``.
- ``cityscapes:DIR``: as torchvision's ``Cityscapes`` reads it: ``leftImg8bit/SPLIT/CITY/X_leftImg8bit.png`` with
  ``gtFine/SPLIT/CITY/X_gtFine_labelIds.png``; the label ids become the 19 train ids of cityscapesScripts' table,
  every other id ignored. Splits ``train``, ``val`` and ``test``, those present.
- ``ade20k:DIR``: ADE20K's scene parsing benchmark, ``ADEChallengeData2016`` (DIR, or the folder holding it):
  ``images/{training,validation}/NAME.jpg`` with ``annotations/.../NAME.png``; ids 1..150 are the 150 classes
  (0..149), 0 is ignored (mmsegmentation's ``reduce_zero_label``). Splits ``train`` and ``val``.
- ``maskfolder:DIR``: ``DIR/SPLIT/images/NAME.*`` (any image the image reader takes) with ``DIR/SPLIT/masks/NAME.png``
  (grey or palette PNGs of class ids, 255 ignored) and ``DIR/classes.txt``, one class name a line. The splits
  present among ``train``, ``val`` and ``test``.

No split is held out of another: each dataset has the splits its files name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import DatasetError
from ...paths import resolved, within
from ..dense import (IGNORE_INDEX, NOT_A_CLASS, SEGMENTATION, DenseDataset, checked_pairs, entry_names,
                     present_splits, split_folder_pairs, stem_pairs)
from ..listed import list_lines, read_class_names
from ..splits import SPLITS
from .base import DenseSource

VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")
VOC_FOLDERS = ("VOCdevkit/VOC2012", "VOC2012", ".")  # where VOC2012 may lie in DIR, in the order tried

# cityscapesScripts' labels: the label id of each of the 19 classes trained and evaluated, in train-id order;
# every other id (void, parking, rail track, guard rail, bridge, tunnel, polegroup, caravan, trailer) is ignored.
CITYSCAPES_IDS = {"road": 7, "sidewalk": 8, "building": 11, "wall": 12, "fence": 13, "pole": 17, "traffic light": 19,
                  "traffic sign": 20, "vegetation": 21, "terrain": 22, "sky": 23, "person": 24, "rider": 25, "car": 26,
                  "truck": 27, "bus": 28, "train": 31, "motorcycle": 32, "bicycle": 33}
CITYSCAPES_IMAGE, CITYSCAPES_MASK = "_leftImg8bit.png", "_gtFine_labelIds.png"

ADE_FOLDER = "ADEChallengeData2016"
ADE_SPLITS = {"train": "training", "val": "validation"}
ADE_CLASSES = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet", "sidewalk",
    "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water", "painting", "sofa",
    "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk", "rock", "wardrobe", "lamp",
    "bathtub", "railing", "cushion", "base", "box", "column", "signboard", "chest of drawers", "counter", "sand",
    "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path", "stairs", "runway", "case", "pool table",
    "pillow", "screen door", "stairway", "river", "bridge", "bookcase", "blind", "coffee table", "toilet", "flower",
    "book", "hill", "bench", "countertop", "stove", "palm", "kitchen island", "computer", "swivel chair", "boat", "bar",
    "arcade machine", "hovel", "bus", "towel", "light", "truck", "tower", "chandelier", "awning", "streetlight",
    "booth", "television receiver", "airplane", "dirt track", "apparel", "pole", "land", "bannister", "escalator",
    "ottoman", "bottle", "buffet", "poster", "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer",
    "plaything", "swimming pool", "stool", "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle",
    "oven", "ball", "food", "step", "tank", "trade name", "microwave", "pot", "animal", "bicycle", "lake",
    "dishwasher", "screen", "blanket", "sculpture", "hood", "sconce", "vase", "traffic light", "tray", "ashcan", "fan",
    "pier", "crt screen", "plate", "monitor", "bulletin board", "shower", "radiator", "glass", "clock", "flag")
"""The 150 classes of ADE20K's scene parsing benchmark, in id order (mmsegmentation's short names)."""

MAX_MASK_CLASSES = IGNORE_INDEX  # ids 0..254 of an 8-bit mask, 255 being the ignored one


def voc_colour(index: int) -> tuple[int, int, int]:
    """The colour of VOC's colour map for ``index``: its bits dealt to red, green and blue in turn, each colour
    filled from its highest bit down (1 is (128, 0, 0), 255 is (224, 224, 192))."""
    red = green = blue = 0
    for place in range(3):
        red |= (index >> (3 * place) & 1) << (7 - place)
        green |= (index >> (3 * place + 1) & 1) << (7 - place)
        blue |= (index >> (3 * place + 2) & 1) << (7 - place)
    return red, green, blue


VOC_PALETTE = {red << 16 | green << 8 | blue: index for index in (*range(len(VOC_CLASSES)), IGNORE_INDEX)
               for red, green, blue in [voc_colour(index)]}
"""The colours of an RGB VOC mask (packed ``0xRRGGBB``) to the index each stands for: the 21 classes and 255."""


def cityscapes_lookup() -> np.ndarray:
    """Label id to train id: the 19 classes' ids to 0..18, every other value to the ignored 255."""
    lookup = np.full(256, IGNORE_INDEX, dtype=np.int64)
    lookup[list(CITYSCAPES_IDS.values())] = np.arange(len(CITYSCAPES_IDS))
    return lookup


def ade_lookup() -> np.ndarray:
    """ADE20K's stored values to class ids: 1..150 to 0..149, 0 (other) and 255 ignored, 151..254 no class."""
    lookup = np.full(256, NOT_A_CLASS, dtype=np.int64)
    lookup[1:len(ADE_CLASSES) + 1] = np.arange(len(ADE_CLASSES))
    lookup[[0, IGNORE_INDEX]] = IGNORE_INDEX
    return lookup


class Voc(DenseSource):
    """``voc:DIR``."""

    argument = "DIR"
    known_splits = ("train", "val")

    def recognises(self, path: Path) -> int:
        return 2 * any((path / folder / "ImageSets" / "Segmentation").is_dir() for folder in VOC_FOLDERS)

    def read(self, path: str, split: str) -> DenseDataset:
        return read_voc(Path(path), split)


def voc_folder(root: Path) -> Path:
    """The ``VOC2012`` folder of ``root``: ``root/VOCdevkit/VOC2012`` (the folder torchvision's reader takes),
    ``root/VOC2012`` or ``root`` itself, whichever holds ``ImageSets/Segmentation``."""
    for folder in VOC_FOLDERS:
        if (root / folder / "ImageSets" / "Segmentation").is_dir():
            return root / folder
    raise DatasetError(f"{root}: no VOCdevkit/VOC2012/ImageSets/Segmentation; expected the folder "
                       f"torchvision.datasets.VOCSegmentation(DIR) reads, or its VOCdevkit or VOC2012 folder")


def read_voc(root: Path, split: str) -> DenseDataset:
    """The ``train`` or ``val`` split of VOC 2012 at ``root``."""
    folder = voc_folder(root)
    listing = folder / "ImageSets" / "Segmentation" / f"{split}.txt"
    within(resolved(folder), listing.relative_to(folder), DatasetError, "the split list")
    names = []
    for line, fields in enumerate(list_lines(listing, "the VOC split list"), 1):
        if len(fields) != 1:
            raise DatasetError(f"{listing}:{line}: expected one image name a line")
        names.append(fields[0])
    pairs = [(f"JPEGImages/{name}.jpg", f"SegmentationClass/{name}.png") for name in names]
    return DenseDataset(checked_pairs(folder, pairs, listing, "mask"), SEGMENTATION, VOC_CLASSES, f"{folder}[{split}]",
                        palette=VOC_PALETTE)


class Cityscapes(DenseSource):
    """``cityscapes:DIR``."""

    argument = "DIR"

    def recognises(self, path: Path) -> int:
        return 2 * ((path / "leftImg8bit").is_dir() and (path / "gtFine").is_dir())

    known_splits = ("train", "val")  # the public test split's masks hold no class: nothing to measure

    def present(self, path: str) -> tuple[str, ...]:
        return tuple(split for split in self.known_splits if (Path(path) / "leftImg8bit" / split).is_dir()) \
            or self.known_splits

    def read(self, path: str, split: str) -> DenseDataset:
        return read_cityscapes(Path(path), split)


def read_cityscapes(root: Path, split: str) -> DenseDataset:
    """The ``split`` of Cityscapes' fine annotations at ``root``, city by city, each city's images by name."""
    images = root / "leftImg8bit" / split
    if not images.is_dir():
        raise DatasetError(f"{images}: no such folder; expected Cityscapes as torchvision.datasets.Cityscapes(DIR) "
                           f"reads it (DIR/leftImg8bit/{split}/CITY/*{CITYSCAPES_IMAGE})")
    pairs = [(f"leftImg8bit/{split}/{city}/{name}",
              f"gtFine/{split}/{city}/{name.removesuffix(CITYSCAPES_IMAGE)}{CITYSCAPES_MASK}")
             for city in entry_names(images, root, folders=True) for name in entry_names(images / city, root)
             if name.endswith(CITYSCAPES_IMAGE)]
    return DenseDataset(checked_pairs(root, pairs, images, "mask"), SEGMENTATION, list(CITYSCAPES_IDS),
                        f"{root}[{split}]", lookup=cityscapes_lookup())


class Ade20k(DenseSource):
    """``ade20k:DIR``."""

    argument = "DIR"
    known_splits = tuple(ADE_SPLITS)

    def recognises(self, path: Path) -> int:
        return 2 * any((folder / "annotations" / "training").is_dir() for folder in (path / ADE_FOLDER, path))

    def read(self, path: str, split: str) -> DenseDataset:
        return read_ade(Path(path), split)


def read_ade(root: Path, split: str) -> DenseDataset:
    """The ``train`` (``training``) or ``val`` (``validation``) split of ADE20K at ``root``."""
    folder = next((folder for folder in (root / ADE_FOLDER, root) if (folder / "images").is_dir()), None)
    if folder is None:
        raise DatasetError(f"{root}: no {ADE_FOLDER}/images folder; expected {ADE_FOLDER} (images/ and "
                           f"annotations/), or the folder holding it")
    part = ADE_SPLITS[split]
    pairs = stem_pairs(folder, f"images/{part}", f"annotations/{part}", "mask", ".jpg")
    return DenseDataset(checked_pairs(folder, pairs, folder / "images" / part, "mask"), SEGMENTATION, ADE_CLASSES,
                        f"{folder}[{split}]", lookup=ade_lookup())


class MaskFolder(DenseSource):
    """``maskfolder:DIR``."""

    argument = "DIR"

    def recognises(self, path: Path) -> int:
        return 2 * ((path / "classes.txt").is_file() and any((path / split / "masks").is_dir() for split in SPLITS))

    def present(self, path: str) -> tuple[str, ...]:
        return present_splits(Path(path))

    def read(self, path: str, split: str) -> DenseDataset:
        return read_mask_folder(Path(path), split)


def read_mask_folder(root: Path, split: str) -> DenseDataset:
    """The ``split`` of the mask folder ``root``, its images by name."""
    pairs = split_folder_pairs(root, split, "masks", "mask")
    return DenseDataset(pairs, SEGMENTATION, mask_classes(root), f"{root}[{split}]")


def mask_classes(root: Path) -> list[str]:
    """The class names of ``root/classes.txt`` (one a line, escaped as ``classnames`` writes them), at most the
    255 an 8-bit mask can tell apart beside the ignored 255."""
    names = read_class_names(within(resolved(root), "classes.txt", DatasetError, "the class list"))
    if names is None:
        raise DatasetError(f"{root / 'classes.txt'}: no such file; expected the class names, one a line")
    if len(names) > MAX_MASK_CLASSES:
        raise DatasetError(f"{root / 'classes.txt'}: names {len(names)} classes; expected at most {MAX_MASK_CLASSES} "
                           f"(ids 0..254 of an 8-bit mask, 255 ignored)")
    return names
