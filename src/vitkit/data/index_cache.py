"""What the index pass learns about each shard, cached on disk and shared out over torchrun's ranks.

The index pass (tar headers and ``.cls`` members, or a parquet file's label column) reads every shard
before training starts. Its result is kept per shard as a JSON file under ``cache_dir()/shard-index``,
keyed by the shard's absolute path, size, device, inode, mtime_ns and ctime_ns and by ``FORMAT_VERSION``:
a shard that changed, or an entry that is stale, torn or not what this module writes, is indexed again,
never trusted (a shard rewritten at the same size, its mtime kept by ``cp -p``, has a new ctime). The
cache lies outside the data, so read-only shard folders are fine; an unwritable cache only costs time.

Under an initialised process group (torchrun) each rank indexes every ``world_size``-th shard and the
ranks exchange what they found, so the pass is not repeated on every rank (every rank must then load
the split, as ``vitkit train`` does). Errors travel in the index rather than being raised by the rank
that met them, so that all ranks raise the same error after the exchange instead of leaving the
others waiting.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch.distributed as dist

from ..atomic import atomic_file
from ..cache import cache_dir, cache_entry, sweep_cache
from ..errors import DatasetError

FORMAT_VERSION = 1


@dataclass
class ShardIndex:
    """One shard as the index pass saw it: its samples in file order, named as messages name them (``sample
    KEY``, ``row N``), each with its integer label or None where ``problems`` says why there is none; ``cut``
    names the sample where a truncated file ends, ``error`` why the file could not be indexed at all."""

    names: list[str] = field(default_factory=list)
    labels: list[int | None] = field(default_factory=list)
    problems: dict[str, str] = field(default_factory=dict)
    cut: str | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict) -> "ShardIndex":
        """Rebuild an index from its JSON form; ValueError if anything is not as ``asdict`` wrote it."""
        names, labels, problems, cut = data["names"], data["labels"], data["problems"], data["cut"]
        if not (isinstance(names, list) and isinstance(labels, list) and len(names) == len(labels)
                and all(isinstance(name, str) for name in names)
                and all(label is None or type(label) is int for label in labels)
                and isinstance(problems, dict) and all(isinstance(text, str) for text in problems.values())
                and (cut is None or isinstance(cut, str)) and data["error"] is None):
            raise ValueError("not a shard index")
        return cls(names, labels, problems, cut)


def _stamp(path: str, kind: str) -> dict:
    stat = os.stat(path)
    return {"version": FORMAT_VERSION, "kind": kind, "path": os.path.abspath(path), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "dev": stat.st_dev, "ino": stat.st_ino, "ctime_ns": stat.st_ctime_ns}


def _entry(stamp: dict) -> Path:
    return cache_entry("shard-index", f"{stamp['kind']}:{stamp['path']}".encode(), ".json")


def _cached(stamp: dict) -> ShardIndex | None:
    """The cached index of the shard ``stamp`` describes, or None when there is none to trust."""
    try:
        data = json.loads(_entry(stamp).read_text())
        if not isinstance(data, dict) or data.get("stamp") != stamp:
            return None
        return ShardIndex.from_json(data["index"])
    except (OSError, ValueError, KeyError, TypeError):  # absent, unreadable, torn, or someone else's file
        return None


def _store(stamp: dict, index: ShardIndex) -> str | None:
    """Cache ``index``; the reason it could not be, if so."""
    try:
        with atomic_file(_entry(stamp)) as handle:
            json.dump({"stamp": stamp, "index": asdict(index)}, handle, separators=(",", ":"))
    except OSError as error:
        return str(error)
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
        shares: list[dict | None] = [None] * ranks
        dist.all_gather_object(shares, {position: asdict(index) for position, index in found.items()})
        found = {position: ShardIndex(**index) for share in shares for position, index in share.items()}
    return [found[position] for position in range(len(files))]
