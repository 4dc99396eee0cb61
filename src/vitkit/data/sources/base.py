"""What every source of datasets implements (``Source``), and what a caller asks of one (``ReadOptions``).

A source reads one kind of dataset, named ``PREFIX:PATH`` (``npz:data.npz``) or by a plain name (``mnist``). It
lists the splits a dataset can give, opens one (a map-style ``Dataset`` or a ``ShardedSplit``, which the loaders
of ``pipelines`` take) and describes the dataset (what ``vitkit data info`` prints). Only ``open`` must be
written; the rest follows from it unless a source knows better.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch.utils.data import Dataset

from ..dense import DenseDataset, dense_split, with_held_val
from ..map_style import SplitSpec
from ..shards import ShardedSplit
from ..splits import ALL, SPLITS
from ..survey import describe


@dataclass(frozen=True)
class ReadOptions:
    """How to read a dataset: ``data_dir`` (where a named dataset's files are, or are downloaded to), the
    validation part held out of the training images where a dataset has no such split (``holdout``), and what
    an unusable sample of shards does (``corrupt``: ``fail`` or ``skip``)."""

    data_dir: str | Path | None = None
    holdout: SplitSpec = field(default_factory=SplitSpec)
    corrupt: str = "fail"


class Source:
    """One kind of dataset. ``path`` is what follows the prefix (``data.npz`` of ``npz:data.npz``), or the name
    itself for a named dataset (``mnist``)."""

    argument = "PATH"
    """What follows the prefix, as the help names it (``npz:PATH``)."""
    streamed = False
    """Read as a stream of shards, in an order that depends on the number of workers (see ``shards``)."""
    known_splits: tuple[str, ...] = SPLITS
    """The split names a dataset of this kind may have (checked before anything is read); ``all`` besides."""

    def recognises(self, path: Path) -> int:
        """How surely a bare ``path`` (given without a prefix) is a dataset of this kind: 0 not at all, 1 maybe
        (any folder), 2 by its files; the most sure source is suggested to the user."""
        return 0

    def splits(self, path: str) -> tuple[str, ...]:
        """The splits this dataset can give, held out where need be: by default every known one."""
        return self.known_splits

    def default_split(self, path: str) -> str:
        """The split an evaluation measures when none is asked for: the test split, else the validation split,
        else all of it."""
        return measured_split(self.splits(path))

    def open(self, path: str, split: str, options: ReadOptions) -> Dataset | ShardedSplit:
        """The ``split`` (one of ``known_splits`` or ``all``) of the dataset: images ``(C, H, W)`` uint8 with
        their labels, and the class names in ``.classes``."""
        raise NotImplementedError

    def open_splits(self, path: str, splits: tuple[str, ...], options: ReadOptions) -> dict:
        """Several splits by name, as ``open`` gives each (a source that lists files may list them once for all)."""
        return {split: self.open(path, split, options) for split in splits}

    def describe(self, path: str, options: ReadOptions) -> dict:
        """Split sizes, class names and the images of each class per split (see ``survey.describe``)."""
        return describe(self.open_splits(path, self.splits(path), options))


def measured_split(have: tuple[str, ...]) -> str:
    """What an evaluation measures of a dataset with splits ``have``: test, else val, else all of it."""
    return next((split for split in ("test", "val") if split in have), ALL)


class DenseSource(Source):
    """A dataset of images with per-pixel targets (``data.dense``): ``present`` lists the splits it holds and
    ``read`` reads one; a run may also ask for ``val`` where there is none, held out of ``train`` (``dense_split``)."""

    def present(self, path: str) -> tuple[str, ...]:
        """The splits the dataset holds on disk: by default every known one."""
        return self.known_splits

    def splits(self, path: str) -> tuple[str, ...]:
        return with_held_val(self.present(path))

    def read(self, path: str, split: str) -> DenseDataset:
        """One split the dataset holds."""
        raise NotImplementedError

    def describe(self, path: str, options: ReadOptions) -> dict:
        """The splits the dataset holds (not the validation part a run would hold out), as ``Source.describe``."""
        return describe(self.open_splits(path, self.present(path), options))

    def open(self, path: str, split: str, options: ReadOptions) -> DenseDataset:
        return dense_split(split, self.present(path), lambda part: self.read(path, part), path, options.holdout)
