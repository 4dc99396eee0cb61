"""Atomic writes: build in a temporary sibling, then rename, so a crash never leaves a half-written file
or checkpoint directory behind, and the previous version survives until the new one is complete.

Every file is fsynced before its rename and the parent directory after it, so that the rename cannot
reach the disk before the data (a power cut then leaves the old version, never an empty file).
Temporaries are hidden siblings named ``.NAME.XXXX.tmp`` (being written, or being deleted) and
``.NAME.XXXX.old`` (a previous version moved aside while its replacement is renamed in). Each is held by its
writer for its whole life: an exclusive ``flock`` on an fd the writer keeps open (the file's own, or the
folder opened read-only). ``sweep`` clears only the temporaries whose lock it can take, so a live writer's
are never touched, however slow it is, and those of a process killed mid-write (whose locks died with it)
go as soon as the directory is next swept. Where the file system has no ``flock`` (it raises; NFS refuses an
exclusive lock on a folder or a file opened read-only), sweep cannot tell the two apart and goes by age, as
its caller says. A lock belongs to the open file, which a forked child shares: none of vitkit's writers forks
while it holds one, and the fds are closed on exec.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator:
    """Open a temporary file next to ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _held_file(path)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's private 0600 would outlive the rename
        with os.fdopen(fd, mode, closefd=False) as handle:  # fd, and so the lock, lives until renamed or deleted
            yield handle
            handle.flush()
            os.fsync(fd)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        name_the_file(error, path)
        raise
    finally:
        os.close(fd)


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
    with _held_folder(path, "tmp") as staging:
        try:
            os.chmod(staging, 0o777 & ~_umask())
            yield staging
            for file in staging.rglob("*"):
                if file.is_file():
                    _fsync_file(file)
            fsync_directory(staging)
            _replace_directory(staging, path)
        except BaseException as error:
            if staging.exists():  # what the block wrote is incomplete; a failure to delete it is swept later
                remove_tree(staging)
            name_the_file(error, path)
            raise


@contextlib.contextmanager
def staging_beside(path: str | Path) -> Iterator[Path]:
    """A hidden working folder beside ``path`` (on its file system, so that what is built there can be renamed
    into place with :func:`move_into_place`), deleted after the block. It is named as ``sweep`` knows
    (``.NAME.XXXX.tmp``), and the leftovers of earlier writers of ``path`` that were killed are swept first (those
    of writers still at work are not)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent, only=path.name)
    with _held_folder(path, "tmp") as staging:
        try:
            yield staging
        finally:
            remove_tree(staging)


def move_into_place(*moves: tuple[Path, Path]) -> None:
    """Put finished files, written beside their targets (same file system), in place: each fsynced, then
    renamed in the given order, then the directories fsynced. No file is copied or read back."""
    for source, _ in moves:
        _fsync_file(source)
    for source, target in moves:
        os.replace(source, target)
    for parent in {target.parent for _, target in moves}:
        fsync_directory(parent)


def name_the_file(error: BaseException, path: Path) -> None:
    """A failed write (ENOSPC, EIO) names no file by itself: name the one being written."""
    if isinstance(error, OSError) and error.errno is not None and error.filename is None:
        raise OSError(error.errno, error.strerror, str(path)) from error


def _replace_directory(staging: Path, path: Path) -> None:
    if not path.exists():
        os.replace(staging, path)
        fsync_directory(path.parent)
        return
    # A directory cannot be renamed over a non-empty one: move the old one aside first, so that at
    # every moment either it or the new one is complete on disk (``sweep`` puts it back if a crash
    # comes between the two renames; never while we live and hold it).
    with _held_folder(path, "old") as old:
        os.replace(path, old / path.name)
        os.replace(staging, path)
        fsync_directory(path.parent)
        remove_tree(old)


@contextlib.contextmanager
def os_errors(path: str | Path) -> Iterator[None]:
    """Report a failed write as the OSError it is: torch.save raises RuntimeError and safetensors
    SafetensorError when the disk is full or a file size limit is reached."""
    try:
        yield
    except (RuntimeError, SafetensorError) as error:
        raise OSError(f"{path}: could not write ({' '.join(str(error).split())}); is the disk full?") from error


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_directory(path: Path) -> None:
    """Make the renames and deletions in directory ``path`` durable (a no-op where the OS cannot)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to fsync a directory; the rename itself stands
        pass
    finally:
        os.close(fd)


