"""Datasets by name, each read by its source (``sources.SOURCES``): what callers ask for (``load_dataset``,
``load_splits``, ``dataset_info``), put in front of the sources so that none of them imports another.

The names: the embedded ``digits``, torchvision's MNIST / Fashion-MNIST / CIFAR, arrays in ``.npz`` files,
``imagefolder:PATH`` (listed, decoded on access), the sharded ``webdataset:`` and ``hf:``, and the evaluation
suite's ``imagenet:``, ``pets:``, ``flowers102:`` and ``vtab:``; the dense sets, segmentation's ``voc:``,
``cityscapes:``, ``ade20k:`` and ``maskfolder:`` and depth's ``nyu:`` and ``depthfolder:``.

Every dataset yields ``(image, label)`` with the image a uint8 ``(C, H, W)`` tensor and keeps its
class names in ``.classes``; a dense set's label is a ``tv_tensors.Mask`` of the image's size (``data.dense``). Splits are ``train``, ``val`` and ``test``; a dataset without a
validation (or test) split gets one held out of its training images, the same for every seed-equal
call, so a run's validation images never leak into its training images. ``all`` is every image of the
dataset, whatever its split: what a folder of images that names no split holds.
"""

from __future__ import annotations

import difflib
import warnings
from pathlib import Path

from ..errors import ConfigError, DatasetError, DatasetNameError
from . import images, map_style
from .map_style import SplitSpec
from .sources import SOURCES, ReadOptions, Source, imagefolder, named
from .splits import ALL
from .survey import unreadable_images

STREAMED = tuple(prefix for prefix, source in SOURCES.items() if source.streamed)
"""Dataset prefixes read as streams of shards, whose order depends on the number of workers."""
_FORMS = [f"{name}{source.argument}" if name.endswith(":") else name for name, source in SOURCES.items()]
DATASET_FORMS = f"{', '.join(_FORMS[:-1])} or {_FORMS[-1]}"


def source_of(name: str) -> tuple[Source, str]:
    """The source that reads dataset ``name`` and what it is told (the path after ``KIND:``, or the name);
    see ``dataset_name``."""
    name = dataset_name(name)
    kind, colon, path = name.partition(":")
    return (SOURCES[f"{kind}:"], path) if colon else (SOURCES[name], name)


def load_dataset(name: str, split: str, data_dir: str | Path | None = None,
                 spec: SplitSpec | None = None, corrupt: str = "fail"):
    """The ``split`` of dataset ``name`` (see module doc): a map-style ``Dataset``, or for sharded data
    (``webdataset:``, ``hf:``) a ``shards.ShardedSplit``, whose index pass applies ``corrupt`` to the
    unusable samples it finds."""
    source, path = source_of(name)
    return source.open(path, checked_split(source, split, name), ReadOptions(data_dir, spec or SplitSpec(), corrupt))


def load_splits(name: str, splits: tuple[str, ...], data_dir: str | Path | None = None,
                spec: SplitSpec | None = None, corrupt: str = "fail") -> dict:
    """Several splits of dataset ``name`` (as :func:`load_dataset` gives each), its folders listed once for
    all of them rather than once per split."""
    source, path = source_of(name)
    return source.open_splits(path, tuple(checked_split(source, split, name) for split in splits),
                              ReadOptions(data_dir, spec or SplitSpec(), corrupt))


def dataset_info(name: str, data_dir: str | Path | None = None, spec: SplitSpec | None = None,
                 corrupt: str = "fail") -> dict:
    """What ``vitkit data info`` prints of dataset ``name``: its class names and, for each of its splits, the
    images and the images of each class (and for shards their count and the unusable samples); nothing is
    decoded."""
    source, path = source_of(name)
    return source.describe(path, ReadOptions(data_dir, spec or SplitSpec(), corrupt))


