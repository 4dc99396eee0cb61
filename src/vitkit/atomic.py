"""Atomic writes: every save is built under a hidden temporary name beside its target, fsynced, and published by
one rename, so that a reader, or a crash, finds the previous version or the new one, whole, never a mix.

- A file (``atomic_file``, ``move_into_place``) is written as ``.NAME.XXXX.tmp``, then renamed over ``NAME``.
- A folder (``atomic_directory``), or files a reader opens by fixed names (``move_group_into_place``: an OpenVINO
  ``.xml`` and its ``.bin``), is written under its final names into a folder ``.NAME.XXXX.tmp``, which is then
  renamed to ``.NAME.ready``: that rename publishes it. Its entries are then moved in, ``NAME`` last (a folder
  they replace deleted). A kill during the moves leaves ``.NAME.ready`` whole, and ``sweep`` (run by the next
  writer of ``NAME``, a reader of the pair, a resumed run) moves the rest in. Nothing is ever put back.
- Each temporary is held by its writer: an exclusive ``flock`` on an fd it keeps open (closed on exec; vitkit
  never forks while it holds one). ``sweep`` acts only on what it can lock, so what a killed writer left goes at
  once and what a live one is writing is never touched. Where the file system has no ``flock`` (NFS may refuse
  it; Lustre without ``-o flock``), sweep can only go by age (``min_age_s``).
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

# How many temporaries a writer makes, each swept (taken for a killed writer's) before it could lock it, before it
# gives up: one such sweep is a rare race, a hundred in a row a sweeper gone wrong.
_TRIES = 100
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<kind>ready|[^.]+\.(?:tmp|old))$")  # .old: earlier vitkit versions'


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator:
    """Open a temporary file next to ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _held_temporary(path, folder=False)
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
    """Yield an empty staging directory that becomes ``path`` when the block succeeds, published as the module
    says. An existing ``path`` is replaced only if it is empty or looks like a checkpoint (holds one of
    ``allowed_existing``), so an unrelated directory is never deleted by mistake."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        entries = {entry.name for entry in path.iterdir()}
        if entries and not entries & set(allowed_existing):
            raise FileExistsError(f"{path} exists and does not look like a checkpoint directory "
                                  f"(no {', '.join(allowed_existing)}); refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent, only=path.name)
    with _held_folder(path) as held:
        try:
            (held / path.name).mkdir()
            yield held / path.name
            for file in held.rglob("*"):
                if file.is_file():
                    _fsync_file(file)
            fsync_directory(held / path.name)
            _publish(held, path)
        except BaseException as error:
            if held.exists():  # unpublished, so incomplete; a failure to delete it is swept later
                remove_tree(held)
            name_the_file(error, path)
            raise


@contextlib.contextmanager
def staging_beside(path: str | Path) -> Iterator[Path]:
    """A hidden working folder beside ``path`` (on its file system, so that what is built there can be renamed
    into place), deleted after the block; what killed writers of ``path`` left is swept first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent, only=path.name)
    with _held_folder(path) as staging:
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


def move_group_into_place(*moves: tuple[Path, Path]) -> None:
    """Put finished files, written beside their targets in one folder, in place as one unit (an OpenVINO graph and
    its weights): gathered under their targets' names and published as the module says, the last target (the one
    a reader opens) moved in last."""
    last = moves[-1][1]
    with _held_folder(last) as held:
        try:
            for source, target in moves:
                _fsync_file(source)
                os.replace(source, held / target.name)
            _publish(held, last)
        except BaseException:
            if held.exists():
                remove_tree(held)
            raise


def _publish(held: Path, target: Path) -> None:
    """Publish the held folder by renaming it to ``.NAME.ready`` (once an earlier publication of ``target`` is
    moved in: a killed writer's, or a live one's, waited for), then move its entries in."""
    ready = target.with_name(f".{target.name}.ready")
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
        for _ in range(_TRIES):
            try:
                os.rename(held, ready)
                break
            except OSError as error:  # a non-empty .ready is there
                if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            _move_earlier_in(ready, target.name)
        else:
            raise OSError(errno.EAGAIN, f"{_TRIES} publications in a row came first", str(ready))
        fsync_directory(target.parent)
        _move_in(fd, ready, target.name)
    finally:
        os.close(fd)


