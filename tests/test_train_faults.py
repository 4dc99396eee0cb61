"""Faults in distributed runs, with `torchrun --nnodes 2` played on one machine: two agents (one rank each) meet
at a c10d rendezvous on localhost and train over gloo. A rank killed mid-run ends the other with one line, and
the run resumed from its last checkpoint ends with the weights of a run never killed; a rank dying while the
other writes a checkpoint leaves the checkpoints before it whole; a run resumed on another number of ranks
sees each sample once an epoch, the uninterrupted run's samples at every step, and its loss curve."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from data_helpers import mnist_folder
from launch import child_env, launch
from safetensors.torch import load_file

from vitkit.train.checkpointing import list_checkpoints, load_checkpoint
from vitkit.train.presets import read_config_file
from vitkit.train.recipes import Recipe
from vitkit.train.run import prepare

# The digits preset's stochastic depth off: one process and two ranks draw its masks from different streams.
MODEL = json.dumps({"patch_size": 2, "dim": 16, "depth": 2, "num_heads": 2, "mlp_dim": 32, "in_chans": 1,
                    "drop_path": 0})
TRAIN = ["train", "--dataset", "digits", "--model-args", MODEL, "--optimizer", "sgd", "--lr", "0.3", "--warmup-steps",
         "1", "--threads", "1", "--log-every", "1", "--num-workers", "0", "--keep-last", "0"]
KILLED = [*TRAIN, "--steps", "16", "--batch-size", "32", "--checkpoint-every", "2"]
TIMEOUT = 240  # as launch.py: the machine may be shared


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def children(pid: int) -> list[int]:
    """The processes ``pid`` has started (Linux's ``/proc``)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += map(int, (task / "children").read_text().split())
    return found


class TwoNodes:
    """Two torchrun agents of one rank each, as on two machines; each worker's stderr and each agent's go to files
    under ``logs``."""

    started: list[subprocess.Popen] = []

    def __init__(self, logs: Path, *command):
        agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{free_port()}", "--rdzv-id", "faults",
                 "--redirects", "3"]
        self.logs = logs
        logs.mkdir(parents=True)
        self.agents = []
        for node in (0, 1):
            with (logs / f"agent-{node}.log").open("w") as log:
                self.agents.append(subprocess.Popen([*agent, "--log-dir", str(logs / f"node-{node}"),
                                                     *map(str, command)], env=child_env(), stdout=log, stderr=log,
                                                    start_new_session=True))
        TwoNodes.started += self.agents

    def wait(self) -> list[int]:
        """The agents' exit statuses, once both have ended."""
        return [agent.wait(timeout=TIMEOUT) for agent in self.agents]

    def succeed(self) -> None:
        codes = self.wait()
        assert codes == [0, 0], [self.stderr(node)[-3000:] for node in (0, 1)]

    def worker(self, rank: int) -> tuple[int, int]:
        """(the node, the process id) of the worker of ``rank``: the rendezvous decides which agent starts which."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            for node, agent in enumerate(self.agents):
                for pid in children(agent.pid):
                    with contextlib.suppress(OSError):  # a child that has just ended
                        if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                            return node, pid
            time.sleep(0.01)
        raise AssertionError(f"no worker of rank {rank} started")

    def kill(self, rank: int) -> int:
        """SIGKILL the worker of ``rank``; the node it ran on."""
        node, pid = self.worker(rank)
        os.kill(pid, signal.SIGKILL)
        return node

    def stderr(self, node: int) -> str:
        """What the worker of ``node`` wrote on stderr (torchrun keeps it under ``--log-dir``)."""
        return "".join(path.read_text() for path in sorted((self.logs / f"node-{node}").glob("**/stderr.log")))


@pytest.fixture(autouse=True)
def _no_agent_left():
    """A test that failed midway leaves no agent or worker of its own running."""
    yield
    for agent in TwoNodes.started:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def steps_logged(run_dir: Path) -> int:
    try:
        return (run_dir / "metrics.jsonl").read_text().count("\n")
    except FileNotFoundError:
        return 0


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "train/images_per_s"} for line in lines]


def assert_same_weights(ours: Path, theirs: Path) -> None:
    mine, reference = (load_file(run / "model" / "model.safetensors") for run in (ours, theirs))
    assert mine.keys() == reference.keys() and all(mine[k].equal(reference[k]) for k in mine)


def assert_one_line(stderr: str, rank: int, run_dir: Path) -> None:
    """The surviving rank says in one line that a rank was lost and which checkpoint ``--resume`` continues
    from (the newest), without a traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("vitkit train: error:")]
    assert "Traceback" not in stderr and len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith(f"vitkit train: error: rank {rank} of 2: another rank is gone ("), errors[0]
    assert errors[0].endswith(f"--resume continues the run from {list_checkpoints(run_dir)[-1]}"), errors[0]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("faults") / "uninterrupted"
    TwoNodes(run_dir.parent / "logs", "-m", "vitkit", *KILLED, "--run-dir", run_dir).succeed()
    return run_dir


