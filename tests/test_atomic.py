"""Atomic writes after a crash: leftovers swept (those of killed writers only), a version moved aside put back, a
full disk named."""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
from launch import SRC

from vitkit.atomic import atomic_directory, atomic_file, retire, staging_beside, sweep
from vitkit.train.loop import MetricsLog


def test_sweep_puts_back_a_version_moved_aside_and_clears_temporaries(tmp_path):
    # The state a kill leaves between atomic_directory's two renames: the old `best` moved aside, the new
    # one complete in its staging folder but not renamed; plus an interrupted file write.
    (tmp_path / ".best.k3j2.old" / "best").mkdir(parents=True)
    (tmp_path / ".best.k3j2.old" / "best" / "config.json").write_text("old")
    (tmp_path / ".best.x9a1.tmp").mkdir()
    (tmp_path / ".best.x9a1.tmp" / "config.json").write_text("new")
    (tmp_path / ".summary.json.q0w9.tmp").write_text("{")
    (tmp_path / ".hidden-but-ours-not").write_text("kept")
    removed = sweep(tmp_path)
    assert (tmp_path / "best" / "config.json").read_text() == "old"
    assert sorted(p.name for p in removed) == [".best.k3j2.old", ".best.x9a1.tmp", ".summary.json.q0w9.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden-but-ours-not", "best"]


def test_a_failed_directory_write_leaves_the_old_version_and_no_staging(tmp_path):
    with atomic_directory(tmp_path / "ckpt") as staging:
        (staging / "config.json").write_text("first")
    with pytest.raises(OSError, match="disk"):
        with atomic_directory(tmp_path / "ckpt") as staging:
            (staging / "config.json").write_text("second")
            raise OSError("disk gone")
    assert (tmp_path / "ckpt" / "config.json").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_names_the_metrics_file(tmp_path):
    """/dev/full fails every write with a real ENOSPC."""
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    log = MetricsLog(tmp_path, enabled=True)
    log.board = None  # TensorBoard's own files are not under test
    with pytest.raises(OSError) as error:
        log.write(1, {"train/loss": 1.0})
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(tmp_path / "metrics.jsonl")


# A writer of TARGET, of the KIND named, that stops in the middle of its write (its temporaries made, READY
# touched) until GO exists, then finishes. "replacing" stops atomic_directory between its two renames: the
# previous version moved aside into its `.old` folder, the new one not yet in place; "retiring" stops retire
# with the folder it deletes half deleted.
PAUSED_WRITER = """
import os, sys, time
from pathlib import Path
from vitkit import atomic
kind, target, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])

def pause():
    ready.touch()
    while not go.exists():
        time.sleep(0.01)

if kind == "atomic_file":
    with atomic.atomic_file(target) as handle:
        handle.write("first half, ")
        handle.flush()
        pause()
        handle.write("second half")
elif kind == "atomic_directory":
    with atomic.atomic_directory(target) as staging:
        (staging / "config.json").write_text("first half, ")
        pause()
        (staging / "model.safetensors").write_text("second half")
elif kind == "staging_beside":
    with atomic.staging_beside(target) as staging:
        (staging / "export").write_text("first half, ")
        pause()
        with open(staging / "export", "a") as handle:
            handle.write("second half")
        atomic.move_into_place((staging / "export", target))
elif kind == "retiring":
    def delete_half_then_pause(folder):
        next(folder.rglob("config.json")).unlink()
        pause()
    atomic.remove_tree = delete_half_then_pause
    atomic.retire(target)
else:
    replace = os.replace
    def pause_once_moved_aside(source, destination):
        replace(source, destination)
        if Path(destination).parent.name.endswith(".old"):
            pause()
    os.replace = pause_once_moved_aside
    with atomic.atomic_directory(target) as staging:
        (staging / "config.json").write_text(sys.argv[5])
"""


def paused_writer(kind: str, target, ready, *args) -> subprocess.Popen:
    """A writer of ``target`` in another process, stopped in the middle of its write once ``ready`` exists."""
    ready.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    writer = subprocess.Popen([sys.executable, "-c", PAUSED_WRITER, kind, str(target), str(ready), *map(str, args)],
                              env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not ready.exists():
        assert writer.poll() is None, writer.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the writer never reached the middle of its write"
        time.sleep(0.01)
    return writer


def temporaries(directory, name: str) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir() if entry.name.startswith(f".{name}."))


