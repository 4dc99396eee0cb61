"""Image folders listed, never opened, and their listings cached: a folder of a million images is walked
once (about two seconds), and from then on its listing loads in a fraction of that.

A listing is kept under ``cache_dir()/folder-listing`` as an ``.npz`` file (read without pickle), keyed by
the folder's absolute path, and trusted only while every directory it walked is the same directory (device
and inode) with the same change and modification times: adding, removing or renaming an entry changes its
directory's times, a tree put in its place has other inodes, and the change time cannot be set back by
``touch``, ``tar`` or ``rsync`` as the modification time can (git's index checks the same). As git does, a
listing is not kept when a directory changed less than ``RACY_NS`` before the walk began, since a change
within the same tick of a coarse clock would leave the times as they were. A cache that cannot be read or
written costs only time.
"""

from __future__ import annotations

import math
import os
import struct
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..atomic import atomic_file
from ..cache import cache_dir, cache_entry, sweep_cache
from ..errors import DatasetError
from ..paths import open_regular, resolved, within

FORMAT_VERSION = 1
RACY_NS = 2_000_000_000  # the coarsest common mtime step (FAT's 2 s); ext4, xfs and btrfs keep nanoseconds


@dataclass
class Listing:
    """A folder's class sub-folders (sorted) and their files, class by class and each class's sorted, as
    absolute bytes paths in a numpy array (workers share its pages instead of touching a million reference
    counts); with every directory walked and its ``STAMP`` when it was listed, the root's first."""

    classes: list[str]
    files: np.ndarray
    counts: np.ndarray
    directories: np.ndarray
    stamps: np.ndarray  # (directories, 4): STAMP of each


STAMP = ("st_dev", "st_ino", "st_ctime_ns", "st_mtime_ns")


def _stamp(stat: os.stat_result) -> list[int]:
    return [getattr(stat, field) for field in STAMP]


def folder_listing(root: Path) -> Listing:
    """The listing of ``root/<class>/...`` (hidden entries left out), from the cache when it still holds. A link
    in the folder that leads outside it is refused, naming both (see ``vitkit.paths``)."""
    root = root.absolute()
    try:
        entry = _entry(root)
    except (OSError, RuntimeError):  # no cache folder to be had (no home directory): list every time
        return _walk(root)
    listing = _cached(entry, root)
    if listing is None:
        started = time.time_ns()
        listing = _walk(root)
        if int(listing.stamps[:, 2:].max()) < started - RACY_NS:
            _store(entry, root, listing)
    return listing


def class_folders(root: Path) -> list[str]:
    return sorted(os.fsdecode(name) for path, name, is_dir in entries(os.fsencode(root), resolved(root)) if is_dir)


def entries(folder: bytes, real_root: Path) -> list[tuple[bytes, bytes, bool]]:
    """``(path, name, is a directory)`` of the entries of ``folder`` that are not hidden; a symbolic link is
    followed if it stays inside ``real_root`` (the resolved folder being listed) and refused otherwise, naming
    both (a link to itself, or one that cannot be followed, is an error naming it)."""
    try:
        with os.scandir(folder) as entries:
            found = [(entry.path, entry.name, entry.is_dir(), entry.is_symlink()) for entry in entries
                     if not entry.name.startswith(b".")]
        for path, *_, link in found:
            if link:
                within(real_root, path, DatasetError, "a link")
        return [entry[:3] for entry in found]
    except OSError as error:
        name = os.fsdecode(error.filename) if isinstance(error.filename, bytes | str) else os.fsdecode(folder)
        raise DatasetError(f"{name}: cannot list the folder ({error.strerror})") from error


def _stat(folder: bytes) -> os.stat_result:
    try:
        return os.stat(folder)
    except OSError as error:
        raise DatasetError(f"{os.fsdecode(folder)}: cannot list the folder ({error.strerror})") from error


