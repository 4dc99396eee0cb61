"""Datasets kept in shards and read as streams, whatever the shards hold: the sources ``webdataset`` (tar files)
and ``hf`` (parquet / arrow files) say how to index, read and decode one of theirs; this module makes the split
of them and streams it.

A split is a list of shards with their sample counts, found by an index pass that reads the labels only (tar
headers and ``.cls`` members, a label column; no image is decoded), so bad labels are reported up front and
``len()`` is known for schedules; what it finds is cached per shard and shared out over torchrun's ranks
(``index_cache.py``), and labels are checked against the classes on every load. Training reads each shard
front to back:

- the shards are split across ``ranks x workers`` slots (rank-major), a new permutation each epoch,
  so within a slot's epoch every sample of its shards comes once; a shuffle buffer seeded by
  (seed, epoch, slot) mixes samples across its shards;
- slot ``w`` of a rank makes its micro-batches ``w, w + W, ...`` (the DataLoader's round robin over
  ``W`` workers), so the stream position of every slot is a function of the step: resume fast-forwards
  each slot's stream (reading, not decoding) to where the checkpoint's step left it, and the run goes
  on bit for bit with the same number of ranks and workers.

Evaluation reads every shard once, in order, split across workers only.
"""

from __future__ import annotations

import functools
import itertools
import random
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset.filters import _shuffle

from ..errors import DatasetError
from .dense import IGNORE_INDEX
from .index_cache import CLASSIFICATION, ShardIndex, shard_indexes
from .map_style import MAX_UNNAMED_CLASSES
from .loading import (Item, check_corrupt, collate_evaluation, collate_training, sample_seed, seeded_transform,
                      transformed)
from .slots import BatchSlots, SlotBatch
from .transforms import Preset

SHUFFLE_BUFFER = 1000


@dataclass(frozen=True)
class Shard:
    path: str
    size: int  # samples, counted by the index pass
    offset: int  # index of its first sample in the split: samples are numbered for seeding


@dataclass
class ShardedSplit:
    """One split of a sharded dataset: its shards, class names, and how to read a shard.

    ``read(shard)`` yields raw samples ``(key, payload)``; ``decode(shard, key, payload)`` returns
    ``(image uint8 (C, H, W), label)`` or raises ``DatasetError`` naming the shard and key. The label is a class
    index, or for a dense split (``task`` ``segmentation`` or ``depth``) a ``tv_tensors.Mask`` of the image's size,
    as ``dense.DenseDataset`` gives it (with its ``ignore_index``; no depth cap or evaluation crop)."""

    name: str
    shards: list[Shard]
    classes: list[str]
    read: Callable[[Shard], Iterator[tuple[str, object]]]
    decode: Callable[[Shard, str, object], tuple[torch.Tensor, int]]
    class_counts: Counter = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)  # samples found unusable by the index pass
    stand_ins: dict[str, tuple[str, object] | None] = field(default_factory=dict, repr=False)  # see item()
    task: str = CLASSIFICATION
    ignore_index: int = IGNORE_INDEX
    max_depth: float | None = None
    eval_crop: tuple[int, int, int, int] | None = None

    def __len__(self) -> int:
        return sum(shard.size for shard in self.shards)

    def raw(self, shard: Shard) -> Iterator[tuple[str, object]]:
        """The shard's samples, exactly as many as the index counted (a shard cut short by truncation
        ends where its last whole sample did)."""
        count = 0
        for count, sample in enumerate(itertools.islice(self.read(shard), shard.size), start=1):
            yield sample
        if count != shard.size:
            raise DatasetError(f"{shard.path}: {count} samples, but {shard.size} when it was indexed; "
                               f"has the shard changed?")

    def item(self, shard: Shard, key: str, payload: object, corrupt: str, replace: bool
             ) -> tuple[torch.Tensor | None, int, tuple[str, ...]]:
        """Decode one sample. Unusable with ``corrupt='skip'``: in training (``replace``) the first usable
        sample of the same shard stands in (fixed by the data, so resume stays exact); else None."""
        try:
            return *self.decode(shard, key, payload), ()
        except DatasetError as error:
            if corrupt == "fail":
                raise DatasetError(f"{error} (pass --corrupt skip to go on without such samples)") from None
        name = f"{shard.path}:{key}"
        if not replace:
            return None, -1, (name,)
        if shard.path not in self.stand_ins:
            self.stand_ins[shard.path] = self.first_usable(shard)
        if self.stand_ins[shard.path] is None:
            raise DatasetError(f"{shard.path}: no readable sample to stand in for {key}")
        return *self.decode(shard, *self.stand_ins[shard.path]), (name,)

    def first_usable(self, shard: Shard) -> tuple[str, object] | None:
        """The shard's first sample that decodes, as read (``item`` remembers it: the shard is searched once
        per process, not once per unusable sample)."""
        for key, payload in self.read(shard):
            try:
                self.decode(shard, key, payload)
            except DatasetError:
                continue
            return key, payload
        return None