def remove_tree(path: Path) -> bool:
    """Delete a directory tree; on failure warn, naming it and why (a prune that fails is reported, not
    hidden), and return False."""
    try:
        shutil.rmtree(path)
    except OSError as error:
        warnings.warn(f"could not delete {path}: {error}; delete it by hand to free the space", stacklevel=2)
        return False
    return True


def retire(path: Path) -> bool:
    """Delete a directory so that it disappears at once: renamed into a hidden ``.tmp`` first (whose leftovers,
    should the deletion be cut short, ``sweep`` clears; an ``.old`` would be put back, half deleted), then removed."""
    with _held_folder(path, "tmp") as doomed:
        os.replace(path, doomed / path.name)
        fsync_directory(path.parent)
        return remove_tree(doomed)


def _held_file(path: Path) -> tuple[int, str]:
    """A new temporary file beside ``path``, named as ``sweep`` knows, and its fd, which holds it."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        if _hold(fd, tmp):
            return fd, tmp
        os.close(fd)


@contextlib.contextmanager
def _held_folder(path: Path, kind: str) -> Iterator[Path]:
    """A new hidden folder beside ``path``, named as ``sweep`` knows (``.NAME.XXXX.kind``), held for the block."""
    while True:
        folder = tempfile.mkdtemp(prefix=f".{path.name}.", suffix=f".{kind}", dir=path.parent)
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:  # swept before we could hold it
            continue
        if _hold(fd, folder):
            break
        os.close(fd)
    try:
        yield Path(folder)
    finally:
        os.close(fd)


def _hold(fd: int, name: str) -> bool:
    """Lock ``fd`` exclusively until it is closed, telling ``sweep`` that a live writer holds the temporary
    ``name``. False if a sweep took it for a killed writer's and removed it before the lock was ours: make
    another. Where the file system has no flock, True: the temporary is left unguarded (sweep goes by age)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(name))
    except FileNotFoundError:
        return False


_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[^.]+\.(?P<kind>tmp|old)$")


def sweep(directory: str | Path, only: str | None = None, min_age_s: float = 0) -> list[Path]:
    """Clear the temporaries that killed writers left in ``directory`` (those of ``only`` if named): those no
    live process holds. One that cannot be locked (a file system without flock) goes once older than
    ``min_age_s``, which callers set where other processes may be writing there now. A previous version
    moved aside whose replacement never arrived is put back first. Returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in sorted(directory.iterdir()):
        match = _TEMPORARY.match(entry.name)
        if not match or (only is not None and match["name"] != only):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:  # its writer finished meanwhile
            continue
        except OSError:  # a link, or unreadable: it cannot be locked
            fd = None
        try:
            if not _abandoned(entry, fd, min_age_s):
                continue
            moved_aside = entry / match["name"]
            target = directory / match["name"]
            if match["kind"] == "old" and moved_aside.is_dir() and not target.exists():
                os.replace(moved_aside, target)
            if remove_tree(entry) if entry.is_dir() and not entry.is_symlink() else _unlink(entry):
                removed.append(entry)
        finally:
            if fd is not None:
                os.close(fd)
    fsync_directory(directory)
    return removed


def _abandoned(entry: Path, fd: int | None, min_age_s: float) -> bool:
    """Whether no live writer holds ``entry``: its lock was free, and is now ours until ``fd`` is closed; where
    it cannot be locked, whether it is older than ``min_age_s``."""
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError:  # no flock on this file system
            pass
    try:
        return time.time() - entry.lstat().st_mtime >= min_age_s
    except FileNotFoundError:  # its writer finished meanwhile
        return False


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as error:
        warnings.warn(f"could not delete {path}: {error}", stacklevel=3)
        return False
    return True
