"""Write-once saves: each is written under a new hidden name beside its target, fsynced, and published by one
rename, so that a reader, or a crash at any moment, finds the previous version or the new one, never a mix.

- A file (``atomic_file``, ``move_into_place``) is written as ``.NAME.XXXX.tmp``, then renamed over ``NAME``.
- A folder (``atomic_directory``), or files a reader opens by fixed names (``move_group_into_place``: an OpenVINO
  ``.xml`` and its ``.bin``), is written under its final names into a folder ``.NAME.XXXX.tmp``, published by
  renaming that folder to ``.NAME.ready``, then moved in, ``NAME`` last (a folder in the way deleted). A kill
  during the moves leaves ``.NAME.ready``, which the next ``sweep`` (by the next writer of ``NAME``, a reader of
  the pair, a resumed run) moves in. Nothing is ever put back.
- A writer holds each temporary by an exclusive ``flock`` on an fd it keeps open, so ``sweep`` acts at once on
  what a killed writer left and never on what a live one is writing. Where the file system has no ``flock`` (NFS
  may refuse it; Lustre without ``-o flock``), sweep can only go by age (``min_age_s``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError

_TRIES = 100  # temporaries swept before they were locked (or publications that came first) before giving up
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<kind>ready|[^.]+\.(?:tmp|old))$")  # .old: older vitkit's; deleted
_TAKEN = (errno.ENOTEMPTY, errno.EEXIST)  # a folder renamed onto a non-empty one


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator:
    """Open a temporary file next to ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _held_temporary(path, folder=False)
    try:
        os.umask(umask := os.umask(0))
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's private 0600 would outlive the rename
        with os.fdopen(fd, mode, closefd=False) as handle:  # fd, and so the lock, lives until renamed or deleted
            yield handle
        move_into_place((Path(tmp), path))
    except BaseException as error:
        remove_tree(Path(tmp))
        name_the_file(error, path)
        raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(path: str | Path, allowed_existing: tuple[str, ...] = ("config.json",)) -> Iterator[Path]:
    """Yield an empty staging directory that becomes ``path`` when the block succeeds. An existing ``path`` is
    replaced only if it is empty or holds one of ``allowed_existing``: an unrelated folder is never deleted."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        entries = {entry.name for entry in path.iterdir()}
        if entries and not entries & set(allowed_existing):
            raise FileExistsError(f"{path} exists and does not look like a checkpoint directory "
                                  f"(no {', '.join(allowed_existing)}); refusing to replace it")
    with _publishing(path) as held:
        (held / path.name).mkdir()
        yield held / path.name


@contextlib.contextmanager
def staging_beside(path: str | Path) -> Iterator[Path]:
    """A held folder beside ``path`` (on its file system, so that what is built there can be renamed into place),
    deleted after the block unless renamed away; what killed writers of ``path`` left is swept first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent, only=path.name)
    with _held_folder(path) as staging:
        yield staging


def move_into_place(*moves: tuple[Path, Path]) -> None:
    """Rename finished files over their targets (same file system), each fsynced first, its folder after."""
    for source, target in moves:
        _fsync(source)
        os.replace(source, target)
        _fsync(target.parent)


def move_group_into_place(*moves: tuple[Path, Path]) -> None:
    """Put finished files, written beside their targets in one folder, in place as one unit (an OpenVINO graph and
    its weights), published as the module says: the last target, the one a reader opens, moved in last."""
    with _publishing(moves[-1][1]) as held:
        for source, target in moves:
            os.replace(source, held / target.name)


@contextlib.contextmanager
def _publishing(target: Path) -> Iterator[Path]:
    """A held folder beside ``target``; what the block puts in it, under final names, is published and moved in."""
    with staging_beside(target) as held:
        try:
            yield held
            for entry in (*held.rglob("*"), held):
                _fsync(entry)
            fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
            try:
                _move_in(fd, _publish(held, target.with_name(f".{target.name}.ready")))
            finally:
                os.close(fd)
        except BaseException as error:
            name_the_file(error, target)
            raise


def _publish(held: Path, ready: Path) -> Path:
    """Rename ``held`` to ``ready``, once an earlier publication there is moved in (its writer, if alive, done)."""
    for _ in range(_TRIES):
        try:
            os.rename(held, ready)
            _fsync(ready.parent)
            return ready
        except OSError as error:
            if error.errno not in _TAKEN:
                raise
        _clear(ready, "ready", wait=True)
    raise OSError(errno.EAGAIN, f"{_TRIES} publications in a row came first", str(ready))


