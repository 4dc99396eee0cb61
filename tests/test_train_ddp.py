"""Data-parallel training: `torchrun --nproc_per_node=2 vitkit train` (gloo, CPU) equals one process
with the same global batch."""

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

SRC = str(Path(__file__).resolve().parents[1] / "src")
ARGS = ["train", "--dataset", "digits", "--model-args",
        '{"patch_size": 2, "dim": 16, "depth": 2, "num_heads": 2, "mlp_dim": 32, "in_chans": 1}',
        "--steps", "4", "--batch-size", "32", "--optimizer", "sgd", "--lr", "0.3", "--warmup-steps", "1",
        "--transform", "pretrain", "--crop-scale", "0.5", "1.0", "--aug-level", "light1", "--threads", "1",
        "--log-every", "1"]


def _run(command, run_dir):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*command, *ARGS, "--run-dir", str(run_dir)], env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(run_dir / "model" / "model.safetensors"), result.stdout


def test_two_gloo_processes_equal_one(tmp_path):
    single, _ = _run([sys.executable, "-m", "vitkit"], tmp_path / "single")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "-m", "vitkit"]
    double, stdout = _run(torchrun, tmp_path / "ddp")
    assert stdout.count("test accuracy:") == 1, "only rank 0 reports and writes"
    assert single.keys() == double.keys()
    for key in single:  # SGD keeps the float-rounding differences of the gradient mean at their size
        torch.testing.assert_close(double[key], single[key], rtol=1e-5, atol=1e-6)
    assert single["head.weight"].abs().max() > 1e-3, "the zero-initialised head must have been trained"
