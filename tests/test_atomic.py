"""Atomic writes after a crash: leftovers swept (those of killed writers only), a published version moved in
whole, a full disk named."""

import errno
import fcntl
import os
import shutil
import signal
import subprocess
import time
import types
from pathlib import Path

import pytest
from launch import start_until_ready

from vitkit import atomic
from vitkit.atomic import atomic_directory, atomic_file, move_group_into_place, retire, staging_beside, sweep
from vitkit.train.metrics_log import MetricsLog


def test_sweep_moves_a_published_version_in_and_clears_temporaries(tmp_path):
    # The state a kill leaves once atomic_directory has published the new `best` (renamed its staging folder to
    # `.best.ready`) but not yet moved it in; plus a killed staging folder, an interrupted file write, and the
    # `.old` folder that earlier versions of vitkit moved a replaced version into (deleted, never put back).
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "config.json").write_text("old")
    (tmp_path / ".best.ready" / "best").mkdir(parents=True)
    (tmp_path / ".best.ready" / "best" / "config.json").write_text("new")
    (tmp_path / ".best.k3j2.old" / "best").mkdir(parents=True)
    (tmp_path / ".best.k3j2.old" / "best" / "config.json").write_text("older")
    (tmp_path / ".best.x9a1.tmp").mkdir()
    (tmp_path / ".best.x9a1.tmp" / "config.json").write_text("half")
    (tmp_path / ".summary.json.q0w9.tmp").write_text("{")
    (tmp_path / ".hidden-but-ours-not").write_text("kept")
    removed = sweep(tmp_path)
    assert (tmp_path / "best" / "config.json").read_text() == "new"
    assert sorted(p.name for p in removed) == [".best.k3j2.old", ".best.ready", ".best.x9a1.tmp",
                                               ".summary.json.q0w9.tmp"]
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
# touched) until GO exists, then finishes. "replacing" stops atomic_directory once it has published the new
# version (`.model.ready`) and moved the previous one aside to delete it, the new one not yet in place; "retiring"
# stops retire with the folder it deletes half deleted.
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
    def pause_once_moved_aside(source, destination, **fds):
        replace(source, destination, **fds)
        if Path(destination).parent.name.endswith(".tmp"):
            pause()
    os.replace = pause_once_moved_aside
    with atomic.atomic_directory(target) as staging:
        (staging / "config.json").write_text(sys.argv[5])
"""


def paused_writer(kind: str, target, ready, *args) -> subprocess.Popen:
    """A writer of ``target`` in another process, stopped in the middle of its write once ``ready`` exists."""
    return start_until_ready(PAUSED_WRITER, ready, kind, target, ready, *args)


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
    if kind == "replacing":
        assert landed() == "never", "the version the killed writer published is moved in, whole"
    else:
        assert landed() == whole, "the version the killed writer was replacing is whole"


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


def open_fds() -> list[str]:
    return sorted(os.listdir("/dev/fd"))


def test_no_writer_leaves_an_fd_open(tmp_path):
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


# Sweeps FOLDER over and over (READY touched once it has begun) until STOP exists.
SWEEPER = """
import sys
from pathlib import Path
from vitkit.atomic import sweep
folder, ready, stop = map(Path, sys.argv[1:4])
while not stop.exists():
    sweep(folder)
    ready.touch()
