"""The first hour of a newcomer, on the CIFAR-10 subset in ../shared/data: train from scratch with no model flags,
fine-tune the result, evaluate it, predict a folder of images, analyse it and convert it to ONNX, each with the
defaults (only fewer steps and images). Each command runs as its own process, as typed in a shell: it must use 3
channels at the data's 32 x 32, stay within a memory budget (its peak resident memory), and write only where it
says it does."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SHARED_DATA
from PIL import Image

import vitkit

CIFAR = SHARED_DATA / "cifar10-subset" / "cifar10_subset.npz"
DATASET = f"npz:{CIFAR}"
SRC = str(Path(__file__).resolve().parents[1] / "src")
# Peak resident memory a command may reach. Importing vitkit (torch) takes 0.8 GB; measured peaks: train 1.0 GB,
# finetune (batch 512) 1.35 GB, eval, analyze and convert 0.9 GB. The failure this guards against took 24 GB
# (a digits model fine-tuned at the paper's 384 px on patch 2).
MEMORY_BUDGET = 2 * 2**30
SHORT = ["--steps", "5", "--log-every", "5"]  # the defaults, but few steps
# Six processes, each importing torch (4 s of CPU): about a minute on two idle cores, more on busy ones.
pytestmark = pytest.mark.slow


def vitkit_command(cwd: Path, *args: str) -> tuple[str, str, int]:
    """``vitkit ARGS`` run in ``cwd`` as its own process: its stdout, stderr and peak resident memory in bytes."""
    out, err = cwd / ".stdout", cwd / ".stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "vitkit", *args], cwd=cwd, stdout=stdout, stderr=stderr,
                                   env={**os.environ, "PYTHONPATH": SRC})
        _, status, usage = os.wait4(process.pid, 0)
    texts = out.read_text(), err.read_text()
    out.unlink()
    err.unlink()
    assert os.waitstatus_to_exitcode(status) == 0, (args, *texts)
    peak = usage.ru_maxrss * 1024  # kilobytes on Linux
    assert peak < MEMORY_BUDGET, f"vitkit {args[0]}: peak resident memory {peak / 2**30:.2f} GiB"
    return *texts, peak


def run_folder(stdout: str) -> Path:
    """The run folder a train/finetune command reports in its summary table."""
    return Path(re.search(r"^run_dir\s+(\S+)", stdout, re.MULTILINE).group(1))


def three_channels_at_32(model_dir: Path) -> None:
    config = vitkit.load(model_dir).config
    assert (config.in_chans, config.image_size) == (3, (32, 32)), config


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """`vitkit train --dataset npz:cifar10_subset.npz`, run in an empty folder: the run's folder in it."""
    if not CIFAR.is_file():
        pytest.skip(f"real datasets not found at {CIFAR}")
    home = tmp_path_factory.mktemp("newcomer")
    stdout, stderr, _ = vitkit_command(home, "train", "--dataset", DATASET, *SHORT)
    assert "model sized from" in stderr and "3x32x32 px, patch 4 (8x8 grid)" in stderr, stderr
    run = home / run_folder(stdout)
    assert run.parent == home / "runs" and (run / "summary.json").is_file()
    three_channels_at_32(run / "model")
    return run


def test_first_hour(trained):
    scratch = trained
    home = scratch.parent.parent
    stdout, stderr, _ = vitkit_command(home, "finetune", str(scratch / "model"), "--dataset", DATASET, *SHORT)
    assert "at 32x32 px, patch 4" in stderr and "its head kept" in stderr, stderr
    assert "upscaled" not in stderr and "channel images" not in stderr, stderr  # nothing converted
    tuned = home / run_folder(stdout)
    three_channels_at_32(tuned / "model")

    stdout, stderr, _ = vitkit_command(home, "eval", str(tuned / "model"))
    assert f"dataset {DATASET}, as recorded by the run in {tuned}" in stderr, stderr
    assert "channel images" not in stderr and "upscaled" not in stderr, stderr
    assert f"({1017} images); report and confusion matrix in {tuned}" in stdout, stdout
    assert (tuned / "eval-test.json").is_file() and (tuned / "confusion-test.png").is_file()

    stdout, _, _ = vitkit_command(home, "analyze", str(tuned / "model"), "--dataset", DATASET, "--num-images", "4",
                                  "--out", "analysis")
    assert "analysed 4 images at 32x32" in stdout and (home / "analysis" / "index.html").is_file(), stdout

    stdout, _, _ = vitkit_command(home, "convert", str(tuned / "model"), "model.onnx")
    assert "wrote model.onnx (onnx)" in stdout, stdout
    exported = onnx.load(str(home / "model.onnx"))
    assert exported.graph.input[0].type.tensor_type.shape.dim[1].dim_value == 3  # height and width: any
    config = json.loads({p.key: p.value for p in exported.metadata_props}["vitkit.config"])
    assert config["in_chans"] == 3 and config["image_size"] == [32, 32]
    assert sorted(path.name for path in home.iterdir()) == ["analysis", "model.onnx", "runs"]  # nothing else


def test_first_hour_predicts_a_folder(trained):
    scratch = trained
    home = scratch.parent.parent
    images = np.load(CIFAR)["x_test"][:3]
    (home / "photos").mkdir()
    for index, pixels in enumerate(images):
        Image.fromarray(pixels).save(home / "photos" / f"{index}.png")
    stdout, _, _ = vitkit_command(home, "predict", str(scratch / "model"), "photos", "--top-k", "1")
    assert [line.split(":")[0] for line in stdout.splitlines()] == [f"photos/{i}.png" for i in range(3)], stdout
