"""One rule for the paths vitkit follows and the files it reads: a leaf module, so that data, checkpoints and
training apply the same checks.

- **Containment.** A folder the user names is resolved once (it may itself be a link). A path that comes from
  inside it or from data (a row's image path, a listing-cache entry, an ONNX external-data file, a ``gs://``
  object name) is resolved through ``..``, absolute parts and links alike, and must land under that root, or it
  is refused naming both (``within``).
- **Regular files only.** A FIFO, a device, a socket or a folder where a file is expected is refused, naming
  it, before anything could wait on it or read it endlessly: ``regular_file`` for a library that opens the
  path itself, ``open_regular`` (``O_NONBLOCK``, then ``fstat`` of what was opened: no FIFO can race in)
  where vitkit opens it. Text read whole is capped (``read_capped``), the cap stated in the error.
- **Ids.** A hub or bucket id is parsed strictly (``id_segments``).
- **Output folders.** A folder to write a run into is new, empty, or already the tool's own (``own_folder``).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import VitkitError, abridged

# The most a file read whole (a config, a recipe, a class list, JSON beside the weights) may hold: a million
# class names of 60 characters fit; /dev/zero or a stray dataset file given as a config does not.
TEXT_LIMIT = 64 * 2**20

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotAFileError(OSError):
    """A path where a regular file was expected names something else (a FIFO, a device, a socket, a folder)."""


def resolved(path: str | os.PathLike) -> Path:
    """The folder or file the user named, with every link and ``..`` resolved: the root that paths from inside
    it are held to (resolve it once, then check each path with ``within``)."""
    return Path(os.path.realpath(path))


def within(root: Path, path: str | os.PathLike, error: type[VitkitError], what: str = "path") -> Path:
    """``path`` (relative to the resolved ``root``, or absolute) with links and ``..`` resolved; ``error``
    naming both when it leads outside ``root``."""
    real = os.path.realpath(os.path.join(root, os.fsdecode(path)))
    if real != str(root) and not real.startswith(os.path.join(root, "")):
        raise error(f"{os.fsdecode(path)}: {what} leads outside {root} (to {real}); expected a path inside it")
    return Path(real)


def _refuse_special(path: str | os.PathLike, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise NotAFileError(errno.EISDIR, os.strerror(errno.EISDIR), os.fsdecode(path))
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise NotAFileError(errno.EINVAL, f"{kind}, not a regular file", os.fsdecode(path))


def regular_file(path: str | os.PathLike) -> os.stat_result:
    """The status of ``path`` (links followed), which must be a regular file; for a library that opens the path
    itself (NotAFileError, else the OSError of ``os.stat``)."""
    status = os.stat(path)
    _refuse_special(path, status.st_mode)
    return status


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for binary reading, once it is known to be a regular file: opened without blocking (a
    FIFO with no writer would block an ordinary open forever), checked with ``fstat``, then made blocking."""
    regular_file(path)  # a socket cannot be opened at all: named here with the others
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _refuse_special(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def reason(error: Exception) -> str:
    """Why a read failed, for a message that names the file itself: an OSError's words without its errno."""
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)


def read_capped(path: str | os.PathLike, what: str, limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, refused (OSError EFBIG, naming ``what`` and the cap) past
    ``limit`` bytes: the cap holds even where the size the file system reports is wrong (``/proc``)."""
    with open_regular(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes, the most a {what} may hold", os.fsdecode(path))
    return data


def read_text(path: str | os.PathLike, what: str, limit: int = TEXT_LIMIT) -> str:
    """``read_capped`` decoded as UTF-8 (UnicodeDecodeError for bytes that are not)."""
    return read_capped(path, what, limit).decode("utf-8")


_SEGMENT_PROBLEMS = (("", "an empty segment"), (".", "a '.' segment"), ("..", "a '..' segment"))


def id_segments(name: str, what: str, error: type[VitkitError]) -> list[str]:
    """The ``/``-separated segments of a hub or bucket id; ``error`` when one is empty, ``.`` or ``..``, or the
    id is absolute or holds a backslash or a control character (any of which could step outside its place)."""
    problem = ("a backslash" if "\\" in name else "a control character" if re.search(r"[\x00-\x1f\x7f]", name)
               else "an absolute path" if name.startswith("/") else None)
    segments = name.split("/")
    problem = problem or next((said for segment, said in _SEGMENT_PROBLEMS if segment in segments), None)
    if problem:
        raise error(f"{abridged(what + name)}: the id holds {problem}; expected NAME/NAME/... segments")
    return segments


def own_folder(folder: Path, marker: str, own: re.Pattern[str], what: str, error: type[VitkitError]) -> None:
    """Refuse the folder ``folder`` as a place to write ``what`` unless it is empty, holds ``marker`` (it is one
    already), or holds only entries whose names ``own`` matches (one begun and cut short). A link to a folder is
    judged by what that folder holds; hidden entries (writers' temporaries) are not counted. A path that is no
    folder (new, or a file) is left to the writer, which makes it or fails naming it."""
    if not folder.is_dir():
        return
    try:
        names = [entry.name for entry in os.scandir(folder) if not entry.name.startswith(".")]
    except OSError as failure:
        raise error(f"{folder}: cannot list the folder ({failure.strerror})") from failure
    if marker in names:
        return
    foreign = sorted(name for name in names if not own.fullmatch(name))
    if foreign:
        raise error(f"{folder}: holds {foreign[0]!r}{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}, "
                    f"which {what} does not write; expected a new or empty folder, or one holding {marker}")