"""


def test_writers_racing_a_sweeper_never_lose_a_temporary(tmp_path):
    # A sweep can find a temporary between its making and its locking: the writer must then make another,
    # not write into one that was deleted under it. (How often this race is hit depends on the machine; the
    # test below makes it certain.)
    folder, ready, stop = tmp_path / "out", tmp_path / "ready", tmp_path / "stop"
    folder.mkdir()
    sweeper = start_until_ready(SWEEPER, ready, folder, ready, stop)
    try:
        deadline = time.monotonic() + 30
        for writes in range(1, 101):
            with atomic_file(folder / "f.txt") as handle:
                handle.write(str(writes))
            with atomic_directory(folder / "ckpt") as staging:
                (staging / "config.json").write_text(str(writes))
            if time.monotonic() > deadline:
                break
    finally:
        stop.touch()
        _, err = sweeper.communicate(timeout=60)
    assert sweeper.returncode == 0, err[-3000:]
    assert (folder / "f.txt").read_text() == (folder / "ckpt" / "config.json").read_text() == str(writes)


def swept_before_locked(monkeypatch, folder: Path, times: float) -> list[int]:
    """Make the first ``times`` temporaries a writer makes in ``folder`` be swept (by a real sweep) between their
    making and their locking, the race a sweeper running beside the writer can hit: atomic's ``fcntl.flock``
    sweeps first when a writer asks for its blocking lock. The fds it was asked to lock, one per temporary."""
    real, asked = fcntl.flock, []

    def flock(fd, operation):
        if operation == fcntl.LOCK_EX:  # a writer holding its new temporary (a sweep asks LOCK_EX | LOCK_NB)
            asked.append(fd)
            assert len(asked) <= 1000, "temporaries made again without end"
            if len(asked) <= times:
                sweep(folder)
        real(fd, operation)
    monkeypatch.setattr(atomic, "fcntl", types.SimpleNamespace(LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB,
                                                               flock=flock))
    return asked


@pytest.mark.parametrize("write", [atomic_file, atomic_directory])
def test_a_temporary_swept_before_its_writer_locked_it_is_made_again(tmp_path, monkeypatch, write):
    asked = swept_before_locked(monkeypatch, tmp_path, times=1)
    with write(tmp_path / "a") as made:
        if write is atomic_file:
            made.write("whole")
        else:
            (made / "config.json").write_text("whole")
    assert len(asked) == 2, "a second temporary was made"
    landed = tmp_path / "a" if write is atomic_file else tmp_path / "a" / "config.json"
    assert landed.read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["a"]


@pytest.mark.parametrize("write", [atomic_file, atomic_directory])
def test_a_writer_whose_temporaries_are_always_swept_gives_up_naming_the_folder(tmp_path, monkeypatch, write):
    asked = swept_before_locked(monkeypatch, tmp_path, times=float("inf"))
    before = open_fds()
    with pytest.raises(OSError, match="swept before they could be locked") as error, write(tmp_path / "a"):
        pass
    assert error.value.filename == str(tmp_path) and len(asked) == atomic._TRIES
    assert open_fds() == before and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("write", [atomic_file, atomic_directory, staging_beside])
def test_an_interrupt_while_waiting_for_the_lock_leaves_no_fd_and_no_temporary(tmp_path, monkeypatch, write):
    def interrupted(fd, operation):
        raise KeyboardInterrupt  # Ctrl-C while blocked in flock
    monkeypatch.setattr(atomic, "fcntl", types.SimpleNamespace(LOCK_EX=2, LOCK_NB=4, flock=interrupted))
    before = open_fds()
    with pytest.raises(KeyboardInterrupt), write(tmp_path / "a"):
        pass
    assert open_fds() == before and list(tmp_path.iterdir()) == []


def test_a_failed_retire_leaves_no_temporary(tmp_path):
    with pytest.raises(FileNotFoundError):
        retire(tmp_path / "never-made")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [errno.EMFILE, errno.ENFILE, errno.EACCES], ids=errno.errorcode.get)
def test_a_temporary_that_sweep_cannot_open_is_kept(tmp_path, monkeypatch, error):
    """``os.open`` made to fail as it does in a process out of fds, a system out of them, or on another user's
    private (0600) temporary: none of which we can make here (the tests may run as root, with fds to spare)."""
    real_open = os.open

    def cannot_open(path, flags, *args, **kwargs):
        if os.path.basename(path).startswith(".a.txt."):
            raise OSError(error, os.strerror(error), path)
        return real_open(path, flags, *args, **kwargs)
    with atomic_file(tmp_path / "a.txt") as handle:
        handle.write("whole")
        with monkeypatch.context() as patched:
            patched.setattr(os, "open", cannot_open)
            assert sweep(tmp_path) == []
    assert (tmp_path / "a.txt").read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_link_named_as_a_temporary_goes_alone(tmp_path):
    # A hostile `.ready` link: were it followed, what the folder it points to holds would be moved into the swept one.
    victim, folder = tmp_path / "victim", tmp_path / "run"
    (victim / "x").mkdir(parents=True)
    (victim / "x" / "config.json").write_text("theirs")
    folder.mkdir()
    (folder / ".x.ready").symlink_to(victim)
    (folder / ".y.abc.tmp").symlink_to(victim / "x")
    assert sorted(p.name for p in sweep(folder)) == [".x.ready", ".y.abc.tmp"]
    assert list(folder.iterdir()) == [] and (victim / "x" / "config.json").read_text() == "theirs"


def test_a_link_swapped_in_after_the_lock_moves_nothing(tmp_path, monkeypatch):
    """The ``.ready`` folder is swapped for a link from inside sweep's ``flock``, once its lock is taken: the
    moment an attacker (or a writer renaming its temporary) would have to hit, made certain."""
    victim, folder = tmp_path / "victim", tmp_path / "run"
    (victim / "x").mkdir(parents=True)
    (victim / "x" / "config.json").write_text("theirs")
    (folder / ".x.ready" / "x").mkdir(parents=True)
    real = fcntl.flock

    def swap_after_locking(fd, operation):
        real(fd, operation)
        monkeypatch.setattr(fcntl, "flock", real)
        (folder / ".x.ready").rename(tmp_path / "elsewhere")
        (folder / ".x.ready").symlink_to(victim)
    monkeypatch.setattr(fcntl, "flock", swap_after_locking)
    assert sweep(folder) == [], "what was locked is no longer there: nothing done"
    assert [p.name for p in folder.iterdir()] == [".x.ready"] and (victim / "x" / "config.json").exists()


def test_two_sweeps_at_once_remove_and_report_a_temporary_once(tmp_path, monkeypatch):
    """The other sweep runs from inside this one's ``flock``, between its open and its lock: an interleaving of
    two sweeping processes, made certain."""
    killed = tmp_path / ".a.txt.x1y2.tmp"
    killed.write_text("a killed writer's")
    real, other = fcntl.flock, []

    def another_sweep_first(fd, operation):
        monkeypatch.setattr(fcntl, "flock", real)
        other.extend(sweep(tmp_path))
        real(fd, operation)
    monkeypatch.setattr(fcntl, "flock", another_sweep_first)
    assert sweep(tmp_path) == [] and other == [killed] and not killed.exists()


def test_a_writer_moves_in_an_earlier_publication_of_its_target_before_its_own(tmp_path):
    """A killed writer published `ckpt` (its `.ckpt.ready` holds it whole) but never moved it in: the next writer of
    `ckpt` finishes that one first, then publishes its own; nothing is left beside it."""
    (tmp_path / ".ckpt.ready" / "ckpt").mkdir(parents=True)
    (tmp_path / ".ckpt.ready" / "ckpt" / "config.json").write_text("killed")
    with atomic_directory(tmp_path / "ckpt") as staging:
        (staging / "config.json").write_text("new")
    assert (tmp_path / "ckpt" / "config.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_a_writer_waits_for_a_live_publication_of_its_target_then_lands_after_it(tmp_path):
    """A live writer is stopped half-way through moving its published version in (the previous one moved aside,
    the new one not yet in place): a second writer of the same target waits for it, and lands last."""
    import threading

    folder, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    target = folder / "model"
    with atomic_directory(target) as staging:
        (staging / "config.json").write_text("before")
    live = paused_writer("replacing", target, ready, go, "first")

    def second_writer():
        with atomic_directory(target) as staging:
            (staging / "config.json").write_text("second")
    second = threading.Thread(target=second_writer)
    second.start()
    second.join(timeout=2)
    assert second.is_alive() and not target.exists(), "the second writer waits while the first moves its version in"
    go.touch()
    _, err = live.communicate(timeout=240)
    assert live.returncode == 0, err[-3000:]
    second.join(timeout=60)
    assert not second.is_alive() and (target / "config.json").read_text() == "second"
    assert temporaries(folder, target.name) == []


def test_an_old_version_whose_deletion_failed_is_never_put_back(tmp_path, monkeypatch):
    """``shutil.rmtree`` made to fail half-way, as it does with EBUSY (a folder NFS still holds open as
    ``.nfsXXXX``): a file-system property we cannot make here (the tests may run as root, who deletes anything)."""
    target = tmp_path / "step-1"
    with atomic_directory(target) as staging:
        (staging / "config.json").write_text("1")
        (staging / "model.safetensors").write_text("weights 1")

    def half_then_busy(path, *args, **kwargs):
        next(Path(path).rglob("model.safetensors")).unlink()
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
    with monkeypatch.context() as patched:
        patched.setattr(shutil, "rmtree", half_then_busy)
        with pytest.warns(UserWarning, match="could not delete"), atomic_directory(target) as staging:
            (staging / "config.json").write_text("2")
            (staging / "model.safetensors").write_text("weights 2")
    assert (target / "model.safetensors").read_text() == "weights 2"
    retire(target)  # pruned later
    sweep(tmp_path)
    assert list(tmp_path.iterdir()) == [], "the half-deleted version 1 is not put back"


def test_replacing_a_version_makes_no_folder_but_its_staging_and_the_old_ones_deletion(tmp_path, monkeypatch):
    """A disk full once the new version is written (``mkdir`` failing with ENOSPC, made so here: root may fill no
    disk in a test): publishing and moving it in make no further folder, so the save stands and nothing is left."""
    import tempfile

    target = tmp_path / "step-1"
    with atomic_directory(target) as staging:
        (staging / "model.safetensors").write_text("weights 1")
    made, real = [], tempfile.mkdtemp

    def two_folders_then_full(*args, **kwargs):  # the staging folder and the old version's, then no space
        made.append(args)
        if len(made) > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)
    monkeypatch.setattr(tempfile, "mkdtemp", two_folders_then_full)
    with atomic_directory(target, allowed_existing=("model.safetensors",)) as staging:
        (staging / "model.safetensors").write_text("weights 2")
    assert (target / "model.safetensors").read_text() == "weights 2" and list(tmp_path.iterdir()) == [target]


def test_a_published_version_that_cannot_be_moved_in_yet_waits_for_the_next_sweep(tmp_path, monkeypatch):
    """Moving the previous version aside refused (EIO, made so here) once the new one is published: the save fails
    naming its target, the previous version is still in place, and the next sweep moves the published one in."""
    target = tmp_path / "step-1"
    with atomic_directory(target) as staging:
        (staging / "model.safetensors").write_text("weights 1")
    real = os.replace

    def refuse_to_move_aside(source, destination, *args, **kwargs):
        if Path(destination).parent.name.endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(source, destination, *args, **kwargs)
    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", refuse_to_move_aside)
        with pytest.raises(OSError) as error, atomic_directory(target, allowed_existing=("model.safetensors",)) as staging:
            (staging / "model.safetensors").write_text("weights 2")
    assert error.value.errno == errno.EIO and error.value.filename == str(target)
    assert (target / "model.safetensors").read_text() == "weights 1"
    assert [p.name for p in sweep(tmp_path)] == [".step-1.ready"]
    assert list(tmp_path.iterdir()) == [target] and (target / "model.safetensors").read_text() == "weights 2"


def test_a_free_lock_is_not_enough_where_an_age_is_asked(tmp_path):
    # Where locks are seen only by the machine that took them (NFS with local_lock=flock), a free lock may be a
    # live writer's on another machine: callers that pass min_age_s (the caches) want both.
    recent = tmp_path / ".b.txt.1234.tmp"
    recent.write_text("a killed writer's, or another machine's live one")
    assert sweep(tmp_path, min_age_s=3600) == [] and recent.exists()
    os.utime(recent, (time.time() - 7200, time.time() - 7200))
    assert sweep(tmp_path, min_age_s=3600) == [recent]


@pytest.mark.parametrize("error", [errno.EBADF, errno.ENOLCK, errno.ENOSYS], ids=errno.errorcode.get)
def test_without_flock_writes_land_and_sweep_goes_by_age(tmp_path, monkeypatch, error):
    """A file system without flock, simulated: NFS refuses an exclusive lock on a file opened read-only (EBADF),
    or has no lock daemon (ENOLCK); Lustre mounted without ``-o flock`` has none (ENOSYS). Writers go on
    unguarded, and sweep can only tell a killed writer's temporary by its age."""
    def no_flock(fd, operation):
        raise OSError(error, os.strerror(error))
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


