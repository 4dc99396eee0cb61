"""vitkit.memory: the estimate against peaks measured by the kernel, the limit read from cgroup files, and the
commands' refusals of sizes that do not fit, before anything is allocated."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.memory import GiB, MiB, Limit, Plan, available_memory, cgroup_limit, check, estimate
from vitkit.models.config import ViTConfig

SRC = Path(__file__).resolve().parents[1] / "src"

# Scenarios run in a fresh interpreter that has imported what the command line imports, printing each one's peak
# resident memory (VmHWM: the process's whole footprint, the framework's included; reset between scenarios).
# Training: two steps of AdamW on the digits, resized to the model's size, through the training loader;
# evaluation: a pass over the digits' test split through the evaluation loader.
MEASURE = r"""
import json, sys
import vitkit.cli
import torch
from vitkit.data import SplitSpec, build_transform, evaluation_loader, load_dataset, training_loader
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models import ViTConfig, create_model
from vitkit.train.objectives import Segmentation
from vitkit.train.optim import make_optimizer

def run(fields, batch, training):
    torch.manual_seed(0)
    model = create_model(ViTConfig(**fields))
    config = model.config
    if training:
        data = load_dataset("digits", "train", spec=SplitSpec(0.0))
        loader = training_loader(data, build_transform("finetune", config.image_size, 1, hflip=False),
                                 global_batch=batch, total_steps=2, start_step=0, seed=0)
        optimizer = make_optimizer(model.train(), "adamw", 1e-3)
        for images, labels, _ in loader:
            if config.dense_head != "none":  # a mask of the image's size for each image
                masks = torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.long)
                Segmentation()(model, (images, masks))[0].backward()
            else:
                torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        data = load_dataset("digits", "test", spec=SplitSpec(0.0))
        with torch.no_grad():
            for images, *_ in evaluation_loader(data, checkpoint_transform(config), batch):
                model.eval()(images)
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024

peaks = []
for scenario in json.loads(sys.argv[1]):
    peaks.append(run(*scenario))
    with open("/proc/self/clear_refs", "w") as handle:  # the peak starts again from what is resident now
        handle.write("5")