def split_by_slot(shards: list[Shard], slot: int, slots: int, seed: int, epoch: int) -> list[Shard]:
    """The shards that ``slot`` of ``slots`` reads in ``epoch``: a share of that epoch's permutation."""
    return random.Random(seed * 100_003 + epoch).sample(shards, len(shards))[slot::slots]


class TrainingStream(IterableDataset):
    """This rank's training samples from ``start_micro_batch`` on, for a DataLoader with batch size
    ``micro_batch`` and ``num_workers`` workers (see the module doc)."""

    def __init__(self, split: ShardedSplit, preset: Preset, *, seed: int, micro_batch: int, start_micro_batch: int,
                 rank: int = 0, world_size: int = 1, num_workers: int = 0, corrupt: str = "fail",
                 buffer: int = SHUFFLE_BUFFER, reuse_batches: bool = False):
        self.split, self.preset, self.seed, self.micro_batch = split, preset, seed, micro_batch
        self.start, self.rank, self.world_size = start_micro_batch, rank, world_size
        self.workers, self.corrupt, self.buffer = max(1, num_workers), check_corrupt(corrupt), buffer
        slots = world_size * self.workers
        if len(split.shards) < slots:
            raise DatasetError(f"{split.name}: {len(split.shards)} shard(s) cannot feed {world_size} rank(s) x "
                               f"{self.workers} worker(s) without repeating samples; write smaller shards "
                               f"(vitkit data convert --shard-size) or use fewer workers")
        self.classes, self.batch_slots = split.classes, BatchSlots() if reuse_batches else None

    def epoch(self, epoch: int, slot: int, slots: int) -> Iterator[tuple[int, Shard, str, object]]:
        """One epoch of a slot: its shards read in turn, mixed by the seeded shuffle buffer."""
        mine = split_by_slot(self.split.shards, slot, slots, self.seed, epoch)
        samples = ((shard.offset + i, shard, key, payload) for shard in mine
                   for i, (key, payload) in enumerate(self.split.raw(shard)))
        rng = random.Random(f"{self.seed}/{epoch}/{slot}")
        return _shuffle(samples, bufsize=self.buffer, initial=self.buffer, rng=rng)

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        # the DataLoader's round robin starts at worker 0 whatever the start: worker w of a loader begun at
        # micro-batch `start` makes batches start + w, start + w + W, ..., which slot (start + w) % W made
        # in the run from the beginning; that slot had made ceil((start - slot) / W) batches before
        within = (self.start + (info.id if info is not None else 0)) % self.workers
        slots, slot = self.world_size * self.workers, self.rank * self.workers + within
        to_skip = max(0, -(-(self.start - within) // self.workers)) * self.micro_batch
        for epoch in itertools.count():
            length = sum(s.size for s in split_by_slot(self.split.shards, slot, slots, self.seed, epoch))
            if to_skip >= length:  # a whole epoch already trained on: no need to read it
                to_skip -= length
                continue
            for index, shard, key, payload in itertools.islice(self.epoch(epoch, slot, slots), to_skip, None):
                image, label, skipped = self.split.item(shard, key, payload, self.corrupt, replace=True)
                yield *seeded_transform(self.preset, image, label, sample_seed(self.seed, epoch, index)), skipped
            to_skip = 0

    def collate_training(self, items: list[Item]) -> tuple[torch.Tensor | SlotBatch, torch.Tensor, list[str]]:
        return collate_training(self.preset, items, self.batch_slots)


class EvaluationStream(IterableDataset):
    """Every sample of a split once, in shard order; the DataLoader's workers share out the shards."""

    def __init__(self, split: ShardedSplit, preset: Preset, corrupt: str = "fail", reuse_batches: bool = False):
        self.split, self.preset, self.corrupt = split, preset, check_corrupt(corrupt)
        self.classes, self.batch_slots = split.classes, BatchSlots() if reuse_batches else None

    def __len__(self) -> int:
        return len(self.split)

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for shard in self.split.shards[worker::workers]:
            for key, payload in self.split.raw(shard):
                image, label, skipped = self.split.item(shard, key, payload, self.corrupt, replace=False)
                yield *((None, label) if image is None else transformed(self.preset, image, label)), skipped

    def collate(self, items: list[Item]) -> tuple[torch.Tensor | SlotBatch, torch.Tensor]:
        return collate_evaluation(self.preset, items, self.batch_slots)


def label_problem(label: int | None, classes: int) -> str | None:
    """What is wrong with a sample's label for a dataset of ``classes`` classes (None when nothing is)."""
    if label is None or not 0 <= label < classes:
        return f"label {label} out of range 0..{classes - 1}" if classes else f"label {label} is not a class index"
    return None


def indexed_split(name: str, files: list[str], kind: str, index_shard: Callable[[str], ShardIndex],
                  classes: list[str] | None, read: Callable, decode: Callable, corrupt: str) -> ShardedSplit:
    """A split from the index of each of its ``files`` (cached: see ``index_cache``), with their unusable
    samples failing or counted and warned about as ``corrupt`` says. ``classes`` defaults to the labels
    found (a segmentation split must name them; a depth split has none); ``decode(task, number of classes, shard,
    key, payload)``, ``task`` what the shards' samples hold (one kind for the whole split)."""
    check_corrupt(corrupt)
    indexes = shard_indexes(files, kind, index_shard)
    task = split_task(name, files, indexes)
    if task == "depth":
        classes = []
    elif task != CLASSIFICATION and not classes:
        raise DatasetError(f"{name}: masks, but no class names; expected classes.txt (one name a line, line N "
                           f"naming mask value N) in the dataset's folder")
    elif classes is None:
        largest = max((int(index.labels[index.labelled() & (index.labels < MAX_UNNAMED_CLASSES)].max(initial=-1))
                       for index in indexes), default=-1)
        classes = [str(c) for c in range(largest + 1)]
    shards, kept, bad, offset = [], [], [], 0
    for path, index in zip(files, indexes):
        if index.error is not None:
            raise DatasetError(index.error)
        if index.cut is not None:
            if corrupt == "fail":
                raise DatasetError(f"{path}: truncated in {index.cut} (pass --corrupt skip to keep the samples "
                                   f"before it)")
            bad.append(f"{path}: {index.cut}: truncated shard")
        labelled = index.labelled()
        usable = labelled & (index.labels >= 0) & (index.labels < len(classes)) if task == CLASSIFICATION else labelled
        usable[list(index.problems)] = False
        kept.append(index.labels[usable])
        for position in np.flatnonzero(~usable).tolist():  # named one by one: the unusable samples only
            label = int(index.labels[position]) if labelled[position] else None
            problem = index.problems.get(position) or label_problem(label, len(classes))
            if corrupt == "fail":
                raise DatasetError(f"{path}: {index.name(position)}: {problem} (pass --corrupt skip to go on "
                                   f"without it)")
            bad.append(f"{path}: {index.name(position)}: {problem}")
        if not len(index) and corrupt == "fail":
            raise DatasetError(f"{path}: the shard holds no sample")
        if len(index):
            shards.append(Shard(path, len(index), offset))
        offset += len(index)
    labels, numbers = np.unique(np.concatenate([np.zeros(0, dtype=np.int64), *kept]), return_counts=True)
    counts = Counter(dict(zip(labels.tolist(), numbers.tolist()))) if task == CLASSIFICATION else Counter()
    if not shards:
        raise DatasetError(f"{name}: the split holds no usable sample")
    if bad:
        warnings.warn(f"{name}: {len(bad)} unusable sample(s) will be replaced in training and left out of "
                      f"evaluation: {'; '.join(bad[:10])}{' ...' if len(bad) > 10 else ''}", stacklevel=3)
    return ShardedSplit(name, shards, classes, read, functools.partial(decode, task, len(classes)), counts, bad,
                        task=task)


def split_task(name: str, files: list[str], indexes: list[ShardIndex]) -> str:
    """What the samples of a split's shards hold (``ShardIndex.task``): one kind, else the split is refused naming
    a shard of each."""
    kinds = {index.task: path for path, index in zip(files, indexes) if index.error is None}
    if len(kinds) > 1:
        raise DatasetError(f"{name}: shards of different kinds, " + ", ".join(f"{path} of {task} samples" for task, path
                                                                               in sorted(kinds.items()))
                           + "; expected one kind in a split")
    return next(iter(kinds), CLASSIFICATION)


__all__ = ["EvaluationStream", "Shard", "ShardedSplit", "TrainingStream", "indexed_split"]
