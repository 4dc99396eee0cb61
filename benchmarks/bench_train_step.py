"""Training-step cost of a preset for each optimizer kernel (the per-parameter Python loop that is torch's
CPU default, multi-tensor foreach, fused) and batch size: the same data and weights, every variant timed
in turn, repeat after repeat, so that load from other processes hits all alike.

    PYTHONPATH=src python benchmarks/bench_train_step.py [--preset digits] [--batch-sizes 64 256] [--repeats 7]

Writes benchmarks/results/train_step_<preset>.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vitkit.atomic import atomic_file
from vitkit.train import resolve
from vitkit.train.run import prepare

RESULTS = Path(__file__).resolve().parent / "results"
KERNELS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="digits")
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--images", type=int, default=2560, help="images per timed round of each variant")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = prepare(resolve(args.preset, overrides={"run": {"dir": run_dir},
                                                                "data": {"data_dir": args.data_dir}})).trainer
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    groups = [{k: v for k, v in group.items() if k in ("params", "weight_decay")} for group in
              trainer.optimizer.param_groups]
    variants = {}
    for batch in args.batch_sizes:
        steps = max(1, args.images // batch)
        images = [(torch.randn(batch, *shape), torch.randint(0, 10, (batch,))) for shape in
                  [next(iter(trainer.batches(0)))[0].shape[1:]] * steps]
        for kernel, options in KERNELS.items():
            variants[f"batch {batch}, {kernel}"] = (batch, steps, images, type(trainer.optimizer)(groups, lr=1e-3,
                                                                                                   **options))
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name, (batch, steps, images, optimizer) in variants.items():
            trainer.model.load_state_dict(initial)
            trainer.optimizer = optimizer
            replay = iter(images)
            start = time.perf_counter()
            for _ in range(steps):
                trainer._train_step(replay)
            if repeat:
                seconds[name].append(time.perf_counter() - start)
    rows = {name: {"batch": batch, "ms_per_step": 1000 * statistics.median(seconds[name]) / steps,
                   "images_per_s": batch * steps / statistics.median(seconds[name])}
            for name, (batch, steps, _, _) in variants.items()}
    record = {"preset": args.preset, "threads": torch.get_num_threads(), "repeats": args.repeats, "rows": rows,
              "seconds": seconds, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "torch": torch.__version__}
    with atomic_file(RESULTS / f"train_step_{args.preset}.json") as handle:
        json.dump(record, handle, indent=1)
    slowest = min(row["images_per_s"] for row in rows.values())
    lines = [f"{args.preset} training step (random images of the preset's shape), median of {args.repeats} "
             f"interleaved repeats, {record['threads']} thread(s), load {load_before[0]:.1f} -> "
             f"{record['loadavg_after'][0]:.1f}", "",
             "| variant | ms/step | images/s | vs slowest |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {row['ms_per_step']:.2f} | {row['images_per_s']:.0f} | "
              f"{row['images_per_s'] / slowest:.2f}x |" for name, row in rows.items()]
    with atomic_file(RESULTS / f"train_step_{args.preset}.md") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
