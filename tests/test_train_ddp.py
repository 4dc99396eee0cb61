"""Data-parallel training: `torchrun --nproc_per_node=2 vitkit train` (gloo, CPU) equals one process
with the same global batch."""

import json
import shutil

import torch
from launch import TORCHRUN, VITKIT, VITKIT_TORCHRUN, launch
from safetensors.torch import load_file

# The digits preset's stochastic depth off: one process and two ranks draw its masks from different streams.
MODEL = {"patch_size": 2, "dim": 16, "depth": 2, "num_heads": 2, "mlp_dim": 32, "in_chans": 1, "drop_path": 0}
ARGS = ["train", "--dataset", "digits", "--model-args", json.dumps(MODEL), "--steps", "4", "--batch-size", "32",
        "--optimizer", "sgd", "--lr", "0.3", "--warmup-steps", "1", "--transform", "pretrain", "--crop-scale", "0.5",
        "1.0", "--aug-level", "light1", "--threads", "1", "--log-every", "1"]


def _run(command, run_dir, *extra):
    stdout = launch(command, *ARGS, "--run-dir", run_dir, *extra)
    return load_file(run_dir / "model" / "model.safetensors"), stdout


def test_two_gloo_processes_equal_one(tmp_path):
    single, _ = _run(VITKIT, tmp_path / "single")
    double, stdout = _run(VITKIT_TORCHRUN, tmp_path / "ddp")
    assert stdout.count("test accuracy:") == 1, "only rank 0 reports and writes"
    assert single.keys() == double.keys()
    for key in single:  # SGD keeps the float-rounding differences of the gradient mean at their size
        torch.testing.assert_close(double[key], single[key], rtol=1e-5, atol=1e-6)
    assert single["head.weight"].abs().max() > 1e-3, "the zero-initialised head must have been trained"


def test_ddp_resume_is_exact_with_a_random_stream_per_rank(tmp_path):
    """Each rank draws its own dropout (seed + rank) and each rank's generator is checkpointed, so a
    2-process run continued from its middle checkpoint ends with the uninterrupted run's weights."""
    extra = ["--model-args", json.dumps({**MODEL, "dropout": 0.2}), "--steps", "6", "--checkpoint-every", "3"]
    straight, _ = _run(VITKIT_TORCHRUN, tmp_path / "straight", *extra)
    middle = tmp_path / "straight" / "checkpoints" / "step-00000003"
    generators = torch.load(middle / "training_state.pt", weights_only=True)["rng_cpu"]
    assert len(generators) == 2 and not torch.equal(*generators), "the ranks must not share dropout masks"

    resumed_dir = tmp_path / "resumed"  # as if stopped right after the middle checkpoint
    shutil.copytree(tmp_path / "straight", resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "step-00000006")
    shutil.rmtree(resumed_dir / "model")
    resumed, _ = _run(VITKIT_TORCHRUN, resumed_dir, *extra, "--resume")
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)


TRAINS_THREE_TIMES = """
import json
import os
import sys
from pathlib import Path
import torch.distributed as dist
from vitkit.cli import main
from vitkit.train.presets import resolve
from vitkit.train.run import run

model_args, out = %r, Path(sys.argv[1])
recipe = resolve("digits", overrides={"model": {"args": model_args}, "schedule": {"steps": 1, "batch_size": 8},
                                      "run": {"threads": 1, "dir": str(out / "first")}})
run(recipe)
kept = dist.is_initialized()
reductions, reduce = [], dist.all_reduce  # counted: one per step (metrics, stop and save requests together)
dist.all_reduce = lambda *args, **kwargs: reductions.append(1) or reduce(*args, **kwargs)
run(recipe.replace(run={"dir": str(out / "second")}, schedule={"steps": 3}))  # a run directory holds one run
dist.all_reduce = reduce
code = main(["train", "--model-args", json.dumps(model_args), "--steps", "1", "--batch-size", "8", "--threads", "1",
             "--run-dir", str(out / "cli")])
(out / ("rank-" + os.environ["RANK"])).write_text(f"kept {kept}, reductions {len(reductions)}, cli {code}, "
                                                  f"left {not dist.is_initialized()}")
"""


def test_runs_share_the_process_group_and_the_command_leaves_it(tmp_path):
    """A script may call ``run`` several times in one group; the command line leaves it when done, as
    gloo's threads, left to the interpreter's exit, can abort a process that succeeded (SIGABRT). A
    step all-reduces once (3 steps, 3 reductions): no second collective for the stop/save agreement."""
    script = tmp_path / "train_three_times.py"
    script.write_text(TRAINS_THREE_TIMES % MODEL)
    launch(TORCHRUN, script, tmp_path)
    expected = "kept True, reductions 3, cli 0, left True"
    assert [(tmp_path / f"rank-{rank}").read_text() for rank in (0, 1)] == [expected] * 2