def test_a_rank_killed_mid_run_ends_the_other_in_one_line_and_the_resumed_run_is_exact(tmp_path, uninterrupted):
    """SIGKILL to the main rank a few steps in (it may be writing metrics or a checkpoint): the other rank stops at
    its next collective, saying where to resume from; resumed, the run logs each step once and ends with the
    uninterrupted run's weights, bit for bit."""
    run_dir = tmp_path / "run"
    nodes = TwoNodes(tmp_path / "killed", "-m", "vitkit", *KILLED, "--run-dir", run_dir)
    deadline = time.monotonic() + TIMEOUT
    while steps_logged(run_dir) < 3:
        assert time.monotonic() < deadline and all(agent.poll() is None for agent in nodes.agents)
        time.sleep(0.002)
    node = nodes.kill(0)  # the main rank: the one writing checkpoints and metrics
    codes = nodes.wait()
    assert codes[node] != 0 and codes[1 - node] != 0
    assert_one_line(nodes.stderr(1 - node), 1, run_dir)

    TwoNodes(tmp_path / "resumed", "-m", "vitkit", *KILLED, "--run-dir", run_dir, "--resume").succeed()
    assert_same_weights(run_dir, uninterrupted)
    assert records(run_dir) == records(uninterrupted)


WRITES_SLOWLY = """
import sys
import time
from pathlib import Path
import vitkit.train.checkpointing as checkpointing
from vitkit.cli import program

ready, go, held = Path(sys.argv[1]), Path(sys.argv[2]), f"step-{int(sys.argv[3]):08d}"
write = checkpointing.save_native


def half_then_wait(staging, *args, **kwargs):
    write(staging, *args, **kwargs)  # the model is written, the training state is not
    if held in staging.name:
        ready.touch()
        while not go.exists():
            time.sleep(0.01)


checkpointing.save_native = half_then_wait
sys.argv = ["vitkit", *sys.argv[4:]]
program()
"""


def test_a_rank_dying_while_a_checkpoint_is_written_leaves_the_earlier_ones_whole(tmp_path, uninterrupted):
    """Rank 1 is killed while rank 0 is halfway through the step-4 checkpoint. Every checkpoint listed then loads
    (the one being written is either complete or not there), step 2's is the uninterrupted run's, and the run
    resumes to the uninterrupted run's weights."""
    script, ready, go, run_dir = tmp_path / "writes_slowly.py", tmp_path / "ready", tmp_path / "go", tmp_path / "run"
    script.write_text(WRITES_SLOWLY)
    nodes = TwoNodes(tmp_path / "killed", script, ready, go, 4, *KILLED, "--run-dir", run_dir)
    deadline = time.monotonic() + TIMEOUT
    while not ready.exists():
        assert time.monotonic() < deadline and all(agent.poll() is None for agent in nodes.agents)
        time.sleep(0.01)
    node = nodes.kill(1)
    nodes.agents[node].wait(timeout=TIMEOUT)  # its agent has seen it die
    go.touch()
    nodes.wait()
    assert_one_line(nodes.stderr(1 - node), 0, run_dir)

    found = list_checkpoints(run_dir)
    assert run_dir / "checkpoints" / "step-00000002" in found
    recipe = Recipe.from_dict(read_config_file(run_dir / "recipe.json")).replace(run={"dir": str(tmp_path / "loader")})
    experiment = prepare(recipe)
    for path in found:  # whole: each loads into a model and optimiser of the run, at its step
        state = load_checkpoint(path, experiment.trainer.model, experiment.trainer.optimizer)
        assert state["step"] == int(path.name.split("-")[1])
    ours, theirs = (load_file(run / "checkpoints" / "step-00000002" / "model.safetensors")
                    for run in (run_dir, uninterrupted))
    assert all(ours[key].equal(theirs[key]) for key in theirs)

    TwoNodes(tmp_path / "resumed", "-m", "vitkit", *KILLED, "--run-dir", run_dir, "--resume").succeed()
    assert_same_weights(run_dir, uninterrupted)
    assert records(run_dir) == records(uninterrupted)


RECORDS_SAMPLES = """
import json
import sys
from pathlib import Path
from vitkit.cli import program
from vitkit.data import loading

folder, iterate = Path(sys.argv[1]), loading.StepSampler.__iter__


def recorded(self):
    \"\"\"The keys (index, epoch) of each step this rank reads, one JSON line a step.\"\"\"
    folder.mkdir(exist_ok=True)
    with (folder / f"rank-{self.rank}.jsonl").open("a") as seen:
        for step, keys in enumerate(iterate(self), self.start_step):  # one micro-batch a step
            seen.write(json.dumps({"step": step, "keys": keys}) + "\\n")
            seen.flush()
            yield keys


loading.StepSampler.__iter__ = recorded
sys.argv = ["vitkit", *sys.argv[2:]]
program()
"""
STEPS, EVERY, BATCH = 12, 4, 256  # the digits' 1,294 training images: 5 steps an epoch, resumed mid-epoch 0


