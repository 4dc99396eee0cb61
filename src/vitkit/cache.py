"""Where vitkit keeps what it can always rebuild (downloaded checkpoints, shard indexes): a leaf module,
so that checkpoints and data agree on one folder without importing each other."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from .atomic import sweep

# A cache temporary is swept only once this old, even when no lock is held on it: where the file system has no
# flock, or locks only for its own machine (NFS mounted with local_lock=flock, a cluster's shared ~/.cache), a free
# lock does not prove its writer dead. A killed writer's then costs disk for an hour; a live one's is never lost.
KILLED_WRITER_S = 3600


def cache_dir() -> Path:
    """``$VITKIT_CACHE``, else ``$XDG_CACHE_HOME/vitkit``, else ``~/.cache/vitkit``."""
    if os.environ.get("VITKIT_CACHE"):
        return Path(os.environ["VITKIT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitkit"


def cache_entry(kind: str, key: bytes, suffix: str) -> Path:
    """Where the cache keeps ``kind``'s entry for ``key`` (a path, usually): ``cache_dir()/kind/<hash><suffix>``."""
    return cache_dir() / kind / f"{hashlib.sha256(key).hexdigest()[:32]}{suffix}"


def sweep_cache(kind: str) -> None:
    """Clear what killed writers left in ``kind``'s folder over ``KILLED_WRITER_S`` ago; the temporaries of writers
    still at work (torchrun's ranks, other runs) stay, however old. A cache is only ever worth time: failures are
    ignored."""
    with contextlib.suppress(OSError, RuntimeError):
        sweep(cache_dir() / kind, min_age_s=KILLED_WRITER_S)
