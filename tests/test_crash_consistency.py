"""Kill a real `vitkit train` (SIGKILL at chosen and random moments, inside checkpoint writes and the final
export; SIGTERM and SIGINT), resume it each time, and check it against an uninterrupted run: the weights
bit for bit, every step once in metrics.jsonl, the same summary.json."""

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from launch import TORCHRUN, child_env

TINY = {"patch_size": 2, "dim": 16, "depth": 2, "num_heads": 2, "mlp_dim": 32, "in_chans": 1, "pool": "gap",
        "dropout": 0.1}
TRAIN = ["--model-args", json.dumps(TINY), "--steps", "60", "--batch-size", "32", "--checkpoint-every", "1",
         "--eval-every", "20", "--log-every", "1", "--threads", "1", "--aug-level", "light2"]
ENV = child_env()


def start(run_dir: Path, sigint=signal.SIG_DFL) -> subprocess.Popen:
    """The run, with SIGINT as a terminal's foreground job has it (``sigint``), whatever this process has: a
    shell's background job, as pytest may be, ignores it."""
    resume = ["--resume"] if (run_dir / "recipe.json").exists() else []
    return subprocess.Popen([sys.executable, "-m", "vitkit", "train", *TRAIN, "--run-dir", str(run_dir), *resume],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def staging(run_dir: Path, name: str) -> set[str]:
    """The hidden temporaries of ``name`` (a checkpoint being written, the final model) that exist now."""
    found = set()
    for folder in (run_dir, run_dir / "checkpoints"):
        try:
            found |= {entry for entry in os.listdir(folder) if entry.startswith(f".{name}") and entry.endswith(".tmp")}
        except FileNotFoundError:
            pass
    return found


def writing(name: str):
    """A moment: a new temporary of ``name`` appeared (not one that an earlier kill left behind)."""
    def when(run_dir: Path) -> bool:
        if not hasattr(when, "left"):
            when.left = staging(run_dir, name)
        return bool(staging(run_dir, name) - when.left)
    return when


def interrupt(run_dir: Path, when, signum=signal.SIGKILL, timeout=120.0, sigint=signal.SIG_DFL) -> tuple[int, str]:
    """Start (or resume) the run, send ``signum`` as soon as ``when(run_dir)`` holds; (status, stderr)."""
    process = start(run_dir, sigint)
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if when(run_dir):
            process.send_signal(signum)
            break
        time.sleep(0.0005)
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "train/images_per_s"} for line in lines]


def summary(run_dir: Path) -> dict:
    data = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in data.items() if k not in ("train_seconds", "run_dir")}


def test_killed_and_resumed_run_equals_an_uninterrupted_one(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    status, err = interrupt(straight, lambda _: False)
    assert status == 0, err[-2000:]

    moment = random.Random(0)

    def logged(run_dir: Path) -> int:
        try:
            return (run_dir / "metrics.jsonl").read_text().count("\n")
        except FileNotFoundError:
            return 0

    def at_random(low: int, high: int):
        """A moment: a random number of steps into the run (as metrics.jsonl shows), plus up to 20 ms."""
        target, delay = moment.randint(low, high), moment.uniform(0.0, 0.02)

        def when(run_dir: Path) -> bool:
            if logged(run_dir) >= target and not hasattr(when, "seen"):
                when.seen = time.monotonic()
            return hasattr(when, "seen") and time.monotonic() - when.seen >= delay
        return when

    def write_after(records: int):
        """A moment: inside a checkpoint write, once metrics.jsonl holds ``records`` lines."""
        inside = writing("step-")
        return lambda run_dir: inside(run_dir) and logged(run_dir) >= records

    def training(run_dir: Path) -> bool:
        """A moment: metrics.jsonl has grown past what it held at the start, so the run is training."""
        if not hasattr(training, "start"):
            training.start = logged(run_dir)
        return logged(run_dir) > training.start

    plan = [
        ("after the first step, before or in the first checkpoint", lambda d: logged(d) >= 1),
        ("inside a checkpoint write", write_after(10)),
        ("at a random step", at_random(12, 40)),
        ("inside a checkpoint write", write_after(45)),
        ("inside the final export", writing("model")),
    ]
    inside_writes = 0
    for what, when in plan:
        status, err = interrupt(killed, when)
        if status == 0:
            break  # the run ended before the moment came
        assert status == -signal.SIGKILL, (what, err[-2000:])
        inside_writes += bool(staging(killed, "step-") | staging(killed, "model"))
    assert inside_writes >= 2  # kills that left a half-written checkpoint or model behind

    # A preemption notice (SIGTERM) saves a checkpoint and ends the process as SIGTERM would (status 143).
    if not (killed / "summary.json").exists():
        status, err = interrupt(killed, training, signal.SIGTERM)
        assert status == -signal.SIGTERM and "SIGTERM: saved a checkpoint" in err or status == 0, err[-2000:]
    status, err = interrupt(killed, lambda _: False)
    assert status == 0, err[-2000:]

    ours, theirs = (load_file(run / "model" / "model.safetensors") for run in (killed, straight))
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)
    steps = [r["step"] for r in records(killed) if "train/loss" in r]
    assert steps == list(range(1, 61))
    assert records(killed) == records(straight)
    assert summary(killed) == summary(straight) and "train/loss" in summary(killed)
    leftovers = [p.name for folder in (killed, killed / "checkpoints") for p in folder.iterdir()
                 if p.name.startswith(".")]
    assert leftovers == []