def _walk(root: Path) -> Listing:
    directories, stamps, real_root = [], [], resolved(root)

    def visit(folder: bytes, ancestors: frozenset) -> list[bytes]:
        """The files under ``folder``; its times are read before its entries, so a change made during the walk
        makes the listing stale rather than the cache wrong."""
        stat = _stat(folder)
        identity = (stat.st_dev, stat.st_ino)
        if identity in ancestors:
            raise DatasetError(f"{os.fsdecode(folder)}: a symbolic link loop (the folder is one of its own parents)")
        directories.append(folder)
        stamps.append(_stamp(stat))
        found = []
        for path, _, is_dir in entries(folder, real_root):
            if is_dir:
                found += visit(path, ancestors | {identity})
            else:
                found.append(path)
        return found

    top = os.fsencode(root)
    stat = _stat(top)  # before its class folders are listed, as in visit
    directories.append(top)
    stamps.append(_stamp(stat))
    classes, above = class_folders(root), frozenset({(stat.st_dev, stat.st_ino)})
    per_class = [sorted(visit(os.path.join(top, os.fsencode(name)), above)) for name in classes]
    return Listing(classes, np.array([path for files in per_class for path in files], dtype=bytes),
                   np.array([len(files) for files in per_class], dtype=np.int64),
                   np.array(directories, dtype=bytes), np.array(stamps, dtype=np.int64))


def _entry(root: Path) -> Path:
    return cache_entry("folder-listing", os.fsencode(root), ".npz")


def _cached(entry: Path, root: Path) -> Listing | None:
    """The cached listing of ``root``, or None when there is none to trust."""
    try:
        with open_regular(entry) as handle, np.load(handle, allow_pickle=False) as arrays:  # one file, if replaced
            if int(arrays["version"]) != FORMAT_VERSION or arrays["root"].item() != os.fsencode(root):
                return None
            listing = Listing([os.fsdecode(name) for name in arrays["classes"]], _mapped(handle, "files"),
                              arrays["counts"], arrays["directories"], arrays["stamps"])
        if not (len(listing.directories) and listing.directories[0] == os.fsencode(root)
                and listing.stamps.shape == (len(listing.directories), len(STAMP))
                and len(listing.classes) == len(listing.counts) and int(listing.counts.sum()) == len(listing.files)
                and _inside(listing.directories[1:], root) and _inside(listing.files, root)):
            return None
        if any(_stamp(os.stat(folder)) != list(stamp) for folder, stamp in zip(listing.directories, listing.stamps)):
            return None
        return listing
    except Exception:  # absent, changed, torn, empty or someone else's file: walk the folder again
        return None


def _inside(paths: np.ndarray, root: Path) -> bool:
    """Whether every path is one a walk of ``root`` lists: below it, with no hidden part (so no ``..`` either,
    since a walk leaves hidden entries out). A crafted entry naming a file elsewhere is not trusted."""
    prefix = os.path.join(os.fsencode(root), b"")
    return bool(np.char.startswith(paths, prefix).all() and (np.char.find(paths, b"/.", len(prefix) - 1) < 0).all())


def _mapped(handle: BinaryIO, name: str) -> np.memmap:
    """Array ``name`` of the ``.npz`` file open as ``handle``, mapped, not read: np.savez stores its members
    uncompressed, each an ``.npy`` file after a zip header, so the array's bytes lie at a fixed place in the file.
    Loading a million paths then costs no copy, and the processes that list one folder share its pages."""
    with zipfile.ZipFile(handle) as archive:
        member = archive.getinfo(f"{name}.npy")
    if member.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{name} is compressed")
    handle.seek(member.header_offset)
    signature, name_length, extra_length = struct.unpack("<4s22xHH", handle.read(30))  # a zip local header
    if signature != b"PK\x03\x04":
        raise ValueError(f"{name}: no zip entry where the directory says")
    start = member.header_offset + 30 + name_length + extra_length
    handle.seek(start)
    version = np.lib.format.read_magic(handle)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    shape, fortran_order, dtype = read_header[version](handle)
    if dtype.hasobject or handle.tell() + dtype.itemsize * math.prod(shape) > start + member.file_size:
        raise ValueError(f"{name}: not an array of bytes within its entry")
    return np.memmap(handle, dtype, "r", handle.tell(), shape, "F" if fortran_order else "C")


def _store(entry: Path, root: Path, listing: Listing) -> None:
    try:
        sweep_cache("folder-listing")
        with atomic_file(entry, "wb") as handle:
            np.savez(handle, version=FORMAT_VERSION, root=np.array(os.fsencode(root)),
                     classes=np.array([os.fsencode(name) for name in listing.classes], dtype=bytes),
                     files=listing.files, counts=listing.counts, directories=listing.directories,
                     stamps=listing.stamps)
    except OSError as error:
        warnings.warn(f"could not cache the listing of {root} in {cache_dir()} ({error}); it will be walked again "
                      f"next time (set VITKIT_CACHE to a writable folder)", stacklevel=3)
