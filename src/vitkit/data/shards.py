"""Datasets kept in shards and read as streams: WebDataset tar files (``webdataset:``) and, through
``hf.py``, HF parquet / arrow files (``hf:``).

A split is a list of shards with their sample counts, found by an index pass that reads tar headers
and the small ``.cls`` members only (no image is decoded), so bad labels are reported up front and
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
import io
import itertools
import os
import random
import re
import tarfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import braceexpand
import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset.filters import _shuffle
from webdataset.handlers import ignore_and_stop
from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_expander

from ..classnames import parse_class_list
from ..errors import DatasetError
from ..paths import open_regular, read_capped, reason, regular_file, resolved, within
from .datasets import MAX_UNNAMED_CLASSES, read_image
from .index_cache import ShardIndex, shard_indexes
from .loading import (Item, check_corrupt, collate_evaluation, collate_training, sample_seed,
                      seeded_transform)
from .slots import BatchSlots, SlotBatch
from .splits import ALL, SPLITS, named_split
from .transforms import Preset

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
SHUFFLE_BUFFER = 1000
MAX_SHARDS = 1_000_000  # a brace pattern naming more is taken for a mistake (LAION-5B's shards number ~500k)


@dataclass(frozen=True)
class Shard:
    path: str
    size: int  # samples, counted by the index pass
    offset: int  # index of its first sample in the split: samples are numbered for seeding


@dataclass
class ShardedSplit:
    """One split of a sharded dataset: its shards, class names, and how to read a shard.

    ``read(shard)`` yields raw samples ``(key, payload)``; ``decode(shard, key, payload)`` returns
    ``(image uint8 (C, H, W), label)`` or raises ``DatasetError`` naming the shard and key."""

    name: str
    shards: list[Shard]
    classes: list[str]
    read: Callable[[Shard], Iterator[tuple[str, object]]]
    decode: Callable[[Shard, str, object], tuple[torch.Tensor, int]]
    class_counts: Counter = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)  # samples found unusable by the index pass
    stand_ins: dict[str, tuple[str, object] | None] = field(default_factory=dict, repr=False)  # see item()

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
                yield seeded_transform(self.preset, image, sample_seed(self.seed, epoch, index)), label, skipped
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
                yield (None if image is None else self.preset.per_image(image)), label, skipped

    def collate(self, items: list[Item]) -> tuple[torch.Tensor | SlotBatch, torch.Tensor]:
        return collate_evaluation(self.preset, items, self.batch_slots)


# ---------------------------------------------------------------------------------------- WebDataset tar
def shard_files(spec: str) -> dict[str, list[str]]:
    """``ROOT`` (``train-*.tar``, ``val-*.tar`` or ``validation-*.tar``, ``test-*.tar``: the shards whose names
    say a split) or a brace pattern / single file; a file belongs to the split named by a ``-``/``_``/``.``
    separated word of its name (see ``splits.named_split``), a file of a pattern that names none to train."""
    if os.path.isdir(spec):
        found = {split: [] for split in SPLITS}
        for file in sorted(str(p) for p in Path(spec).glob("*.tar")):
            split = named_split(re.split(r"[-_.]", os.path.basename(file)), file)
            if split is not None:
                found[split].append(file)
        if not any(found.values()):
            raise DatasetError(f"{spec}: no shards (expected {spec}/train-000000.tar, val-..., test-...)")
        root = resolved(spec)
        for file in (file for files in found.values() for file in files):
            within(root, file, DatasetError, "a shard")
            regular_shard(file)
        return found
    if pattern_size(spec) > MAX_SHARDS:
        raise DatasetError(f"{spec}: names more than {MAX_SHARDS:,} shards; expected at most {MAX_SHARDS:,}")
    try:
        files = list(braceexpand.braceexpand(spec))
    except braceexpand.UnbalancedBracesError:
        raise DatasetError(f"{spec}: unbalanced braces; expected a folder, a shard file or a brace pattern such as "
                           f"train-{{000000..000009}}.tar") from None
    missing = [f for f in files if not os.path.lexists(f)]
    if missing:
        raise DatasetError(f"{spec}: {len(missing)} of {len(files)} shard(s) not found, e.g. {missing[0]}")
    for file in files:
        regular_shard(file)
    found = {split: [] for split in SPLITS}
    for file in sorted(files):
        found[named_split(re.split(r"[-_.]", os.path.basename(file)), file) or "train"].append(file)
    return found


def regular_shard(path: str) -> None:
    """Refuse a shard that is not a regular file (a FIFO would block its reader, a device never end)."""
    try:
        regular_file(path)
    except OSError as error:
        raise DatasetError(f"{path}: {error.strerror}; expected a shard file") from None


_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.-?\d+)?\}")


def pattern_size(spec: str) -> int:
    """An upper bound of the names a brace pattern expands to, found without expanding it (``braceexpand``
    builds each numeric range whole, so ``{0..99999999999}`` would fill the memory first)."""
    size = 1
    for low, high in _RANGE.findall(spec):
        size *= abs(int(high) - int(low)) + 1 if max(len(low), len(high)) < 19 else 10**19
    for group in re.findall(r"\{([^{}]*)\}", spec):
        size *= group.count(",") + 1
    return size


def tar_members(tar: tarfile.TarFile, size: int) -> tuple[dict[str, dict[str, tarfile.TarInfo]], str | None]:
    """The shard's files grouped by sample key, and the key at which the file is cut short (None if whole:
    tarfile stops quietly at a missing header, hence the check of every member's extent)."""
    keys: dict[str, dict[str, tarfile.TarInfo]] = {}
    members = iter(tar)
    while True:
        try:
            member = next(members)
        except StopIteration:
            return keys, None
        except tarfile.ReadError:
            if not keys:
                raise
            return keys, next(reversed(keys))  # a header cut short: the sample before it may be too
        key, extension = base_plus_ext(member.name)
        if member.isfile() and key is not None:
            if member.offset_data + member.size > size:
                return keys, key
            keys.setdefault(key, {})[extension.lower()] = member


