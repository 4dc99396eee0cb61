"""The folder-listing cache under real concurrency: two processes listing one folder at once (each walking and
writing the same entry while the other reads it), and a writer killed with SIGKILL in the middle of writing an
entry. Afterwards every listing is right and nothing half-written is taken for an entry."""

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from launch import child_env, start_until_ready

import vitkit.data.folders as folders
from vitkit.cache import KILLED_WRITER_S

QUIET_NS = 200_000_000  # the racy window the processes use (the real one, 2 s, is tested in test_data_folders)
CLASSES = {"ant": 300, "bee": 200, "cat": 100}

# Lists ROOT ITERATIONS times once GO exists; every other time (by ROLE) it first deletes the entry, so both
# processes walk and write the entry again and again while the other reads it. Prints what went wrong.
LIST_AT_ONCE = """
import json, os, sys, time
from pathlib import Path
import vitkit.data.folders as folders
folders.RACY_NS = int(sys.argv[5])
root, go, iterations, role = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
expected = json.loads(os.environ["EXPECTED"])
walks, real = [], folders._walk
folders._walk = lambda path: walks.append(1) or real(path)
while not go.exists():
    time.sleep(0.001)
wrong = []
for iteration in range(iterations):
    if iteration % 2 == role:
        folders._entry(root.absolute()).unlink(missing_ok=True)
    listing = folders.folder_listing(root)
    got = [listing.classes, [os.fsdecode(f) for f in listing.files], listing.counts.tolist()]
    if got != expected:
        wrong.append(iteration)
print(json.dumps({"wrong": wrong, "walks": len(walks)}))
"""

# Lists ROOT with the entry's writer stopped half-way: np.savez writes half its bytes into atomic_file's
# temporary, says so in READY, and waits there (to be killed) until GO exists, then writes the rest.
PAUSED_WRITER = """
import io, os, sys, time
from pathlib import Path
import numpy as np
import vitkit.data.folders as folders
folders.RACY_NS = int(sys.argv[4])
real = np.savez

def half_then_wait(handle, **arrays):
    whole = io.BytesIO()
    real(whole, **arrays)
    half = len(whole.getvalue()) // 2
    handle.write(whole.getvalue()[:half])
    handle.flush()
    os.fsync(handle.fileno())
    Path(sys.argv[2]).touch()
    while not Path(sys.argv[3]).exists():
        time.sleep(0.01)
    handle.write(whole.getvalue()[half:])

folders.np.savez = half_then_wait
folders.folder_listing(Path(sys.argv[1]))
"""


def image_tree(root: Path) -> list:
    """Empty files in class folders (a listing opens none), then a pause past the racy window; the listing
    expected of it, as ``[classes, files, counts]``."""
    for name, count in CLASSES.items():
        (root / name).mkdir(parents=True)
        for number in range(count):
            (root / name / f"{number:04d}.png").touch()
    time.sleep(2 * QUIET_NS / 1e9)
    files = [str(root.absolute() / name / f"{number:04d}.png") for name, count in CLASSES.items()
             for number in range(count)]
    return [list(CLASSES), files, list(CLASSES.values())]


def entries(cache: Path) -> list[str]:
    folder = cache / "folder-listing"
    return sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []


def as_lists(listing: folders.Listing) -> list:
    return [listing.classes, [os.fsdecode(f) for f in listing.files], listing.counts.tolist()]