print(json.dumps(peaks))
"""

# Two sizes: a digits-sized model, and one whose activations outweigh the framework's own memory.
TINY = dict(image_size=16, patch_size=2, dim=64, depth=3, num_heads=4, mlp_dim=128, in_chans=1, num_classes=10,
            pool="gap")
SMALL = dict(image_size=64, patch_size=4, dim=96, depth=2, num_heads=3, mlp_dim=384, in_chans=1, num_classes=10)
# A segmentation head of 150 classes (ADE20K's) on a small backbone: its outputs at the image's size, kept for the
# loss and its gradient, are over a third of the peak.
DENSE = dict(SMALL, dim=48, depth=1, num_heads=2, mlp_dim=96, num_classes=150, dense_head="linear")
# Three processes (each pays for its imports), the smaller scenario of each first.
SCENARIOS = [[(TINY, 256, False), (TINY, 128, True)], [(SMALL, 48, True), (SMALL, 256, False)], [(DENSE, 64, True)]]


def test_estimate_is_within_30_percent_of_the_measured_peak():
    env = {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    runs = [subprocess.Popen([sys.executable, "-c", MEASURE, json.dumps(scenarios)], stdout=subprocess.PIPE, env=env,
                             text=True) for scenarios in SCENARIOS]
    peaks = [peak for run in runs for peak in json.loads(run.communicate()[0])]
    scenarios = [scenario for pair in SCENARIOS for scenario in pair]
    for (fields, batch, training), peak in zip(scenarios, peaks):
        found = estimate(ViTConfig(**fields), batch, training=training, optimizer="adamw")
        assert abs(found.total - peak) <= 0.3 * peak, (fields, batch, training, str(found), peak / MiB)
    assert peaks[3] - peaks[0] > 250 * MiB  # the larger model's own memory is a good part of its peak
    dense = estimate(ViTConfig(**DENSE), 64, training=True, optimizer="adamw")
    assert dense.total - dense.parts["dense head"] < 0.7 * peaks[4]  # the head's share is what brings it within 30%


# ------------------------------------------------------------------------------------------ the limit
def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_proc(root: Path, membership: str, available_kib: int = 8 * 2**20, resident_kib: int = 1024) -> Path:
    write(root / "meminfo", f"MemTotal:       {2 * available_kib} kB\nMemAvailable:   {available_kib} kB\n")
    write(root / "self" / "status", f"Name:\tpython\nVmHWM:\t{2 * resident_kib} kB\nVmRSS:\t{resident_kib} kB\n")
    write(root / "self" / "cgroup", membership)
    return root


def test_a_dense_head_is_counted_under_no_grad_as_without():
    """The head's tensors are traced with autograd on: a caller inside ``torch.no_grad()`` (an evaluation) gets the
    same estimate, not an empty trace."""
    import torch

    from vitkit.memory import _head_tensors, dense_head_bytes

    config = ViTConfig(**{**DENSE, "dense_head": "dpt", "num_classes": 21})
    expected = dense_head_bytes(config, (64, 48), training=False, batch=2)
    _head_tensors.cache_clear()  # traced again, under no_grad
    with torch.no_grad():
        assert dense_head_bytes(config, (64, 48), training=False, batch=2) == expected > 0


def test_cgroup_v2_limit_is_the_tightest_of_the_group_and_its_parents(tmp_path):
    cgroup = tmp_path / "cgroup"
    write(cgroup / "memory.max", "max\n")
    write(cgroup / "job" / "memory.max", "3221225472\n")  # 3 GiB on the parent
    write(cgroup / "job" / "step" / "memory.max", "max\n")
    proc = fake_proc(tmp_path / "proc", "0::/job/step\n")
    limit = available_memory(cgroup, proc)
    assert limit.bytes == 3 * GiB
    assert str(cgroup / "job" / "memory.max") in limit.source


def test_meminfo_counts_when_the_cgroup_v1_group_is_unlimited(tmp_path):
    cgroup = tmp_path / "cgroup"
    write(cgroup / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    write(cgroup / "memory" / "docker" / "memory.limit_in_bytes", "9223372036854771712\n")
    proc = fake_proc(tmp_path / "proc", "5:cpu,cpuacct:/docker\n4:memory:/docker\n0::/\n", available_kib=2**20,
                     resident_kib=2**10)
    limit = available_memory(cgroup, proc)
    assert limit.bytes == GiB + MiB  # MemAvailable plus what the process holds already
    assert "MemAvailable" in limit.source


def test_a_container_sees_its_own_group_at_the_mount(tmp_path):
    cgroup = tmp_path / "cgroup"
    write(cgroup / "memory.max", f"{512 * MiB}\n")  # the group's folder is the mount; /proc names the host's path
    membership = tmp_path / "proc" / "self" / "cgroup"
    write(membership, "0::/system.slice/docker-0123.scope\n")
    assert cgroup_limit(cgroup, membership) == Limit(512 * MiB, f"cgroup {cgroup / 'memory.max'}")


# ------------------------------------------------------------------------------------------ the check
def test_refusal_names_the_estimate_the_limit_and_flags_that_fit():
    config = ViTConfig(image_size=64, patch_size=4, dim=96, depth=2, num_heads=3, mlp_dim=384, num_classes=10)

    def measure(plan):
        return estimate(config, plan.micro_batch, plan.image_size, training=True,
                        grad_checkpointing=plan.grad_checkpointing)

    plan = Plan(512, (64, 64), stride=4, checkpointing_flag="--grad-checkpointing")
    limit = Limit(estimate(config, 40, training=True).total, "test")
    with pytest.raises(ConfigError) as refused:
        check(plan, measure, "vitkit train", limit)
    message = str(refused.value)
    assert "--batch-size 512 of 64x64 images" in message and str(limit) in message
    assert str(measure(plan)) in message
    # micro-batches of 32 (the largest divisor of 512 up to 40, the largest batch under the limit) keep 512 a step
    assert "--accum-steps 16 (micro-batches of 32, the same 512 images a step)" in message
    assert "--batch-size 40," in message
    side = int(message.split("--image-size ")[1].split(",")[0])
    assert side % 4 == 0
    assert measure(Plan(512, (side, side))).total <= limit.bytes < measure(Plan(512, (side + 4, side + 4))).total
    assert "--grad-checkpointing" not in message  # one block's activations at batch 512 still do not fit
    assert check(Plan(40, (64, 64)), measure, "vitkit train", limit) == measure(Plan(40, (64, 64)))


def test_on_a_gpu_the_model_parts_leave_the_host_memory():
    config = ViTConfig(**TINY)
    on_cpu, on_gpu = (estimate(config, 64, training=True, device=device) for device in ("cpu", "cuda"))
    assert on_gpu.parts == on_cpu.parts and on_cpu.accelerator == 0
    assert on_gpu.host == on_cpu.parts["framework"] + on_cpu.parts["loader"]
    assert on_gpu.accelerator == sum(on_cpu.parts[name] for name in ("weights", "gradients", "optimiser",
                                                                     "activations"))


def test_no_suggestion_when_the_weights_alone_do_not_fit():
    config = ViTConfig(image_size=32, patch_size=16, dim=64, depth=1, num_heads=2, mlp_dim=128)
    with pytest.raises(ConfigError, match="no smaller batch or image size fits"):
        check(Plan(8, (32, 32), stride=16), lambda plan: estimate(config, plan.batch, plan.image_size),
              "vitkit eval", Limit(100 * MiB, "test"))


@pytest.mark.parametrize("argv, value", [
    (["train", "--image-size", "100000"], "100000x100000 images"),
    (["train", "--batch-size", "1000000000"], "--batch-size 1000000000 "),
    (["finetune", "{checkpoint}", "--image-size", "100000"], "100000x100000 images"),
    (["bench", "ViT-S/16", "--image-size", "99984"], "99984x99984 images"),
    (["bench", "ViT-S/16", "--batch-size", "1000000000"], "--batch-size 1000000000 "),
    # a position table resampled at load, or an analysis at that size: refused before the table is made
    (["predict", "{checkpoint}", "x.png", "--set", "image_size=100000"], "on 100000x100000 images, 1 at a time,"),
    (["eval", "{checkpoint}", "--dataset", "digits", "--set", "image_size=100000"], "100000x100000 images"),
    (["fewshot", "{checkpoint}", "--dataset", "digits", "--set", "image_size=100000"], "100000x100000 images"),
    (["info", "{checkpoint}", "--set", "image_size=100000"], "100000x100000 images"),
    (["serve", "{checkpoint}", "--port", "0", "--set", "image_size=100000"], "100000x100000 images"),
    (["analyze", "{checkpoint}", "--image-size", "100000", "--out", "{checkpoint}-analysis"],
     "vitkit analyze at --batch-size 8 of 100000x100000 images"),
])
def test_huge_sizes_are_refused_at_once_with_the_estimate(argv, value, tiny_checkpoint, capsys):
    argv = [arg.format(checkpoint=tiny_checkpoint) for arg in argv]
    started = time.perf_counter()
    assert main(argv) == 2
    elapsed = time.perf_counter() - started
    error = capsys.readouterr().err  # a model sized from the data says so first, on a line of its own
    line = error.strip().splitlines()[-1]
    assert line.startswith("vitkit ") and "Traceback" not in error, error
    assert value in line and "GiB" in line and "is available" in line, error
    assert elapsed < 3, elapsed  # refused from the sizes alone: nothing of that size was made


def test_eval_refuses_batches_over_the_limit_before_the_first(tiny_checkpoint, monkeypatch, capsys):
    import vitkit.memory

    limit = estimate(ViTConfig(**{**TINY, "image_size": 8}), 60).total  # batches of 60 fit, 61 do not
    monkeypatch.setattr(vitkit.memory, "available_memory", lambda: Limit(limit, "a test's limit"))
    assert main(["eval", tiny_checkpoint, "--dataset", "digits", "--batch-size", "1000000000", "--out", "unused"]) == 2
    error = capsys.readouterr().err
    # a batch holds the test split's 359 digits at most
    assert "at --batch-size 359 of 8x8 images needs about" in error and "a test's limit" in error, error
    assert error.rstrip().endswith("flags that fit: --batch-size 60, --set image_size=2")  # one 2 x 2 patch


@pytest.mark.parametrize("command", [["train"], ["eval", "{checkpoint}", "--dataset", "digits"]])
def test_more_workers_than_cpus_are_refused(command, tiny_checkpoint, capsys):
    argv = [arg.format(checkpoint=tiny_checkpoint) for arg in command] + ["--num-workers", "10000"]
    assert main(argv) == 2
    assert "--num-workers 10000: expected at most" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from vitkit.models import create_model

    path = tmp_path_factory.mktemp("memory") / "tiny"
    create_model(ViTConfig(**{**TINY, "image_size": 8})).save(path)
    return str(path)


def test_onnx_metadata_cannot_claim_more_classes_than_the_file_holds(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from vitkit.checkpoints.onnx import CONFIG_KEY, OnnxModel
    from vitkit.errors import CheckpointError

    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["logits"])], "g",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    config = ViTConfig(**{**TINY, "num_classes": 10**12})
    model.metadata_props.add(key=CONFIG_KEY, value=config.to_json())
    path = tmp_path / "claims.onnx"
    onnx.save(model, path)
    with pytest.raises(CheckpointError, match="num_classes=1000000000000, a head of 64,000,000,000,000 weights"):
        OnnxModel(path)


def test_data_verify_refuses_more_workers_than_cpus(capsys):
    assert main(["data", "verify", "digits", "--num-workers", "10000"]) == 2
    assert "--num-workers 10000: expected at most" in capsys.readouterr().err