def tar_index(path: str) -> ShardIndex:
    """The samples of one tar shard and their labels, from its headers and ``.cls`` members."""
    names, labels, problems, cut = [], [], {}, None
    try:
        with open_regular(path) as handle, tarfile.open(fileobj=handle) as tar:
            keys, cut = tar_members(tar, os.fstat(handle.fileno()).st_size)
            if cut is not None:
                keys.pop(cut, None)  # the sample cut in two is not used
            for position, (key, members) in enumerate(keys.items()):
                label = None
                if not any(e in members for e in IMAGE_EXTENSIONS):
                    problems[position] = f"no image (.{'/.'.join(IMAGE_EXTENSIONS)})"
                elif "cls" not in members:
                    problems[position] = "no .cls label"
                else:
                    label, problem = parse_label(tar.extractfile(members["cls"]).read())
                    if problem is not None:
                        problems[position] = problem
                names.append(f"sample {key}")
                labels.append(label)
    except (tarfile.TarError, OSError) as error:
        raise DatasetError(f"{path}: not a readable tar shard ({' '.join(str(error).split())})") from error
    return ShardIndex.of(labels, names, problems, None if cut is None else f"sample {cut}")


def parse_label(text: bytes) -> tuple[int | None, str | None]:
    """The integer of a ``.cls`` member, or None and why there is none (a label must fit the index's int64)."""
    try:
        label = int(text.decode().strip())
    except (UnicodeDecodeError, ValueError):
        return None, f".cls is {text[:20]!r}, not an integer"
    if not -2**63 <= label < 2**63:
        return None, f".cls is {text[:20]!r}, out of range for a class index"
    return label, None


def label_problem(label: int | None, classes: int) -> str | None:
    """What is wrong with a sample's label for a dataset of ``classes`` classes (None when nothing is)."""
    if label is None or not 0 <= label < classes:
        return f"label {label} out of range 0..{classes - 1}" if classes else f"label {label} is not a class index"
    return None


def decode_tar_sample(classes: int, shard: Shard, key: str, sample: dict) -> tuple[torch.Tensor, int]:
    image = next((sample[e] for e in IMAGE_EXTENSIONS if e in sample), None)
    if image is None or "cls" not in sample:
        raise DatasetError(f"{shard.path}: sample {key} lacks an image or its .cls label")
    label, problem = parse_label(sample["cls"])
    problem = problem or label_problem(label, classes)
    if problem is not None:
        raise DatasetError(f"{shard.path}: sample {key}: {problem}")
    return read_image(io.BytesIO(image), f"{shard.path}: sample {key}"), label


def read_tar(shard: Shard) -> Iterator[tuple[str, dict]]:
    """The samples of a tar shard in file order (webdataset groups the members by key); a read error ends
    the stream, which ``ShardedSplit.raw`` then finds short."""
    with open_regular(shard.path) as handle:
        members = tar_file_expander([{"url": shard.path, "stream": handle}], handler=ignore_and_stop)
        for sample in group_by_keys(members, handler=ignore_and_stop):
            yield sample["__key__"], {k.lower(): v for k, v in sample.items() if not k.startswith("__")}


def webdataset_split(spec: str, split: str, corrupt: str = "fail") -> ShardedSplit:
    """The ``split`` of ``webdataset:ROOT`` or ``webdataset:PATTERN`` (see ``shard_files``)."""
    found = shard_files(spec)
    files = sum(found.values(), []) if split == ALL else found[split]
    if not files:
        raise DatasetError(f"{spec}: no {split} shards ({split}-NNNNNN.tar)")
    root = spec if os.path.isdir(spec) else os.path.dirname(files[0])
    listed = os.path.lexists(os.path.join(root, "classes.txt"))  # a broken link is a class list that fails, not none
    names = read_class_names(within(resolved(root), "classes.txt", DatasetError, "the class list")) if listed else None
    return indexed_split(f"{spec}[{split}]", files, "tar", tar_index, names, read_tar, decode_tar_sample, corrupt)


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


def indexed_split(name: str, files: list[str], kind: str, index_shard: Callable[[str], ShardIndex],
                  classes: list[str] | None, read: Callable, decode: Callable, corrupt: str) -> ShardedSplit:
    """A split from the index of each of its ``files`` (cached: see ``index_cache``), with their unusable
    samples failing or counted and warned about as ``corrupt`` says. ``classes`` defaults to the labels
    found; ``decode(classes, shard, key, payload)``."""
    check_corrupt(corrupt)
    indexes = shard_indexes(files, kind, index_shard)
    if classes is None:
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
        usable = labelled & (index.labels >= 0) & (index.labels < len(classes))
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
    counts = Counter(dict(zip(labels.tolist(), numbers.tolist())))
    if not shards:
        raise DatasetError(f"{name}: the split holds no usable sample")
    if bad:
        warnings.warn(f"{name}: {len(bad)} unusable sample(s) will be replaced in training and left out of "
                      f"evaluation: {'; '.join(bad[:10])}{' ...' if len(bad) > 10 else ''}", stacklevel=3)
    return ShardedSplit(name, shards, classes, read, functools.partial(decode, len(classes)), counts, bad)


__all__ = ["EvaluationStream", "Shard", "ShardedSplit", "TrainingStream", "webdataset_split"]
