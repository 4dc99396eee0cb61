"""The splits a dataset's files and folders name, and seeded random orders and partitions of ``range(size)``:
the held-out splits and the epochs' orders.

A file or folder belongs to the split a word of its name says, as users name them: ``train``, ``val`` or
``validation`` (also ``valid``), ``test``; a name that says two splits is refused, never read into either.

Both follow ``torch.randperm`` of the seed (as earlier versions drew them, so a run resumed across versions
sees the same images). A partition of a large dataset is also kept in the cache as one ``.npy`` file, mapped
when read: drawing one for a million images costs about 10 ms and 17 MB of fresh memory, and a flat image
folder draws two (test, then validation) before its first batch; reading one costs neither. An entry is keyed
by all that decides it (size, held-out count, seed, torch's version), written whole by an atomic rename and
checked for its shape and type when read; a cache that cannot be read or written costs only time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_file
from ..cache import cache_entry, sweep_cache
from ..errors import DatasetError
from ..paths import regular_file

SPLITS = ("train", "val", "test")
"""The splits a dataset can have: ``train``, ``val`` and ``test``."""
SUITE_SPLITS = ("trainval", "train800", "val200", "train800val200")
"""The published splits of the evaluation suite's datasets: Pets' and Flowers-102's ``trainval``, VTAB-1k's
800 training and 200 validation examples and the two together."""
ALL = "all"  # every image of a dataset, whatever split it is in
"""The name of every image of a dataset, whatever split it is in (``--split all``)."""
SPLIT_WORDS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
FORMAT = "kept-then-held-1"  # an entry's layout: kept rows, then held-out rows, each sorted
CACHED_FROM_SIZE = 100_000  # smaller partitions are drawn in under half a millisecond: not worth an entry


def split_of(word: str) -> str | None:
    """The split a word names (``validation`` is ``val``), or None when it names none."""
    return SPLIT_WORDS.get(word.lower())


def named_split(words: Iterable[str], where: str | Path) -> str | None:
    """The one split that ``words`` (of the name of ``where``) say, None when they say none; a DatasetError
    when they say two, which would put one split's images in the other."""
    named = sorted({split for split in map(split_of, words) if split is not None}, key=SPLITS.index)
    if len(named) > 1:
        raise DatasetError(f"{where}: names two splits ({' and '.join(named)}); rename it for the one it holds")
    return named[0] if named else None


def seeded_permutation(size: int, seed: int) -> torch.Tensor:
    """``torch.randperm(size)`` drawn from ``seed``, as int32 where it fits: the same order (the draws do not
    depend on the type; tested), with half the memory to touch."""
    dtype = torch.int32 if size < 2**31 else torch.int64
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def held_out(size: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random partition of ``range(size)`` into (kept, held out), each sorted, the held-out part the
    first ``fraction`` of ``seeded_permutation(size, seed)``; read-only (mapped from the cache when large)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"a held-out fraction is between 0 and 1, not {fraction}")
    count = int(round(size * fraction))
    if size < CACHED_FROM_SIZE:
        return _drawn(size, count, seed)
    entry = cache_entry("held-out", f"{FORMAT} {size} {count} {seed} torch {torch.__version__}".encode(), ".npy")
    with contextlib.suppress(Exception):  # absent, torn or someone else's file: draw it again
        regular_file(entry)  # a FIFO there would block the load
        both = np.load(entry, mmap_mode="r", allow_pickle=False)
        if both.shape == (size,) and both.dtype == (np.int32 if size < 2**31 else np.int64):
            return both[:size - count], both[size - count:]
    kept, held = _drawn(size, count, seed)
    with contextlib.suppress(OSError, RuntimeError):  # no cache folder to be had
        sweep_cache("held-out")
        with atomic_file(entry, "wb") as handle:
            np.save(handle, np.concatenate([kept, held]))
    return kept, held


def _drawn(size: int, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = seeded_permutation(size, seed).numpy()
    held = np.zeros(size, dtype=bool)
    held[order[:count]] = True  # a mask, not two sorts: linear in a million
    parts = np.flatnonzero(~held).astype(order.dtype), np.flatnonzero(held).astype(order.dtype)
    for part in parts:
        part.flags.writeable = False  # as read from the cache: a write would fail on a later run only
    return parts