def test_two_processes_listing_one_folder_at_once_both_get_it_right(tmp_path, monkeypatch):
    root, cache, go = tmp_path / "images", tmp_path / "cache", tmp_path / "go"
    expected = image_tree(root)
    env = child_env(VITKIT_CACHE=str(cache), EXPECTED=json.dumps(expected))
    children = [subprocess.Popen([sys.executable, "-c", LIST_AT_ONCE, str(root), str(go), "30", str(role),
                                  str(QUIET_NS)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for role in (0, 1)]
    time.sleep(0.5)
    go.touch()  # both have imported vitkit by now, or start at once when they have
    results = []
    for child in children:
        out, err = child.communicate(timeout=240)
        assert child.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    assert [result["wrong"] for result in results] == [[], []]
    assert all(result["walks"] >= 1 for result in results), "both walked and wrote the entry"

    monkeypatch.setenv("VITKIT_CACHE", str(cache))
    assert len(entries(cache)) == 1 and entries(cache)[0].endswith(".npz"), "one entry, no temporaries left"
    monkeypatch.setattr(folders, "_walk", lambda path: pytest.fail("the entry the two wrote is not trusted"))
    assert as_lists(folders.folder_listing(root)) == expected


def paused_writer(root: Path, cache: Path, ready: Path, go: Path) -> tuple[subprocess.Popen, Path]:
    """A process listing ``root`` that stopped half-way through writing its entry; with its temporary."""
    writer = start_until_ready(PAUSED_WRITER, ready, root, ready, go, QUIET_NS, env=child_env(VITKIT_CACHE=str(cache)))
    (torn,) = (cache / "folder-listing").glob(".*.tmp")  # atomic_file's temporary, half written
    assert torn.stat().st_size > 0
    return writer, torn


def test_a_writer_killed_mid_write_leaves_no_entry_that_is_trusted(tmp_path, monkeypatch):
    root, cache = tmp_path / "images", tmp_path / "cache"
    monkeypatch.setenv("VITKIT_CACHE", str(cache))
    monkeypatch.setattr(folders, "RACY_NS", QUIET_NS)
    first = image_tree(root)
    assert as_lists(folders.folder_listing(root)) == first
    (entry,) = entries(cache)
    kept = (cache / "folder-listing" / entry).read_bytes()

    (root / "dog").mkdir()  # the folder changes: the entry is stale, and the next listing writes a new one
    (root / "dog" / "0000.png").touch()
    time.sleep(2 * QUIET_NS / 1e9)
    expected = [[*first[0], "dog"], [*first[1], str(root.absolute() / "dog" / "0000.png")], [*first[2], 1]]
    writer, torn = paused_writer(root, cache, tmp_path / "ready", tmp_path / "go")
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.wait(timeout=60) == -signal.SIGKILL

    assert sorted(entries(cache)) == sorted([entry, torn.name]), "the old entry and the killed writer's temporary"
    assert (cache / "folder-listing" / entry).read_bytes() == kept, "the old entry is whole, as it was"
    with pytest.raises(zipfile.BadZipFile):  # torn: it could not be read as an entry even if it were one
        np.load(torn, allow_pickle=False)
    walked, real = [], folders._walk
    monkeypatch.setattr(folders, "_walk", lambda path: walked.append(path) or real(path))
    assert as_lists(folders.folder_listing(root)) == expected and len(walked) == 1, "the stale entry is not trusted"
    assert entries(cache) == sorted([entry, torn.name]), "a recent temporary is kept, its lock free or not"
    assert as_lists(folders.folder_listing(root)) == expected and len(walked) == 1, "the new entry is"

    long_ago = time.time() - KILLED_WRITER_S - 60
    os.utime(torn, (long_ago, long_ago))
    (cache / "folder-listing" / entry).unlink()
    assert as_lists(folders.folder_listing(root)) == expected and len(walked) == 2
    assert entries(cache) == [entry], "the killed writer's temporary, its lock free and old, is swept"


def test_a_live_writers_temporary_is_kept_however_old(tmp_path, monkeypatch):
    root, cache, go = tmp_path / "images", tmp_path / "cache", tmp_path / "go"
    monkeypatch.setenv("VITKIT_CACHE", str(cache))
    monkeypatch.setattr(folders, "RACY_NS", QUIET_NS)
    expected = image_tree(root)
    writer, torn = paused_writer(root, cache, tmp_path / "ready", go)
    long_ago = time.time() - 2 * 3600  # a slow writer (a listing of millions of files on a network disk)
    os.utime(torn, (long_ago, long_ago))

    own_entry = folders._entry
    monkeypatch.setattr(folders, "_entry", lambda path: cache / "folder-listing" / "another-folder.npz")
    assert as_lists(folders.folder_listing(root)) == expected  # writes an entry: sweeps the folder first
    assert torn.exists(), "the live writer's temporary is kept"
    go.touch()
    _, err = writer.communicate(timeout=240)
    assert writer.returncode == 0 and "could not cache" not in err, err[-3000:]
    monkeypatch.setattr(folders, "_entry", own_entry)
    monkeypatch.setattr(folders, "_walk", lambda path: pytest.fail("the entry the writer finished is not trusted"))
    assert as_lists(folders.folder_listing(root)) == expected
