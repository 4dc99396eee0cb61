"""Image folders: listed once, the listing cached and trusted only while every directory it walked is unchanged,
and hostile trees (symbolic link loops, paths the system refuses) named in one line."""

import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.data import DatasetError, scan_folder
from vitkit.data.folders import RACY_NS

HOUR_AGO = time.time() - 3600


def tree(root: Path, files: dict[str, int]) -> Path:
    """PNG files at the given relative paths (their pixel value as given), every directory dated an hour back so
    that its listing may be cached."""
    for relative, value in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((2, 2), value, np.uint8)).save(root / relative)
    backdate(root)
    return root


def backdate(root: Path) -> None:
    for folder, _, _ in os.walk(root):
        os.utime(folder, (HOUR_AGO, HOUR_AGO))


def names(root: Path) -> list[str]:
    listed = scan_folder(root)
    return [str(listed.path(i).relative_to(root)) for i in range(len(listed))]


def cached_listings() -> list[Path]:
    return sorted((Path(os.environ["VITKIT_CACHE"]) / "folder-listing").glob("*.npz"))


def test_a_listing_is_cached_until_a_directory_it_walked_changes(tmp_path):
    root = tree(tmp_path / "images", {"cat/1.png": 1, "cat/0.png": 0, "dog/deep/2.png": 2})
    before = cached_listings()
    assert names(root) == ["cat/0.png", "cat/1.png", "dog/deep/2.png"]
    assert len(cached_listings()) == len(before) + 1

    # a rename that leaves every mtime as it was (the cache's documented limit) shows the listing is the cached one
    os.rename(root / "cat" / "1.png", root / "cat" / "9.png")
    backdate(root)
    assert names(root) == ["cat/0.png", "cat/1.png", "dog/deep/2.png"]

    # a file added two levels down changes only its own directory's mtime, and is found
    Image.fromarray(np.zeros((2, 2), np.uint8)).save(root / "dog" / "deep" / "3.png")
    assert names(root) == ["cat/0.png", "cat/9.png", "dog/deep/2.png", "dog/deep/3.png"]
    listed = scan_folder(root)
    assert listed.classes == ["cat", "dog"] and listed.labels.tolist() == [0, 0, 1, 1]


def test_a_folder_changed_just_now_is_listed_but_not_cached(tmp_path):
    """Within RACY_NS of a change a coarse clock could give a later change the same mtime: no entry is kept."""
    root = tree(tmp_path / "images", {"a/0.png": 0})
    before = cached_listings()
    (root / "b").mkdir()
    Image.fromarray(np.zeros((2, 2), np.uint8)).save(root / "b" / "0.png")
    assert time.time_ns() - (root / "b").stat().st_mtime_ns < RACY_NS
    assert names(root) == ["a/0.png", "b/0.png"] and cached_listings() == before


def test_a_damaged_or_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    root = tree(tmp_path / "images", {"a/0.png": 0, "b/1.png": 1})
    before = set(cached_listings())
    names(root)
    (entry,) = set(cached_listings()) - before
    entry.write_bytes(entry.read_bytes()[:100])  # torn
    assert names(root) == ["a/0.png", "b/1.png"]
    entry.write_bytes(b"not a zip file")
    assert names(root) == ["a/0.png", "b/1.png"]

    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("")
    monkeypatch.setenv("VITKIT_CACHE", str(blocked))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert names(root) == ["a/0.png", "b/1.png"]
    assert "could not cache the listing" in str(caught[0].message)


def test_a_symbolic_link_loop_is_named_in_one_line(tmp_path, capsys):
    root = tree(tmp_path / "images", {"a/0.png": 0})
    (root / "a" / "again").symlink_to(root)  # a/again/a/again/...
    with pytest.raises(DatasetError, match="images/a/again: a symbolic link loop"):
        scan_folder(root)
    assert main(["data", "info", f"imagefolder:{root}"]) == 1
    error = capsys.readouterr().err.strip()
    assert "symbolic link loop" in error and len(error.splitlines()) == 1


def test_a_folder_the_system_will_not_list_is_named(tmp_path):
    """A path longer than PATH_MAX (made a component at a time) cannot be listed: the error names it. (Tests
    run as root here, whom permissions do not stop; both come through the same OSError.)"""
    root = tree(tmp_path / "images", {"a/0.png": 0})
    deep, fd = root / "a", os.open(root / "a", os.O_RDONLY)
    try:
        for _ in range(18):  # 18 x 256 characters > 4096
            os.mkdir("d" * 255, dir_fd=fd)
            inner = os.open("d" * 255, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd, deep = inner, deep / ("d" * 255)
    finally:
        os.close(fd)
    with pytest.raises(DatasetError, match=r"ddd: cannot list the folder \(File name too long\)"):
        scan_folder(root)
