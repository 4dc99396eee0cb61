"""Sharded data-parallel training: `torchrun --nproc_per_node=2 vitkit train --parallel fsdp` (FSDP2,
gloo, CPU) equals one process with the same global batch, and resumes after an interruption to the
same weights. Accumulation, EMA, clipping at a global norm and layer-wise lr decay (eight parameter groups,
keyed by name in the sharded optimiser state) are on, so their sharded forms count."""

import json
import shutil
from pathlib import Path

import torch
from launch import VITKIT, VITKIT_TORCHRUN, launch
from safetensors.torch import load_file

CLIP = 0.25
ARGS = ["train", "--dataset", "digits", "--model-args",
        '{"patch_size": 2, "dim": 16, "depth": 2, "num_heads": 2, "mlp_dim": 32, "in_chans": 1, "drop_path": 0}',  # no per-rank draws
        "--steps", "4", "--batch-size", "32", "--accum-steps", "2", "--optimizer", "sgd", "--lr", "0.3",
        "--warmup-steps", "1", "--layer-decay", "0.5", "--clip-norm", str(CLIP), "--ema-decay", "0.5",
        "--checkpoint-every", "2", "--transform", "pretrain", "--crop-scale", "0.5", "1.0", "--threads", "1",
        "--log-every", "1"]
FINAL = Path("checkpoints") / "step-00000004"


def _outputs(run_dir):
    """(exported EMA weights, last checkpoint's weights, its training state)."""
    state = torch.load(run_dir / FINAL / "training_state.pt", map_location="cpu", weights_only=True)
    return load_file(run_dir / "model" / "model.safetensors"), load_file(run_dir / FINAL / "model.safetensors"), state


def _momentum(state):
    """SGD momentum per parameter in the optimiser's order, keyed as the state keys it: by position
    (one process) or by parameter name (FSDP)."""
    order = [key for group in state["optimizer"]["param_groups"] for key in group["params"]]
    return {key: state["optimizer"]["state"][key]["momentum_buffer"] for key in order}


def _assert_all_close(ours, theirs, **tolerance):
    assert ours.keys() == theirs.keys()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], **tolerance, msg=lambda m, k=key: f"{k}: {m}")


def test_fsdp_on_two_gloo_processes_equals_one_and_resumes(tmp_path):
    single_dir, sharded_dir = tmp_path / "single", tmp_path / "fsdp"
    launch(VITKIT, *ARGS, "--run-dir", single_dir)
    stdout = launch(VITKIT_TORCHRUN, *ARGS, "--run-dir", sharded_dir, "--parallel", "fsdp")
    assert stdout.count("test accuracy:") == 1, "only rank 0 evaluates and writes"

    single_model, single_weights, single_state = _outputs(single_dir)
    sharded_model, sharded_weights, sharded_state = _outputs(sharded_dir)
    # Whole tensors in the same files as one process. Not bit-exact: the gradient of the global batch
    # is summed in another order (two half-batch sums, reduce-scattered), which moves the last bits;
    # SGD keeps those differences at their size.
    tight = dict(rtol=1e-5, atol=1e-6)
    _assert_all_close(sharded_model, single_model, **tight)
    _assert_all_close(sharded_weights, single_weights, **tight)
    _assert_all_close(sharded_state["ema"], single_state["ema"], **tight)
    sharded_momentum = _momentum(sharded_state)
    assert {name: m.shape for name, m in sharded_momentum.items()} == \
        {name: t.shape for name, t in sharded_weights.items()}, "whole moments, one per parameter name"
    _assert_all_close(dict(enumerate(sharded_momentum.values())), _momentum(single_state), **tight)
    scales = [group["lr_scale"] for group in sharded_state["optimizer"]["param_groups"]]
    assert scales == [0.125, 0.125, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0], "0.5 ** (3 - layer), weight matrices first"
    assert single_weights["head.weight"].abs().max() > 1e-3, "the zero-initialised head must have been trained"
    assert not torch.equal(single_model["head.weight"], single_weights["head.weight"]), "EMA exported, not raw"
    norms = [json.loads(line).get("train/grad_norm", 0.0) for line in (single_dir / "metrics.jsonl").open()]
    assert max(norms) > CLIP, "clipping must have acted for the comparison to cover it"

    # Interrupt after the step-2 checkpoint (what a crash before step 4 leaves behind), then resume.
    for finished in (FINAL, "model", "best"):
        shutil.rmtree(sharded_dir / finished)
    (sharded_dir / "summary.json").unlink()
    launch(VITKIT_TORCHRUN, "train", "--run-dir", sharded_dir, "--resume")  # recipe.json says fsdp
    resumed_model, resumed_weights, resumed_state = _outputs(sharded_dir)
    exact = dict(rtol=0, atol=0)  # the same processes redo the same steps in the same order
    _assert_all_close(resumed_model, sharded_model, **exact)
    _assert_all_close(resumed_weights, sharded_weights, **exact)
    _assert_all_close(resumed_state["ema"], sharded_state["ema"], **exact)
    _assert_all_close(_momentum(resumed_state), sharded_momentum, **exact)
