"""The position-embedding ablation (appendix D.4, table 8) on real data (issue 6; run on demand).

    PYTHONPATH=src python benchmarks/bench_posembed.py [--data-dir ../shared/data] [--steps 1000]

Trains the same small ViT ([class] token, 28 px Fashion-MNIST, patch 4: a 7x7 grid) with each kind of
position embedding and the same budget, then prints the paper-style table. Results:
benchmarks/results/posembed.json and posembed.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from vitkit.atomic import atomic_file
from vitkit.train import Recipe

from timing import timed_run

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("none", "learned", "learned-2d", "sincos-2d", "relative")
# The paper's table 8 (ViT-B/16, ImageNet 5-shot linear accuracy), for comparison.
PAPER = {"none": 0.61382, "learned": 0.64206, "learned-2d": 0.64001, "relative": 0.64032}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS))
    parser.add_argument("--threads", type=int, default=2, help="1 when the machine is shared")
    args = parser.parse_args()
    rows = []
    for kind in args.kinds:
        recipe = Recipe(model=dict(image_size=28, args=dict(patch_size=4, dim=96, depth=4, num_heads=4, mlp_dim=192,
                                                            in_chans=1, pool="token", pos_embed=kind)),
                        data=dict(dataset=args.dataset, data_dir=args.data_dir, val_fraction=0.02),
                        augment=dict(transform="pretrain", crop_scale=(0.85, 1.0), hflip=args.dataset != "mnist"),
                        objective=dict(label_smoothing=0.1), optim=dict(lr=2e-3, weight_decay=0.05),
                        schedule=dict(steps=args.steps, batch_size=128, warmup_steps=100),
                        run=dict(log_every=100, threads=args.threads, dir=f"runs/bench-posembed/{kind}"))
        summary, timing = timed_run(recipe)
        rows.append({"pos_embed": kind, "test_accuracy": summary["test/accuracy"],
                     "val_accuracy": summary.get("val/accuracy"), **timing})
        print(f"== {kind}: {100 * summary['test/accuracy']:.2f}%", flush=True)
    with atomic_file(RESULTS / "posembed.json") as handle:
        json.dump({"dataset": args.dataset, "steps": args.steps, "rows": rows,
                   "torch_threads": torch.get_num_threads()}, handle, indent=1)
    lines = [f"# Position-embedding ablation on {args.dataset} ({args.steps} steps each, same recipe)", "",
             "| position embedding | test accuracy | wall s | paper (table 8) |", "|---|---|---|---|"]
    lines += [f"| {r['pos_embed']} | {100 * r['test_accuracy']:.2f}% | {r['wall_seconds']} | "
              f"{PAPER[r['pos_embed']]:.5f} |" if r["pos_embed"] in PAPER else
              f"| {r['pos_embed']} | {100 * r['test_accuracy']:.2f}% | {r['wall_seconds']} | - |" for r in rows]
    with atomic_file(RESULTS / "posembed.md") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