@pytest.mark.parametrize("kind", ["atomic_file", "atomic_directory", "staging_beside", "replacing"])
def test_sweep_keeps_a_live_writers_temporaries_and_clears_a_killed_ones_at_once(tmp_path, kind):
    folder, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    target = folder / "model"
    if kind == "replacing":
        with atomic_directory(target) as staging:
            (staging / "config.json").write_text("before")

    def next_writer_sweeps():  # as the next writer of target does before it starts
        if kind == "staging_beside":
            with staging_beside(target):
                pass
        else:
            sweep(folder)

    def landed() -> str:
        return target.read_text() if kind in ("atomic_file", "staging_beside") else "".join(
            (target / name).read_text() for name in ("config.json", "model.safetensors") if (target / name).exists())

    live = paused_writer(kind, target, ready, go, "after")
    held = temporaries(folder, target.name)
    assert held, "the writer made its temporary"
    next_writer_sweeps()
    assert temporaries(folder, target.name) == held, "a live writer's temporaries are kept"
    go.touch()
    _, err = live.communicate(timeout=240)
    assert live.returncode == 0, err[-3000:]
    whole = "after" if kind == "replacing" else "first half, second half"
    assert landed() == whole and temporaries(folder, target.name) == []

    go.unlink()
    killed = paused_writer(kind, target, ready, go, "never")
    assert temporaries(folder, target.name)
    killed.kill()
    assert killed.wait(timeout=60) == -signal.SIGKILL
    next_writer_sweeps()
    assert temporaries(folder, target.name) == [], "a killed writer's temporaries go at once, whatever their age"
    assert landed() == whole, "the version the killed writer was replacing is whole (put back if moved aside)"


def test_a_checkpoint_whose_deletion_was_cut_short_is_not_put_back(tmp_path):
    target = tmp_path / "step-00000010"
    with atomic_directory(target) as staging:
        (staging / "config.json").write_text("{}")
        (staging / "model.safetensors").write_text("weights")
    killed = paused_writer("retiring", target, tmp_path / "ready", tmp_path / "go")
    killed.kill()
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert not target.exists() and temporaries(tmp_path, target.name)
    sweep(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready"], "swept, not restored half deleted"


def test_no_writer_leaves_an_fd_open(tmp_path):
    def open_fds() -> list[str]:
        return sorted(os.listdir("/proc/self/fd"))

    before = open_fds()
    with atomic_file(tmp_path / "a.txt") as handle:
        handle.write("a")
    with pytest.raises(ValueError), atomic_file(tmp_path / "a.txt") as handle:
        raise ValueError("a failed write")
    for _ in range(2):  # made, then replaced
        with atomic_directory(tmp_path / "ckpt") as staging:
            (staging / "config.json").write_text("{}")
    with pytest.raises(ValueError), atomic_directory(tmp_path / "ckpt"):
        raise ValueError("a failed write")
    with pytest.raises(ValueError), staging_beside(tmp_path / "model.onnx"):
        raise ValueError("a failed export")
    retire(tmp_path / "ckpt")
    (tmp_path / ".b.txt.x1y2.tmp").write_text("a killed writer's")
    assert [p.name for p in sweep(tmp_path)] == [".b.txt.x1y2.tmp"]
    assert open_fds() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


# Sweeps FOLDER over and over (READY touched once it has begun) until STOP exists; prints how many times.
SWEEPER = """
import sys
from pathlib import Path
from vitkit.atomic import sweep
folder, ready, stop = map(Path, sys.argv[1:4])
sweeps = 0
while not stop.exists():
    sweep(folder)
    sweeps += 1
    ready.touch()
print(sweeps)
"""


def test_writers_racing_a_sweeper_never_lose_a_temporary(tmp_path):
    # A sweep can find a temporary between its making and its locking: the writer must then make another,
    # not write into one that was deleted under it.
    folder, ready, stop = tmp_path / "out", tmp_path / "ready", tmp_path / "stop"
    folder.mkdir()
    sweeper = subprocess.Popen([sys.executable, "-c", SWEEPER, str(folder), str(ready), str(stop)],
                               env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        while not ready.exists():
            assert sweeper.poll() is None, sweeper.stderr.read()[-3000:]
            time.sleep(0.01)
        writes, end = 0, time.monotonic() + 3
        while time.monotonic() < end:
            with atomic_file(folder / "f.txt") as handle:
                handle.write(str(writes))
            with atomic_directory(folder / "ckpt") as staging:
                (staging / "config.json").write_text(str(writes))
            writes += 1
    finally:
        stop.touch()
        out, err = sweeper.communicate(timeout=60)
    assert sweeper.returncode == 0, err[-3000:]
    assert int(out) > 100 and writes > 100, "both were at work at once"
    assert (folder / "f.txt").read_text() == (folder / "ckpt" / "config.json").read_text() == str(writes - 1)


def test_without_flock_writes_land_and_sweep_goes_by_age(tmp_path, monkeypatch):
    """A file system without flock (NFS refuses an exclusive lock on a file opened read-only, with ENOLCK):
    writers go on unguarded, and sweep can only tell a killed writer's temporary by its age."""
    import types

    from vitkit import atomic

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(atomic, "fcntl", types.SimpleNamespace(LOCK_EX=2, LOCK_NB=4, flock=no_flock))
    with atomic_file(tmp_path / "a.txt") as handle:
        handle.write("whole")
    with atomic_directory(tmp_path / "run", allowed_existing=()) as staging:
        (staging / "weights").write_text("w")
    assert (tmp_path / "a.txt").read_text() == "whole" and (tmp_path / "run" / "weights").read_text() == "w"
    recent, old = tmp_path / ".b.txt.1234.tmp", tmp_path / ".c.txt.5678.tmp"
    recent.write_text("a live writer's, maybe")
    old.write_text("a killed writer's")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert sweep(tmp_path, min_age_s=3600) == [old] and recent.exists()
    assert sweep(tmp_path) == [recent]
