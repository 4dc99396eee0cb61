"""Image folders listed, never opened, and their listings cached: a folder of a million images is walked
once (about two seconds), and from then on its listing loads in a fraction of that.

A listing is kept under ``cache_dir()/folder-listing`` as an ``.npz`` file (read without pickle), keyed by
the folder's absolute path, and trusted only while every directory it walked still has the modification
time it had: adding, removing or renaming an entry changes its directory's mtime. As git does for its
index, a listing is not kept when a directory changed less than ``RACY_NS`` before the walk began, since a
change within the same tick of a coarse clock would leave the mtime as it was. A cache that cannot be
written costs only time.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_file
from ..cache import cache_dir
from ..errors import DatasetError

FORMAT_VERSION = 1
RACY_NS = 2_000_000_000  # the coarsest common mtime step (FAT's 2 s); ext4, xfs and btrfs keep nanoseconds


@dataclass
class Listing:
    """A folder's class sub-folders (sorted) and their files, class by class and each class's sorted, as
    bytes paths in a numpy array (workers share its pages instead of touching a million reference counts);
    with every directory walked and its mtime when it was listed."""

    classes: list[str]
    files: np.ndarray
    counts: np.ndarray
    directories: np.ndarray
    mtimes: np.ndarray


def folder_listing(root: Path) -> Listing:
    """The listing of ``root/<class>/...`` (hidden entries left out), from the cache when it still holds."""
    entry = _entry(root)
    listing = _cached(entry, root)
    if listing is None:
        started = time.time_ns()
        listing = _walk(root)
        if int(listing.mtimes.max()) < started - RACY_NS:
            _store(entry, root, listing)
    return listing


def class_folders(root: Path) -> list[str]:
    return sorted(os.fsdecode(entry.name) for entry in _entries(os.fsencode(root)) if entry.is_dir())


def _entries(folder: bytes) -> list[os.DirEntry]:
    """The entries of ``folder`` that are not hidden."""
    try:
        with os.scandir(folder) as entries:
            return [entry for entry in entries if not entry.name.startswith(b".")]
    except OSError as error:
        raise DatasetError(f"{os.fsdecode(folder)}: cannot list the folder ({error.strerror})") from error


def _walk(root: Path) -> Listing:
    directories, mtimes = [], []

    def visit(folder: bytes, ancestors: frozenset) -> list[bytes]:
        """The files under ``folder``; its mtime is read before its entries, so a change made during the walk
        makes the listing stale rather than the cache wrong."""
        try:
            stat = os.stat(folder)
        except OSError as error:
            raise DatasetError(f"{os.fsdecode(folder)}: cannot list the folder ({error.strerror})") from error
        identity = (stat.st_dev, stat.st_ino)
        if identity in ancestors:
            raise DatasetError(f"{os.fsdecode(folder)}: a symbolic link loop (the folder is one of its own parents)")
        directories.append(folder)
        mtimes.append(stat.st_mtime_ns)
        found = []
        for entry in _entries(folder):
            if entry.is_dir():
                found += visit(entry.path, ancestors | {identity})
            else:
                found.append(entry.path)
        return found

    top = os.fsencode(root)
    stat = os.stat(top)  # before its class folders are listed, as in visit
    directories.append(top)
    mtimes.append(stat.st_mtime_ns)
    classes, above = class_folders(root), frozenset({(stat.st_dev, stat.st_ino)})
    per_class = [sorted(visit(os.path.join(top, os.fsencode(name)), above)) for name in classes]
    return Listing(classes, np.array([path for files in per_class for path in files], dtype=bytes),
                   np.array([len(files) for files in per_class], dtype=np.int64),
                   np.array(directories, dtype=bytes), np.array(mtimes, dtype=np.int64))


def _entry(root: Path) -> Path:
    return cache_dir() / "folder-listing" / f"{hashlib.sha256(os.fsencode(root.absolute())).hexdigest()[:32]}.npz"


def _cached(entry: Path, root: Path) -> Listing | None:
    """The cached listing of ``root``, or None when there is none to trust."""
    try:
        with np.load(entry, allow_pickle=False) as arrays:
            if int(arrays["version"]) != FORMAT_VERSION or arrays["root"].item() != os.fsencode(root.absolute()):
                return None
            listing = Listing([os.fsdecode(name) for name in arrays["classes"]], arrays["files"], arrays["counts"],
                              arrays["directories"], arrays["mtimes"])
        if len(listing.directories) != len(listing.mtimes) or int(listing.counts.sum()) != len(listing.files):
            return None
        if any(os.stat(folder).st_mtime_ns != mtime for folder, mtime in zip(listing.directories, listing.mtimes)):
            return None
        return listing
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # absent, changed, torn or someone else's file
        return None


def _store(entry: Path, root: Path, listing: Listing) -> None:
    try:
        with atomic_file(entry, "wb") as handle:
            np.savez(handle, version=FORMAT_VERSION, root=np.array(os.fsencode(root.absolute())),
                     classes=np.array([os.fsencode(name) for name in listing.classes], dtype=bytes),
                     files=listing.files, counts=listing.counts, directories=listing.directories,
                     mtimes=listing.mtimes)
    except OSError as error:
        warnings.warn(f"could not cache the listing of {root} in {cache_dir()} ({error}); it will be walked again "
                      f"next time (set VITKIT_CACHE to a writable folder)", stacklevel=3)
