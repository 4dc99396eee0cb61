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

# A scenario run in a fresh interpreter that has imported what the command line imports, printing its peak resident
# memory (VmHWM: the process's whole footprint, the framework's included).
# Training: two steps of AdamW on the digits, resized to the model's size, through the training loader;
# evaluation: a pass over the digits' test split through the evaluation loader.
MEASURE = r"""
import json, sys
import vitkit.cli
import torch
from vitkit.data import SplitSpec, build_transform, evaluation_loader, load_dataset, training_loader
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models import ViTConfig, create_model
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

print(run(*json.loads(sys.argv[1])))
"""

# Two sizes: a digits-sized model, and one whose activations outweigh the framework's own memory.
TINY = dict(image_size=16, patch_size=2, dim=64, depth=3, num_heads=4, mlp_dim=128, in_chans=1, num_classes=10,
            pool="gap")
SMALL = dict(image_size=64, patch_size=4, dim=96, depth=2, num_heads=3, mlp_dim=384, in_chans=1, num_classes=10)
SCENARIOS = [(TINY, 128, True), (TINY, 256, False), (SMALL, 48, True), (SMALL, 256, False)]


def test_estimate_is_within_30_percent_of_the_measured_peak():
    env = {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    runs = [subprocess.Popen([sys.executable, "-c", MEASURE, json.dumps(scenario)], stdout=subprocess.PIPE, env=env,
                             text=True) for scenario in SCENARIOS]  # side by side: each pays for its own imports
    peaks = [int(run.communicate()[0]) for run in runs]
    for (fields, batch, training), peak in zip(SCENARIOS, peaks):
        found = estimate(ViTConfig(**fields), batch, training=training, optimizer="adamw")
        assert abs(found.total - peak) <= 0.3 * peak, (fields, batch, training, str(found), peak / MiB)
    assert peaks[3] - peaks[1] > 250 * MiB  # the larger model's own memory is a good part of its peak
