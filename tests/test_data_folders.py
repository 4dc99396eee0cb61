"""Image folders: listed once, the listing cached and trusted only while every directory it walked is unchanged,
and hostile trees (symbolic link loops, paths the system refuses) named in one line."""

import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit.data.folders as folders
from vitkit.cli import main
from vitkit.data import DatasetError, scan_folder

QUIET_NS = 200_000_000  # the racy window these tests use; the real one (2 s) is tested once


def tree(root: Path, files: list[str], mtime: float | None = None) -> Path:
    """Tiny PNGs at the given relative paths (every directory's mtime set to ``mtime`` if given), then a pause
    longer than the tests' racy window, so that the listing may be cached."""
    for relative in files:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((2, 2), np.uint8)).save(root / relative)
    if mtime is not None:
        for folder, _, _ in os.walk(root):
            os.utime(folder, (mtime, mtime))
    time.sleep(2 * QUIET_NS / 1e9)
    return root


@pytest.fixture
def walks(monkeypatch) -> list[Path]:
    """The folders walked (not read from the cache), with the racy window shortened to QUIET_NS."""
    monkeypatch.setattr(folders, "RACY_NS", QUIET_NS)
    walked, real = [], folders._walk
    monkeypatch.setattr(folders, "_walk", lambda root: walked.append(root) or real(root))
    return walked


def names(root: Path) -> list[str]:
    listed = scan_folder(root)
    return [str(listed.path(i).relative_to(root)) for i in range(len(listed))]


def cached_listings() -> set[Path]:
    return set((Path(os.environ["VITKIT_CACHE"]) / "folder-listing").glob("*.npz"))


def test_a_listing_is_cached_until_a_directory_it_walked_changes(tmp_path, walks):
    root = tree(tmp_path / "images", ["cat/1.png", "cat/0.png", "dog/deep/2.png"])
    before = cached_listings()
    assert names(root) == ["cat/0.png", "cat/1.png", "dog/deep/2.png"]
    assert len(cached_listings() - before) == 1 and len(walks) == 1
    assert names(root) == ["cat/0.png", "cat/1.png", "dog/deep/2.png"] and len(walks) == 1  # from the cache
    assert isinstance(folders.folder_listing(root).files, np.memmap)  # mapped, not read

    tree(root, ["dog/deep/3.png"])  # two levels down: only that directory changes
    assert names(root) == ["cat/0.png", "cat/1.png", "dog/deep/2.png", "dog/deep/3.png"] and len(walks) == 2
    tree(root, ["emu/4.png"])  # a new class
    listed = scan_folder(root)
    assert listed.classes == ["cat", "dog", "emu"] and listed.labels.tolist() == [0, 0, 1, 1, 2]
    (root / "cat" / "1.png").rename(root / "cat" / "9.png")
    assert names(root)[:2] == ["cat/0.png", "cat/9.png"] and len(walks) == 4


def test_a_tree_put_in_place_with_the_same_times_is_not_taken_for_the_old_one(tmp_path, walks):
    """tar, rsync -a and cp -a set directories' mtimes; the inodes and change times give the new tree away."""
    root = tree(tmp_path / "images", ["cat/a.png", "dog/b.png"], mtime=1_600_000_000)
    assert names(root) == ["cat/a.png", "dog/b.png"]
    shutil.rmtree(root)
    tree(root, ["cat/new.png", "dog/b.png", "dog/c.png"], mtime=1_600_000_000)
    assert names(root) == ["cat/new.png", "dog/b.png", "dog/c.png"] and len(walks) == 2


def test_a_folder_changed_just_now_is_listed_but_not_cached(tmp_path):
    """Within RACY_NS (2 s) of a change a coarse clock could give a later change the same times: no entry is
    kept."""
    root = tmp_path / "images"
    before = cached_listings()
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        Image.fromarray(np.zeros((2, 2), np.uint8)).save(root / name / "0.png")
    assert time.time_ns() - (root / "b").stat().st_mtime_ns < folders.RACY_NS
    assert names(root) == ["a/0.png", "b/0.png"] and cached_listings() == before


def test_a_damaged_or_unwritable_cache_only_costs_time(tmp_path, monkeypatch, walks):
    root = tree(tmp_path / "images", ["a/0.png", "b/1.png"])
    before = cached_listings()
    names(root)
    (entry,) = cached_listings() - before
    with np.load(entry, allow_pickle=False) as arrays:
        members = dict(arrays)
    np.savez_compressed(compressed := tmp_path / "compressed.npz", **members)  # valid, but cannot be mapped
    objects = dict(members, files=np.array([b"a/0.png", None], dtype=object))  # would need pickle to read
    np.savez(with_objects := tmp_path / "objects.npz", **objects)
    overlong = entry.read_bytes().replace(b"'shape': (2,)", b"'shape': (9,)")  # more rows than its bytes
    assert overlong != entry.read_bytes()
    for damage in (entry.read_bytes()[:100], b"not a zip file", b"", compressed.read_bytes(),
                   with_objects.read_bytes(), overlong):  # torn, someone else's, empty, compressed, objects
        entry.write_bytes(damage)
        assert names(root) == ["a/0.png", "b/1.png"]
    assert len(walks) == 7

    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("")
    monkeypatch.setenv("VITKIT_CACHE", str(blocked))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert names(root) == ["a/0.png", "b/1.png"]
    assert "could not cache the listing" in str(caught[0].message)


def test_names_that_are_not_utf8_go_through_the_cache(tmp_path, walks):
    root = tmp_path / "images"
    folder = os.path.join(os.fsencode(root), b"caf\xe9")
    os.makedirs(folder)
    Image.fromarray(np.zeros((2, 2), np.uint8)).save(os.fsdecode(os.path.join(folder, b"\xff.png")), format="PNG")
    time.sleep(2 * QUIET_NS / 1e9)
    first, second = scan_folder(root), scan_folder(root)
    assert len(walks) == 1 and first.classes == second.classes == [os.fsdecode(b"caf\xe9")]
    assert list(first.files) == list(second.files) == [os.path.join(folder, b"\xff.png")]
    assert second[0][0].shape == (1, 2, 2)


@pytest.mark.parametrize("target", ["parent", "itself"])
def test_a_symbolic_link_loop_is_named_in_one_line(tmp_path, capsys, target):
    root = tree(tmp_path / "images", ["a/0.png"])
    link = root / "a" / "again"
    link.symlink_to(root if target == "parent" else link)  # a/again/a/again/... or a/again -> a/again
    message = "symbolic link loop" if target == "parent" else "Too many levels of symbolic links"
    with pytest.raises(DatasetError, match=f"images/a/again: .*{message}"):
        scan_folder(root)
    assert main(["data", "info", f"imagefolder:{root}"]) == 1
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1


def test_a_folder_the_system_will_not_list_is_named(tmp_path):
    """A path longer than PATH_MAX (made a component at a time) cannot be listed: the error names it. (Tests
    run as root here, whom permissions do not stop; both come through the same OSError.)"""
    root = tree(tmp_path / "images", ["a/0.png"])
    fd = os.open(root / "a", os.O_RDONLY)
    try:
        for _ in range(18):  # 18 x 256 characters > 4096
            os.mkdir("d" * 255, dir_fd=fd)
            inner = os.open("d" * 255, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    with pytest.raises(DatasetError, match=r"ddd: cannot list the folder \(File name too long\)"):
        scan_folder(root)