def train_on(ranks: int, *command, logs: Path) -> None:
    """Run ``python COMMAND`` as one process, or as two ranks on two nodes."""
    if ranks == 1:
        launch([sys.executable], *command)
    else:
        TwoNodes(logs, *command).succeed()


def stop_after(run_dir: Path, copy: Path, step: int) -> None:
    """``copy``: ``run_dir`` as a kill right after its checkpoint of ``step`` left it."""
    shutil.copytree(run_dir, copy)
    for later in ("model", "best", "summary.json", *(p.relative_to(copy) for p in (copy / "checkpoints").iterdir()
                                                      if int(p.name.split("-")[1]) > step)):
        shutil.rmtree(copy / later) if (copy / later).is_dir() else (copy / later).unlink(missing_ok=True)


def samples(seen: Path) -> dict[int, list[tuple[int, int]]]:
    """Every rank's keys, by step."""
    by_step: dict[int, list[tuple[int, int]]] = {}
    for path in seen.glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            by_step.setdefault(record["step"], []).extend(map(tuple, record["keys"]))
    return by_step


@pytest.mark.parametrize("before, after, parallel", [(2, 1, "ddp"), (1, 2, "fsdp"),
                                                     pytest.param(2, 1, "fsdp", marks=pytest.mark.slow),
                                                     pytest.param(1, 2, "ddp", marks=pytest.mark.slow)])
def test_a_run_resumed_on_another_number_of_ranks_sees_the_same_samples(tmp_path, parallel, before, after):
    """Stopped after step 4 and resumed on another number of ranks, the run reads at each step the global batch
    of the uninterrupted run, each image once an epoch, and its loss follows the uninterrupted run's: each
    rank's mean over its share, averaged over equal shares, is the global batch's mean, summed in another order
    (float rounding, well within 1e-4 over 8 steps). FSDP on two ranks reads the optimiser state of one."""
    script, straight, resumed = tmp_path / "records_samples.py", tmp_path / "straight", tmp_path / "resumed"
    script.write_text(RECORDS_SAMPLES)
    args = [*TRAIN, "--steps", STEPS, "--batch-size", BATCH, "--checkpoint-every", EVERY, "--parallel", parallel]
    train_on(before, script, tmp_path / "seen-straight", *args, "--run-dir", straight, logs=tmp_path / "logs")
    stop_after(straight, resumed, EVERY)
    train_on(after, script, tmp_path / "seen-resumed", *args, "--run-dir", resumed, "--resume",
             logs=tmp_path / "logs-resumed")

    reference, later = samples(tmp_path / "seen-straight"), samples(tmp_path / "seen-resumed")
    assert sorted(later) == list(range(EVERY, STEPS))
    for step in later:  # the same global batch at every step, whichever ranks shared it
        assert sorted(later[step]) == sorted(reference[step]) and len(later[step]) == BATCH
    seen = [key for step in range(STEPS) for key in (reference if step < EVERY else later)[step]]
    epochs = {epoch for _, epoch in seen}
    assert len(epochs) == 3
    for epoch in epochs:  # each image once an epoch
        indices = [index for index, at in seen if at == epoch]
        assert len(indices) == len(set(indices))

    # The loss of the global batch is the mean of the ranks' means: only the order of the sums changes.
    ours, theirs = ([r["train/loss"] for r in records(run) if "train/loss" in r] for run in (resumed, straight))
    assert len(ours) == STEPS
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=0)


@pytest.mark.slow
def test_a_run_resumed_on_fewer_ranks_names_each_replaced_file_once(tmp_path, shared_data):
    """Under ``--corrupt skip`` each rank notes the files it replaced; resumed on one rank, the steps redone
    are noted once, not again beside what the rank that is gone had noted for them."""
    folder = mnist_folder(shared_data, tmp_path / "folder", train=60, test=20)
    broken = folder / "train" / "3" / "00007.png"
    broken.write_bytes(broken.read_bytes()[:40])
    args = ["-m", "vitkit", "train", "--dataset", f"imagefolder:{folder}", "--image-size", "28", "--val-fraction",
            "0", "--steps", "8", "--batch-size", "30", "--checkpoint-every", "4", "--corrupt", "skip",
            "--model-args", json.dumps({"patch_size": 7, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32,
                                        "in_chans": 1}), "--num-workers", "0", "--threads", "1", "--keep-last", "0"]
    train_on(2, *args, "--run-dir", tmp_path / "straight", logs=tmp_path / "logs")
    stop_after(tmp_path / "straight", tmp_path / "resumed", 4)
    train_on(1, *args, "--run-dir", tmp_path / "resumed", "--resume", logs=tmp_path / "logs-resumed")
    for run in ("straight", "resumed"):  # 60 images, 2 steps an epoch, 4 epochs: read once each
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["data/skipped_files"] == [str(broken)] * 4, run
