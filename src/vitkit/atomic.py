"""Atomic writes: build in a temporary sibling, then rename, so a crash never leaves a half-written file
or checkpoint directory behind, and the previous version survives until the new one is complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator:
    """Open a temporary file next to ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's private 0600 would outlive the rename
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | Path, allowed_existing: tuple[str, ...] = ("config.json",)) -> Iterator[Path]:
    """Yield an empty staging directory that becomes ``path`` when the block succeeds.

    An existing ``path`` is replaced only if it is empty or looks like a checkpoint (holds one of
    ``allowed_existing``), so an unrelated directory is never deleted by mistake.
    """
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        entries = {entry.name for entry in path.iterdir()}
        if entries and not entries & set(allowed_existing):
            raise FileExistsError(f"{path} exists and does not look like a checkpoint directory "
                                  f"(no {', '.join(allowed_existing)}); refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
        _replace_directory(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _replace_directory(staging: Path, path: Path) -> None:
    if not path.exists():
        os.replace(staging, path)
        return
    # A directory cannot be renamed over a non-empty one: move the old one aside first, so that at
    # every moment either it or the new one is complete on disk.
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    os.replace(path, old / path.name)
    os.replace(staging, path)
    shutil.rmtree(old, ignore_errors=True)