def _move_in(fd: int, ready: Path) -> None:
    """Move the entries of the published folder ``fd`` (at ``ready``, ``.NAME.ready``) in beside it, ``NAME`` last,
    then remove it. By ``fd``: a link swapped in for ``ready`` moves nothing."""
    name = ready.name[1:-len(".ready")]
    for entry in sorted(os.listdir(fd), key=lambda entry: entry == name):
        try:
            os.replace(entry, ready.parent / entry, src_dir_fd=fd)
        except OSError as error:  # a folder cannot be renamed over a non-empty one: that one is deleted first
            if error.errno not in _TAKEN:
                raise
            retire(ready.parent / entry)
            os.replace(entry, ready.parent / entry, src_dir_fd=fd)
    _fsync(ready.parent)
    with contextlib.suppress(OSError):  # gone already, or a later publication's (not empty)
        os.rmdir(ready)


def retire(path: Path) -> None:
    """Delete a directory so that it disappears at once: renamed into a held ``.tmp`` (which ``sweep`` clears,
    should the deletion be cut short), then removed."""
    with _held_folder(path) as doomed:  # not staging_beside: a sweep must not start inside another
        os.replace(path, doomed / path.name)
        _fsync(path.parent)


def sweep(directory: str | Path, only: str | None = None, min_age_s: float = 0) -> list[Path]:
    """Finish what killed writers left in ``directory`` (of ``only`` if named): a ``.ready`` folder is moved in, a
    temporary deleted; only what no live process holds, and is older than ``min_age_s`` (for where a lock may not
    tell: no flock, or locks that other machines do not see). One that cannot be opened (out of fds, another
    user's) is kept. Returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = [entry for entry in sorted(directory.iterdir()) if (match := _TEMPORARY.match(entry.name))
               and only in (None, match["name"]) and _clear(entry, match["kind"], min_age_s)]
    _fsync(directory)
    return removed


def _clear(entry: Path, kind: str, min_age_s: float = 0, wait: bool = False) -> bool:
    """Move in (a ``ready`` folder) or delete the temporary ``entry`` if no live writer holds it (with ``wait``,
    once its writer lets go); whether it is gone."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:  # a link is none of our writers' (the link goes, never what it points to)
        return error.errno == errno.ELOOP and remove_tree(entry)
    try:
        if not _locked(fd, entry, wait, min_age_s):
            return False
        if kind != "ready":
            return remove_tree(entry)
        folder = stat.S_ISDIR(os.fstat(fd).st_mode)  # a file so named is none of ours
        if folder:
            _move_in(fd, entry)
        return folder
    finally:
        os.close(fd)


@contextlib.contextmanager
def _held_folder(path: Path) -> Iterator[Path]:
    """A new folder beside ``path``, held for the block and deleted after it unless renamed away."""
    fd, folder = _held_temporary(path, folder=True)
    try:
        yield Path(folder)
    finally:
        if os.path.lexists(folder):
            remove_tree(Path(folder))
        os.close(fd)


def _held_temporary(path: Path, folder: bool) -> tuple[int, str]:
    """A new temporary ``.NAME.XXXX.tmp`` beside ``path``, and the fd that holds it (the caller closes it); one
    that a sweep removed before it was locked is made again."""
    for _ in range(_TRIES):
        if folder:
            name = tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:  # swept before we could hold it
                continue
        else:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            if _locked(fd, name, wait=True):
                return fd, name
        except BaseException:  # interrupted while waiting for the lock: neither the fd nor the temporary outlives us
            os.close(fd)
            remove_tree(Path(name))
            raise
        os.close(fd)
    raise OSError(errno.EAGAIN, f"{_TRIES} temporaries in a row were swept before they could be locked (is another "
                                "process deleting temporaries in this folder?)", str(path.parent))


def _locked(fd: int, path: str | Path, wait: bool, min_age_s: float = 0) -> bool:
    """Lock ``fd`` (only if free, unless ``wait``) until it is closed; whether it is then ours, still ``path`` (not
    renamed or removed meanwhile) and older than ``min_age_s``. Without flock, the rest is all that is asked."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # no flock on this file system
        pass
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return os.path.samestat(os.fstat(fd), now) and time.time() - now.st_mtime >= min_age_s


def _fsync(path: Path) -> None:
    """Make a file's data, or a folder's renames, durable (where the OS can fsync a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not os.path.isdir(path):
            raise


def remove_tree(path: Path) -> bool:
    """Delete a file or a directory tree; whether it was. A failure is a warning naming it and why (a prune that
    fails is reported, not hidden)."""
    try:
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as error:
        warnings.warn(f"could not delete {path}: {error}; delete it by hand to free the space", stacklevel=2)
        return False
    return True


def name_the_file(error: BaseException, path: Path) -> None:
    """A failed write (ENOSPC, EIO) names no file by itself: name the one being written."""
    if isinstance(error, OSError) and error.errno is not None and error.filename is None:
        raise OSError(error.errno, error.strerror, str(path)) from error


@contextlib.contextmanager
def os_errors(path: str | Path) -> Iterator[None]:
    """Report a failed write as the OSError it is: torch.save raises RuntimeError and safetensors
    SafetensorError when the disk is full or a file size limit is reached."""
    try:
        yield
    except (RuntimeError, SafetensorError) as error:
        raise OSError(f"{path}: could not write ({' '.join(str(error).split())}); is the disk full?") from error