def test_a_published_group_is_moved_in_by_sweep_its_named_file_last(tmp_path):
    """A kill while a group is moved in (its weights in place, its graph not yet) leaves its ``.ready`` folder: the
    next sweep moves the rest in, so the graph and its weights are the new pair."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "g.bin").write_text("new weights")  # moved in before the kill
    (folder / "g.xml").write_text("old graph")
    (folder / ".g.xml.ready").mkdir()
    (folder / ".g.xml.ready" / "g.xml").write_text("new graph")
    assert sweep(folder) == [folder / ".g.xml.ready"]
    assert sorted(p.name for p in folder.iterdir()) == ["g.bin", "g.xml"]
    assert (folder / "g.bin").read_text() == "new weights" and (folder / "g.xml").read_text() == "new graph"


def test_a_group_is_moved_in_in_order_the_named_file_last(tmp_path, monkeypatch):
    """Each rename into place, recorded: the weights land before the graph that a reader opens, so a graph is never
    beside weights older than itself."""
    for name, text in (("new.bin", "new weights"), ("new.xml", "new graph")):
        (tmp_path / name).write_text(text)
    real, landed = os.replace, []

    def recorded(source, destination, *args, **kwargs):
        real(source, destination, *args, **kwargs)
        if Path(destination).parent == tmp_path:
            landed.append(Path(destination).name)
    monkeypatch.setattr(os, "replace", recorded)
    move_group_into_place((tmp_path / "new.bin", tmp_path / "g.bin"), (tmp_path / "new.xml", tmp_path / "g.xml"))
    assert landed == ["g.bin", "g.xml"]


def test_a_group_moved_into_place_leaves_nothing_aside(tmp_path):
    (tmp_path / "g.bin").write_text("old")
    for name, text in (("new.bin", "new weights"), ("new.xml", "new graph")):
        (tmp_path / name).write_text(text)
    move_group_into_place((tmp_path / "new.bin", tmp_path / "g.bin"), (tmp_path / "new.xml", tmp_path / "g.xml"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.bin", "g.xml"]
    assert (tmp_path / "g.bin").read_text() == "new weights" and (tmp_path / "g.xml").read_text() == "new graph"
