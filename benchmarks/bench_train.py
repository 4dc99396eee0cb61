"""Time-to-accuracy on real data (run on demand; results go to benchmarks/results/train_<name>.json).

    PYTHONPATH=src python benchmarks/bench_train.py digits mnist fashion finetune [--data-dir ../shared/data]

- digits:   `vitkit train` with no arguments (target: >= 95% test accuracy within 3 minutes on 2 cores)
- mnist:    the `mnist` preset from scratch (target: >= 98.5% within 10 minutes)
- fashion:  the `fashion-mnist` preset (target: >= 90%); its model is the pre-trained one of `finetune`
- finetune: the Fashion-MNIST model (28 px, grid 7) fine-tuned on MNIST at 56 px (grid 14) against
            training from scratch at 56 px with the same budget (same steps, batch and schedule)

Each record keeps the wall time and os.getloadavg() before and after: the machine may be shared, and
a load above the number of cores means the times (not the accuracies) are inflated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from vitkit.atomic import atomic_file
from vitkit.train import resolve, run

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = Path("runs/bench")


def measure(name: str, recipe_overrides: dict, preset: str | None = None, target: float | None = None,
            budget_s: float | None = None) -> dict:
    recipe = resolve(preset, overrides={"run_dir": str(RUNS / name), "log_every": 100, **recipe_overrides})
    load_before = os.getloadavg()
    started = time.perf_counter()
    summary = run(recipe)
    wall = time.perf_counter() - started
    record = {"name": name, "recipe": recipe.to_dict(), "summary": summary, "wall_seconds": round(wall, 1),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "cpu_count": os.cpu_count(),
              "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
              "target_accuracy": target, "budget_seconds": budget_s,
              "accuracy_met": None if target is None else summary["test/accuracy"] >= target,
              "time_met": None if budget_s is None else wall <= budget_s}
    with atomic_file(RESULTS / f"train_{name}.json") as handle:
        json.dump(record, handle, indent=1)
    print(f"== {name}: test accuracy {100 * summary['test/accuracy']:.2f}% in {wall:.0f} s "
          f"(load {load_before[0]:.1f} -> {record['loadavg_after'][0]:.1f})", flush=True)
    return record


def finetune(data_dir: str) -> None:
    pretrained = RUNS / "fashion" / "model"
    if not (pretrained / "config.json").exists():
        raise SystemExit(f"{pretrained} missing: run the 'fashion' benchmark first")
    budget = dict(dataset="mnist", data_dir=data_dir, image_size=56, transform="finetune", hflip=False,
                  steps=300, batch_size=64, optimizer="sgd", lr=0.03, momentum=0.9, weight_decay=0.0,
                  warmup_steps=30, schedule="cosine", clip_norm=1.0, val_fraction=0.02, label_smoothing=0.0)
    tuned = measure("finetune_fashion28_to_mnist56", {**budget, "init": str(pretrained)}, preset="paper-finetune")
    pre = json.loads((pretrained / "config.json").read_text())  # the same architecture, from scratch
    scratch_args = {k: pre[k] for k in ("patch_size", "dim", "depth", "num_heads", "mlp_dim", "in_chans", "pool")}
    scratch = measure("scratch_mnist56_sgd", {**budget, "model_args": scratch_args}, preset="paper-finetune")
    adamw = measure("scratch_mnist56_adamw", {**budget, "model_args": scratch_args, "optimizer": "adamw",
                                               "lr": 2e-3, "weight_decay": 0.05}, preset="paper-finetune")
    rows = [(r["name"], r["summary"]["test/accuracy"], r["wall_seconds"]) for r in (tuned, scratch, adamw)]
    lines = ["| run (MNIST 56 px, 300 steps x 64 images) | test accuracy | wall s |", "|---|---:|---:|"]
    lines += [f"| {name} | {100 * acc:.2f}% | {wall:.0f} |" for name, acc, wall in rows]
    with atomic_file(RESULTS / "train_finetune.md") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="+", choices=["digits", "mnist", "fashion", "finetune"])
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    args = parser.parse_args()
    for which in args.which:
        if which == "digits":
            measure("digits", {}, preset="digits", target=0.95, budget_s=180)
        elif which == "mnist":
            measure("mnist", {"data_dir": args.data_dir}, preset="mnist", target=0.985, budget_s=600)
        elif which == "fashion":
            measure("fashion", {"data_dir": args.data_dir}, preset="fashion-mnist", target=0.90)
        else:
            finetune(args.data_dir)


if __name__ == "__main__":
    main()