def _move_earlier_in(ready: Path, name: str) -> None:
    """Move in the publication ``ready`` holds, once its writer, if alive, is done with it."""
    try:
        fd = os.open(ready, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        with contextlib.suppress(OSError):  # without flock: moved in beside its writer, if alive
            fcntl.flock(fd, fcntl.LOCK_EX)
        _move_in(fd, ready, name)
    finally:
        os.close(fd)


def _move_in(fd: int, ready: Path, name: str) -> None:
    """Move the entries of the published folder ``fd`` (at ``ready``) in beside it, ``name`` last, a folder in their
    way deleted; then remove ``ready`` if it is still this one, now empty. By ``fd``: a link swapped in for
    ``ready`` moves nothing."""
    for entry in sorted(os.listdir(fd), key=lambda entry: entry == name):
        try:
            os.replace(entry, ready.parent / entry, src_dir_fd=fd)
        except OSError as error:  # a directory cannot be renamed over a non-empty one
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            retire(ready.parent / entry)
            os.replace(entry, ready.parent / entry, src_dir_fd=fd)
    fsync_directory(ready.parent)
    try:
        os.rmdir(ready)
    except OSError as error:  # already removed, or a later publication took its name
        if error.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
            raise


def retire(path: Path) -> bool:
    """Delete a directory so that it disappears at once: renamed into a held ``.tmp`` first (whose leftovers,
    should the deletion be cut short, ``sweep`` clears), then removed."""
    with _held_folder(path) as doomed:
        os.replace(path, doomed / path.name)
        fsync_directory(path.parent)
        return remove_tree(doomed)


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


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_tree(path: Path) -> bool:
    """Delete a directory tree; on failure warn, naming it and why (a prune that fails is reported, not
    hidden), and return False."""
    try:
        shutil.rmtree(path)
    except OSError as error:
        warnings.warn(f"could not delete {path}: {error}; delete it by hand to free the space", stacklevel=2)
        return False
    return True


def _held_temporary(path: Path, folder: bool) -> tuple[int, str]:
    """A new temporary file or folder beside ``path`` (``.NAME.XXXX.tmp``), and the fd that holds it (the caller
    closes it). One swept before it could be locked is made again."""
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
            if _hold(fd, name):
                return fd, name
        except BaseException:  # interrupted while waiting for the lock: neither the fd nor the temporary outlives us
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                (os.rmdir if folder else os.unlink)(name)
            raise
        os.close(fd)
    raise OSError(errno.EAGAIN, f"{_TRIES} temporaries in a row were swept before they could be locked (is another "
                                "process deleting temporaries in this folder?)", str(path.parent))


@contextlib.contextmanager
def _held_folder(path: Path) -> Iterator[Path]:
    """A new held folder beside ``path`` for the block, removed if the block fails while it is still empty."""
    fd, folder = _held_temporary(path, folder=True)
    try:
        yield Path(folder)
    except BaseException:
        with contextlib.suppress(OSError):  # not empty: what it holds is for the block to keep or delete
            os.rmdir(folder)
        raise
    finally:
        os.close(fd)


def _hold(fd: int, name: str) -> bool:
    """Lock ``fd`` until it is closed; False if a sweep removed ``name`` before the lock was ours. True where the
    file system has no flock: the temporary is then unguarded, and sweep goes by age."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(name))
    except FileNotFoundError:
        return False


def sweep(directory: str | Path, only: str | None = None, min_age_s: float = 0) -> list[Path]:
    """Finish what killed writers left in ``directory`` (of ``only`` if named): a published ``.ready`` folder is moved
    in, an unpublished temporary deleted. Only what no live process holds and is older than ``min_age_s`` (set
    where the lock may not tell: a file system without flock, or whose locks other machines do not see); one that
    cannot be opened (out of fds, another user's) is kept. Returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in sorted(directory.iterdir()):
        match = _TEMPORARY.match(entry.name)
        if match and only in (None, match["name"]) and _clear(entry, match, min_age_s):
            removed.append(entry)
    fsync_directory(directory)
    return removed


def _clear(entry: Path, match: re.Match, min_age_s: float) -> bool:
    """Move in or delete the temporary ``entry`` if no live writer holds it; whether it is gone."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:  # a link is none of our writers' (the link goes, never what it points to)
        return error.errno == errno.ELOOP and _unlink(entry)
    try:
        if not _abandoned(entry, fd, min_age_s):
            return False
        folder = stat.S_ISDIR(os.fstat(fd).st_mode)
        if match["kind"] != "ready":
            return remove_tree(entry) if folder else _unlink(entry)
        try:
            return folder and _move_in(fd, entry, match["name"]) is None
        except OSError as error:
            warnings.warn(f"could not move {entry} in: {error}; the next sweep of {entry.parent} will", stacklevel=3)
            return False
    finally:
        os.close(fd)


def _abandoned(entry: Path, fd: int, min_age_s: float) -> bool:
    """Whether no live writer holds ``entry``: its lock was free, and is now ours until ``fd`` is closed (or the
    file system has no flock), ``fd`` is still ``entry`` (not renamed by its writer meanwhile), and it is older
    than ``min_age_s``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # no flock on this file system
        pass
    try:
        now = entry.lstat()
    except FileNotFoundError:  # its writer finished meanwhile, or another sweep removed it
        return False
    return os.path.samestat(os.fstat(fd), now) and time.time() - now.st_mtime >= min_age_s


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as error:
        warnings.warn(f"could not delete {path}: {error}", stacklevel=3)
        return False
    return True
