"""What the index pass learns about each shard, cached on disk and shared out over torchrun's ranks.

The index pass (tar headers and ``.cls`` members, or a parquet file's label column) reads every shard
before training starts. Its result is kept per shard as an ``.npz`` of arrays (read without pickle) under
``cache_dir()/shard-index``, keyed by the shard's absolute path, size, device, inode, mtime_ns and ctime_ns and
by ``FORMAT_VERSION``: a shard that changed, or an entry that is stale, torn or not what this module writes, is
indexed again, never trusted (a shard rewritten at the same size, its mtime kept by ``cp -p``, has a new ctime). The
cache lies outside the data, so read-only shard folders are fine; an unwritable cache only costs time.

Under an initialised process group (torchrun) each rank indexes every ``world_size``-th shard and the
ranks exchange what they found, so the pass is not repeated on every rank (every rank must then load
the split, as ``vitkit train`` does). Errors travel in the index rather than being raised by the rank
that met them, so that all ranks raise the same error after the exchange instead of leaving the
others waiting.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch.distributed as dist

from ..atomic import atomic_file
from ..cache import cache_dir, cache_entry, sweep_cache
from ..errors import DatasetError, parse_json
from ..paths import open_regular

CLASSIFICATION = "classification"
TASKS = (CLASSIFICATION, "segmentation", "depth")
FORMAT_VERSION = 3  # 1 kept every sample's name and label in JSON; 2 knew image labels only


def _no_samples() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class ShardIndex:
    """One shard as the index pass saw it: its samples' labels in file order (``missing``: the positions of
    those without one, where ``problems`` says why or the label is null), their names as messages give them
    (``sample KEY``; None where the samples are rows, named ``row N`` by position, so nothing per row is kept),
    ``problems`` by position, ``cut`` naming the sample where a truncated file ends, ``error`` why the file
    could not be indexed at all, and ``task``: what its samples' targets are (``classification``: a class index
    each; ``segmentation`` or ``depth``: a mask or depth map each, whose ``labels`` are 0 and mean nothing)."""

    labels: np.ndarray = field(default_factory=_no_samples)
    missing: np.ndarray = field(default_factory=_no_samples)
    names: list[str] | None = None
    problems: dict[int, str] = field(default_factory=dict)
    cut: str | None = None
    error: str | None = None
    task: str = CLASSIFICATION

    @classmethod
    def of(cls, labels: list[int | None], names: list[str] | None = None, problems: dict[int, str] | None = None,
           cut: str | None = None, task: str = CLASSIFICATION) -> "ShardIndex":
        """An index from per-sample labels, None where a sample has none."""
        missing = [position for position, label in enumerate(labels) if label is None]
        known = np.array([0 if label is None else label for label in labels], dtype=np.int64)
        return cls(known, np.array(missing, dtype=np.int64), names, problems or {}, cut, task=task)

    def __len__(self) -> int:
        return len(self.labels)

    def labelled(self) -> np.ndarray:
        """Which samples have a label."""
        mask = np.ones(len(self), dtype=bool)
        mask[self.missing] = False
        return mask

    def name(self, position: int) -> str:
        return f"row {position}" if self.names is None else self.names[position]

    def check(self) -> "ShardIndex":
        """The index itself; ValueError if any part is not what ``of`` or the index pass makes."""
        count, names = len(self.labels), self.names
        if not (self.labels.dtype == np.int64 and self.labels.ndim == 1 and self.missing.dtype == np.int64
                and self.missing.ndim == 1 and bool(((self.missing >= 0) & (self.missing < count)).all())
                and (names is None or (len(names) == count and all(isinstance(name, str) for name in names)))
                and all(type(p) is int and 0 <= p < count and isinstance(t, str) for p, t in self.problems.items())
                and (self.cut is None or isinstance(self.cut, str)) and self.error is None
                and self.task in TASKS):
            raise ValueError("not a shard index")
        return self


def _stamp(path: str, kind: str) -> dict:
    stat = os.stat(path)
    return {"version": FORMAT_VERSION, "kind": kind, "path": os.path.abspath(path), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "dev": stat.st_dev, "ino": stat.st_ino, "ctime_ns": stat.st_ctime_ns}


def _entry(stamp: dict, suffix: str = ".npz") -> Path:
    return cache_entry("shard-index", f"{stamp['kind']}:{stamp['path']}".encode(), suffix)


def _cached(stamp: dict) -> ShardIndex | None:
    """The cached index of the shard ``stamp`` describes, or None when there is none to trust."""
    try:
        with open_regular(_entry(stamp)) as handle, np.load(handle, allow_pickle=False) as arrays:
            about = parse_json(arrays["about"].item())
            if about["stamp"] != stamp:
                return None
            names = arrays["names"].tolist() if "names" in arrays.files else None
            if not np.can_cast(arrays["labels"].dtype, np.int64):
                return None
            index = ShardIndex(arrays["labels"].astype(np.int64), arrays["missing"], names,
                               {int(position): text for position, text in about["problems"].items()}, about["cut"],
                               task=about["task"])
        return index.check()
    except Exception:  # absent, unreadable, torn, empty, of an older format, or someone else's file
        return None


def _narrowest(labels: np.ndarray) -> np.ndarray:
    """``labels`` in the smallest integer type that holds them all (2 bytes each for 1000 classes, not 8)."""
    if not len(labels):
        return labels
    return labels.astype(np.result_type(np.min_scalar_type(labels.min()), np.min_scalar_type(labels.max())))


def _store(stamp: dict, index: ShardIndex) -> str | None:
    """Cache ``index``; the reason it could not be, if so."""
    about = {"stamp": stamp, "problems": {str(position): text for position, text in index.problems.items()},
             "cut": index.cut, "task": index.task}
    names = {} if index.names is None else {"names": np.array(index.names, dtype=str)}
    try:
        with atomic_file(_entry(stamp), "wb") as handle:
            np.savez(handle, about=np.array(json.dumps(about)), labels=_narrowest(index.labels), missing=index.missing,
                     **names)
    except OSError as error:
        return str(error)
    with contextlib.suppress(OSError):  # the entry of format 1, up to 17 bytes a row: no longer read
        _entry(stamp, ".json").unlink(missing_ok=True)
    return None


def _index(path: str, kind: str, index_shard: Callable[[str], ShardIndex]) -> tuple[ShardIndex, str | None]:
    """The shard's index from the cache, else from ``index_shard`` (then cached); and why caching failed."""
    try:
        stamp = _stamp(path, kind)
    except OSError as error:
        return ShardIndex(error=f"{path}: cannot read the shard ({error})"), None
    index = _cached(stamp)
    if index is not None:
        return index, None
    try:
        index = index_shard(path)
    except DatasetError as error:
        return ShardIndex(error=str(error)), None
    return index, _store(stamp, index)


def shard_indexes(files: list[str], kind: str, index_shard: Callable[[str], ShardIndex]) -> list[ShardIndex]:
    """The index of every file (see module doc), in the order of ``files``; ``kind`` names the format
    ``index_shard`` reads, so that its entries are not taken for another format's."""
    rank, ranks = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    sweep_cache("shard-index")
    found, failures = {}, []
    for position in range(rank, len(files), ranks):
        found[position], failure = _index(files[position], kind, index_shard)
        if failure:
            failures.append(failure)
    if failures:
        warnings.warn(f"could not cache the shard index in {cache_dir()} ({failures[0]}); the index pass will run "
                      f"again next time (set VITKIT_CACHE to a writable folder)", stacklevel=3)
    if ranks > 1:
        shares: list[dict[int, ShardIndex] | None] = [None] * ranks
        dist.all_gather_object(shares, found)
        found = {position: index for share in shares for position, index in share.items()}
    return [found[position] for position in range(len(files))]
