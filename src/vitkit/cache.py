"""Where vitkit keeps what it can always rebuild (downloaded checkpoints, shard indexes): a leaf module,
so that checkpoints and data agree on one folder without importing each other."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$VITKIT_CACHE``, else ``$XDG_CACHE_HOME/vitkit``, else ``~/.cache/vitkit``."""
    if os.environ.get("VITKIT_CACHE"):
        return Path(os.environ["VITKIT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitkit"
