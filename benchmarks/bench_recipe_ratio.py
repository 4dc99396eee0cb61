"""Training cost per image of the digits preset against the preset it replaced, timed in turn in one process
(so that load from other processes hits both alike). A ratio, not a time: valid on a busy machine.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_recipe_ratio.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from vitkit.train import resolve
from vitkit.train.run import prepare

# The digits preset before issue 11's second pass (main at e1842f6): 4 layers, strong crops, 100 epochs.
BEFORE = dict(model=dict(args=dict(depth=4)), augment=dict(crop_scale=(0.5, 1.0)),
              schedule=dict(epochs=100, batch_size=64), optim=dict(lr=3e-3))
IMAGES_PER_ROUND = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, overrides in (("before", BEFORE), ("after", {})):
            recipe = resolve("digits", overrides={"run": {"dir": os.path.join(folder, name)}, **overrides})
            trainer = prepare(recipe).trainer
            variants[name] = (trainer, iter(trainer.batches(0)), recipe)
        per_image: dict[str, list[float]] = {name: [] for name in variants}
        load = os.getloadavg()[0]
        for _ in range(args.rounds):
            for name, (trainer, batches, recipe) in variants.items():
                start = time.perf_counter()
                for _ in range(IMAGES_PER_ROUND // recipe.schedule.batch_size):
                    trainer._train_step(batches)
                per_image[name].append((time.perf_counter() - start) / IMAGES_PER_ROUND)
    ratio = statistics.median(a / b for a, b in zip(per_image["after"], per_image["before"]))
    epochs = variants["after"][2].schedule.epochs / variants["before"][2].schedule.epochs
    before, after = (1e3 * statistics.median(per_image[name]) for name in ("before", "after"))
    print(f"load {load:.1f} -> {os.getloadavg()[0]:.1f}; ms per image: before {before:.2f}, after {after:.2f}; "
          f"after/before per image {ratio:.3f}, x {epochs:g} the epochs: training time {ratio * epochs:.3f}x")


if __name__ == "__main__":
    main()
