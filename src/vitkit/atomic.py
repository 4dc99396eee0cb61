"""Atomic writes: build in a temporary sibling, then rename, so a crash never leaves a half-written file
or checkpoint directory behind, and the previous version survives until the new one is complete.

Every file is fsynced before its rename and the parent directory after it, so that the rename cannot
reach the disk before the data (a power cut then leaves the old version, never an empty file).
Temporaries are hidden siblings named ``.NAME.XXXX.tmp`` (being written, or being deleted) and
``.NAME.XXXX.old`` (a previous version moved aside while its replacement is renamed in). Each is held by its
writer for its whole life: an exclusive ``flock`` on an fd the writer keeps open (the file's own, or the
folder opened read-only). ``sweep`` clears only the temporaries whose lock it can take, so a live writer's
are never touched, however slow it is, and those of a process killed mid-write (whose locks died with it)
go as soon as the directory is next swept (or once as old as its caller asks). Where the file system has no
``flock`` (it raises; NFS refuses an exclusive lock on a folder or a file opened read-only), sweep cannot tell
the two apart and goes by age alone: there a sweep with ``min_age_s=0`` deletes live writers' temporaries too.
A lock belongs to the open file, which a forked child shares: none of vitkit's writers forks
while it holds one, and the fds are closed on exec.
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator:
    """Open a temporary file next to ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _held_temporary(path, "tmp", folder=False)
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
    of writers still at work are kept only where the file system has ``flock``)."""
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


GROUP_FILE = ".group"  # in an ``.old`` folder of a group of files: the names of the group, one a line


def move_group_into_place(*moves: tuple[Path, Path]) -> None:
    """Put finished files, written beside their targets in one folder, in place as one unit (an OpenVINO graph and
    its weights): the previous versions are hard-linked into a held ``.old`` folder named after the last target,
    with the group's names, then the new files renamed in, in order, then the folder dropped. A kill between two
    renames leaves that folder, from which ``sweep`` puts the whole previous group back (and takes away the new
    files of a group that had no previous version): a reader finds the old group or the new one, never a mix."""
    for source, _ in moves:
        _fsync_file(source)
    last = moves[-1][1]
    with _held_folder(last, "old") as old:
        for _, target in moves:
            if target.exists():
                os.link(target, old / target.name)
        (old / GROUP_FILE).write_text("".join(f"{target.name}\n" for _, target in moves))
        _fsync_file(old / GROUP_FILE)
        fsync_directory(old)
        for source, target in moves:
            os.replace(source, target)
        fsync_directory(last.parent)
        _drop_old(old, last)


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
    # comes between the two renames; never while we live and hold it). It is deleted as a ``.tmp`` (the held
    # folder renamed, so nothing new is made on a full disk), so that a deletion cut short leaves nothing that
    # ``sweep`` would put back half deleted.
    with _held_folder(path, "old") as old:
        os.replace(path, old / path.name)
        os.replace(staging, path)
        fsync_directory(path.parent)
        _drop_old(old, path)


def _drop_old(old: Path, path: Path) -> None:
    """Delete the held ``.old`` folder of ``path`` once the new version stands: renamed to a ``.tmp`` first (still
    held: the lock is the folder's, whatever its name), so that a deletion cut short leaves nothing that ``sweep``
    would put back half deleted."""
    doomed = old.with_suffix(".tmp")
    try:
        os.replace(old, doomed)
    except OSError as error:  # the new version stands; the old one waits for the next sweep
        warnings.warn(f"could not delete {old}: {error}; the next sweep of {path.parent} will", stacklevel=4)
        return
    fsync_directory(path.parent)
    remove_tree(doomed)


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


# How many temporaries a writer makes, each swept (taken for a killed writer's) before it could hold it, before
# it gives up: one such sweep is a rare race, a hundred in a row a sweeper gone wrong.
_TRIES = 100


def _held_temporary(path: Path, kind: str, folder: bool) -> tuple[int, str]:
    """A new temporary file or folder beside ``path``, named as ``sweep`` knows (``.NAME.XXXX.kind``), and the fd
    that holds it (the caller closes it)."""
    for _ in range(_TRIES):
        if folder:
            name = tempfile.mkdtemp(prefix=f".{path.name}.", suffix=f".{kind}", dir=path.parent)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:  # swept before we could hold it
                continue
        else:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".{kind}", dir=path.parent)
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
def _held_folder(path: Path, kind: str) -> Iterator[Path]:
    """A new hidden folder beside ``path``, named as ``sweep`` knows (``.NAME.XXXX.kind``), held for the block, and
    removed if the block fails while it is still empty."""
    fd, folder = _held_temporary(path, kind, folder=True)
    try:
        yield Path(folder)
    except BaseException:
        with contextlib.suppress(OSError):  # not empty: what it holds is for the block to keep or delete
            os.rmdir(folder)
        raise
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
    live process holds and older than ``min_age_s``, which callers set where the lock may not tell (a file system
    without flock, or whose locks other machines do not see). A previous version moved aside whose replacement
    never arrived is put back first. One that cannot be opened (out of fds, another user's) is kept: it may be a
    live writer's. Returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for entry in sorted(directory.iterdir()):
            match = _TEMPORARY.match(entry.name)
            if match and only in (None, match["name"]) and _clear(entry, match, min_age_s, directory_fd):
                removed.append(entry)
    finally:
        os.close(directory_fd)
    fsync_directory(directory)
    return removed


def _clear(entry: Path, match: re.Match, min_age_s: float, directory_fd: int) -> bool:
    """Remove the temporary ``entry`` if no live writer holds it (putting back the version an ``.old`` holds);
    whether it was removed."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:  # a link is none of our writers' (the link goes, never what it points to)
        return error.errno == errno.ELOOP and _unlink(entry)
    try:
        if not _abandoned(entry, fd, min_age_s):
            return False
        folder = stat.S_ISDIR(os.fstat(fd).st_mode)
        if folder and match["kind"] == "old":
            group = _group_names(fd)
            put_back = _put_back_group(group, fd, directory_fd) if group else _put_back(match["name"], fd, directory_fd)
            if not put_back:
                return False
        return remove_tree(entry) if folder else _unlink(entry)
    finally:
        os.close(fd)


def _abandoned(entry: Path, fd: int, min_age_s: float) -> bool:
    """Whether no live writer holds ``entry``: its lock was free, and is now ours until ``fd`` is closed (or the
    file system has no flock), ``fd`` is still ``entry`` (not renamed into place by its writer meanwhile), and it
    is older than ``min_age_s``."""
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


def _put_back(name: str, old_fd: int, directory_fd: int) -> bool:
    """Put back the version ``name`` that the locked ``.old`` folder ``old_fd`` holds, unless there is none or a
    complete one took its place; by fds, so that a link swapped in for either folder moves nothing. False if it
    could not (a writer of ``name`` renamed its version in meanwhile): the ``.old`` is kept for a later sweep."""
    moved_aside = _lstat(name, old_fd)
    if moved_aside is None or not stat.S_ISDIR(moved_aside.st_mode) or _lstat(name, directory_fd) is not None:
        return True
    try:
        os.replace(name, name, src_dir_fd=old_fd, dst_dir_fd=directory_fd)
    except OSError:
        return False
    return True


def _group_names(old_fd: int) -> list[str] | None:
    """The names of the group of files an ``.old`` folder holds (see ``move_group_into_place``), or None for an
    ``.old`` of a directory; plain names only (no ``/``, ``.`` or ``..``), so nothing outside the folder moves."""
    try:
        handle = os.open(GROUP_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=old_fd)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as group:
        names = group.read(65536).decode("utf-8", "replace").splitlines()
    return [name for name in names if name not in ("", ".", "..", GROUP_FILE) and "/" not in name] or None


def _put_back_group(names: list[str], old_fd: int, directory_fd: int) -> bool:
    """Put back the group ``names`` as the locked ``.old`` folder ``old_fd`` holds it: each file it kept renamed
    back over the new one, each it did not (the group had none) removed. False if a move failed (the ``.old`` is
    kept for a later sweep)."""
    try:
        for name in names:
            kept = _lstat(name, old_fd)
            if kept is not None and stat.S_ISREG(kept.st_mode):
                os.replace(name, name, src_dir_fd=old_fd, dst_dir_fd=directory_fd)
            elif kept is None and _lstat(name, directory_fd) is not None:
                os.unlink(name, dir_fd=directory_fd)
    except OSError:
        return False
    return True


def _lstat(name: str, directory_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as error:
        warnings.warn(f"could not delete {path}: {error}", stacklevel=3)
        return False
    return True