def every_split(name: str, data_dir: str | Path | None = None, val_fraction: float = 0.1,
                corrupt: str = "fail") -> dict[str, object]:
    """Every split dataset ``name`` can give (``split_names``), those it lacks held out of its training images
    (``val_fraction`` of them)."""
    return load_splits(name, split_names(name), data_dir, SplitSpec(val_fraction), corrupt)


def verify_dataset(name: str, data_dir: str | Path | None = None, num_workers: int = 0) -> list[str]:
    """Decode every image of dataset ``name`` once, in ``num_workers`` processes; the names of those that fail
    (what ``vitkit data verify`` lists)."""
    return unreadable_images(load_dataset(name, ALL, data_dir, corrupt="skip"), num_workers)


def split_names(name: str) -> tuple[str, ...]:
    """The splits dataset ``name`` can give: every one, held out where need be, except for shards, which
    have the splits their files name."""
    source, path = source_of(name)
    return source.splits(path)


def default_split(name: str) -> str:
    """The split an evaluation of dataset ``name`` measures when none is asked for: its own test split, else
    its own validation split (ImageNet's ``train/`` + ``val/``), else all of it: a folder of images that names
    no split is the user's to measure whole, not a part held out of it."""
    source, path = source_of(name)
    return source.default_split(path)


def checked_split(source: Source, split: str, name: str = "the dataset") -> str:
    """``split``, when datasets of ``source``'s kind may have it (or it is ``all``); else a ConfigError (a
    request the dataset cannot meet: exit 2) naming dataset ``name`` and its splits."""
    if split not in (*source.known_splits, ALL):
        raise ConfigError(f"{name} has no {split} split; expected one of {', '.join((*source.known_splits, ALL))}")
    return split


def dataset_name(name: str) -> str:
    """``name`` as ``load_dataset`` knows it: a named dataset in any spelling (``cifar-10``, ``CIFAR_10``:
    ``cifar10``; ``fashion_mnist``, ``fashionmnist``: ``fashion-mnist``) or ``KIND:PATH``; anything else is
    refused with what was probably meant (``data.npz``: ``npz:data.npz``)."""
    kind, colon, path = name.partition(":")
    if colon and f"{kind}:" in SOURCES:
        if not path:  # an empty path would read the working folder
            raise DatasetError(f"dataset {name!r}: expected a path after '{kind}:' ({kind}:PATH)")
        return name
    named = [known for known in SOURCES if not known.endswith(":")]
    squashed = {known.replace("-", ""): known for known in named}
    known = squashed.get(name.lower().replace("-", "").replace("_", ""))
    if known:
        return known
    guess = _prefixed(Path(name)) or next(iter(difflib.get_close_matches(name.lower(), named)), None)
    hint = f"; did you mean {guess}?" if guess else ""
    raise DatasetNameError(f"unknown dataset {name!r}: expected {DATASET_FORMS}{hint}")


def _prefixed(path: Path) -> str | None:
    """The ``KIND:PATH`` a bare path most likely meant: that of the source surest it is one of its own (an .npz
    file, a folder of .tar shards or of parquet files, another folder: of class folders)."""
    sure, prefix = max(((source.recognises(path), prefix) for prefix, source in SOURCES.items()
                        if prefix.endswith(":")), key=lambda found: found[0])
    return f"{prefix}{path}" if sure else None


# Names this module held before the sources had modules of their own: still read here for one release, with a
# DeprecationWarning naming their home.
MOVED = {"ArrayDataset": map_style, "FileDataset": map_style, "MAX_UNNAMED_CLASSES": map_style,
         "read_image": images, "MAX_PIXELS": images, "scan_folder": imagefolder, "split_folders": imagefolder,
         "default_data_dir": named, "TORCHVISION": named}


def __getattr__(name: str):
    if name in MOVED:
        home = MOVED[name]
        warnings.warn(f"vitkit.data.datasets.{name} is deprecated; use {home.__name__}.{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(home, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