def test_sigterm_and_sigint_save_then_stop(tmp_path):
    """Both signals leave a checkpoint of the step where they arrived; SIGINT exits 130, SIGTERM as itself."""
    run_dir = tmp_path / "run"
    first_record = lambda d: (d / "metrics.jsonl").exists() and (d / "metrics.jsonl").stat().st_size > 0  # noqa
    status, err = interrupt(run_dir, first_record, signal.SIGTERM)
    assert status == -signal.SIGTERM, err[-2000:]
    assert "SIGTERM: saved a checkpoint at step" in err
    step = int(err.split("saved a checkpoint at step ")[1].split()[0])
    assert (run_dir / "checkpoints" / f"step-{step:08d}" / "training_state.pt").is_file()
    status, err = interrupt(run_dir, lambda d: len(records(d)) > step + 1, signal.SIGINT)
    assert status == 130, err[-2000:]
    assert "SIGINT: saved a checkpoint" in err and "interrupted" in err
    # The advice names the newest checkpoint and a command that can be pasted as it is, which finishes the run.
    second = int(err.split("SIGINT: saved a checkpoint at step ")[1].split()[0])
    advice = err.split(f"SIGINT: saved a checkpoint at step {second} of 60; ")[1].splitlines()[0]
    command, checkpoint = advice.split(" continues the run from ")
    assert checkpoint == str(run_dir / "checkpoints" / f"step-{second:08d}") and second > step
    hint = shlex.split(command)
    assert hint == ["vitkit", "train", "--run-dir", str(run_dir), "--resume"]
    resumed = subprocess.run([sys.executable, "-m", *hint], env=ENV, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0 and (run_dir / "summary.json").is_file(), resumed.stderr[-2000:]


def test_a_run_started_ignoring_sigint_goes_on_ignoring_it(tmp_path):
    """A background job of a shell starts with SIGINT ignored: the run keeps to that, and neither
    stops nor saves a checkpoint at every later step (it did: it noted the signal, then delivered it to no effect)."""
    run_dir = tmp_path / "run"
    first_record = lambda d: (d / "metrics.jsonl").exists() and (d / "metrics.jsonl").stat().st_size > 0  # noqa
    status, err = interrupt(run_dir, first_record, signal.SIGINT, sigint=signal.SIG_IGN)
    assert status == 0 and "SIGINT" not in err, err[-2000:]
    assert (run_dir / "summary.json").is_file()


def test_sigterm_under_torchrun_saves_on_every_rank_then_resumes(tmp_path):
    """torchrun forwards SIGTERM to both ranks; they agree on one step, save it together, and the resumed
    run logs every step once."""
    run_dir = tmp_path / "run"
    every_step = TRAIN.index("--checkpoint-every") + 1
    train = [*TRAIN[:every_step], "0", *TRAIN[every_step + 1:]]  # no checkpoint but the one SIGTERM asks for
    command = [*TORCHRUN, "-m", "vitkit", "train", *train, "--run-dir", str(run_dir)]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists() or not records(run_dir):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-2000:]
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert "SIGTERM: saved a checkpoint at step" in err, err[-2000:]
    step = int(err.split("saved a checkpoint at step ")[1].split()[0])
    assert 1 <= step < 60 and [p.name for p in (run_dir / "checkpoints").iterdir()] == [f"step-{step:08d}"]
    resumed = subprocess.run([*command, "--resume"], env=ENV, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in records(run_dir) if "train/loss" in r] == list(range(1, 61))
