"""Masked patch prediction and few-shot evaluation on real data (issue 6; run on demand).

    PYTHONPATH=src python benchmarks/bench_mpp.py [--data-dir ../shared/data] [--pretrain-steps 1000]

1. Pre-train a small ViT on Fashion-MNIST images with masked patch prediction (labels unused).
2. Fine-tune it on Fashion-MNIST labels, and train the same architecture from scratch with the same
   budget (identical recipe and steps; only the initial weights differ).
3. Few-shot linear evaluation (1/5/10/25 shots, 5 seeds, closed-form ridge) of four representations
   on Fashion-MNIST and MNIST: random init, MPP encoder, MPP fine-tuned, supervised from scratch.

Results: benchmarks/results/mpp.json and mpp.md (with wall times and load averages: the machine may be
shared, which inflates times but not accuracies).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import vitkit
from vitkit.atomic import atomic_file
from vitkit.data import SplitSpec, Transformed, eval_loader, load_dataset
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.evaluate.fewshot import extract_features, fewshot_evaluate
from vitkit.train import Recipe

from timing import timed_run

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = Path("runs/bench-mpp")
ARCH = dict(patch_size=4, dim=96, depth=4, num_heads=4, mlp_dim=192, in_chans=1, pool="gap")
COMMON = dict(data=dict(dataset="fashion-mnist", val_fraction=0.02),
              augment=dict(transform="pretrain", crop_scale=(0.85, 1.0), hflip=True),
              optim=dict(optimizer="adamw", weight_decay=0.05, clip_norm=1.0))


def timed(name: str, recipe: Recipe) -> dict:
    summary, timing = timed_run(recipe)
    record = {"name": name, "summary": summary, **timing}
    print(f"== {name}: {json.dumps({k: v for k, v in summary.items() if 'accuracy' in k})} "
          f"in {record['wall_seconds']} s", flush=True)
    return record


def features(model: vitkit.VisionTransformer, dataset: str, data_dir: str, pool: int) -> dict:
    transform = checkpoint_transform(model.config)
    out = {}
    for split in ("train", "test"):
        data = load_dataset(dataset, split, data_dir, SplitSpec(0.0))
        if split == "train":  # a fixed pool to draw the shots (and the validation images) from
            keep = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:pool]
            data = data.subset(keep.sort().values.numpy(), f"{data.name}[pool]")
        out[split] = extract_features(model, eval_loader(Transformed(data, transform), 512, 0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--finetune-steps", type=int, default=400)
    parser.add_argument("--shot-pool", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=2, help="1 when the machine is shared")
    args = parser.parse_args()
    base = Recipe(**COMMON, model=dict(image_size=28), schedule=dict(batch_size=128, decay="cosine"),
                  run=dict(log_every=100, threads=args.threads))
    base = base.replace(data={"data_dir": args.data_dir})
    records = {}

    pretrain = base.replace(objective={"kind": "mpp"}, model={"args": ARCH}, optim={"lr": 1e-3},
                            schedule={"steps": args.pretrain_steps, "warmup_steps": 150},
                            run={"dir": str(RUNS / "pretrain")})
    records["pretrain"] = timed("mpp-pretrain", pretrain)
    budget = base.replace(schedule={"steps": args.finetune_steps, "warmup_steps": 60}, optim={"lr": 1e-3},
                          objective={"label_smoothing": 0.1})
    records["finetuned"] = timed("mpp-finetune", budget.replace(model={"init": str(RUNS / "pretrain" / "model")},
                                                                run={"dir": str(RUNS / "finetune")}))
    records["scratch"] = timed("scratch", budget.replace(model={"args": ARCH}, run={"dir": str(RUNS / "scratch")}))

    torch.manual_seed(0)
    encoders = {"random init": vitkit.create_model(vitkit.ViTConfig(image_size=28, num_classes=0, **ARCH)),
                "MPP encoder": vitkit.load(RUNS / "pretrain" / "model"),
                "MPP + fine-tuned": vitkit.load(RUNS / "finetune" / "model"),
                "supervised (scratch)": vitkit.load(RUNS / "scratch" / "model")}
    fewshot = {}
    for dataset in ("fashion-mnist", "mnist"):
        for name, model in encoders.items():
            started = time.perf_counter()
            split = features(model, dataset, args.data_dir, args.shot_pool)
            results = fewshot_evaluate(*split["train"], *split["test"], shots=(1, 5, 10, 25), seeds=range(5))
            fewshot[f"{dataset}, {name}"] = {r.shots: {"mean": r.mean, "std": r.std, "l2": r.selected_l2}
                                              for r in results}
            print(f"== few-shot {dataset} {name}: "
                  + ", ".join(f"{r.shots}-shot {100 * r.mean:.1f}±{100 * r.std:.1f}" for r in results)
                  + f" ({time.perf_counter() - started:.0f} s)", flush=True)

    report = {"records": records, "fewshot": fewshot, "arch": ARCH, "torch_threads": torch.get_num_threads(),
              "cpu_count": os.cpu_count()}
    with atomic_file(RESULTS / "mpp.json") as handle:
        json.dump(report, handle, indent=1, default=float)
    lines = ["# Masked patch prediction and few-shot evaluation (bench_mpp.py)", "",
             f"ViT {ARCH}, Fashion-MNIST 28 px. MPP pre-training {args.pretrain_steps} steps (batch 128, "
             f"50% corrupted: 80% [mask] / 10% random / 10% kept, 3-bit mean colour). Fine-tuning and "
             f"scratch: the same recipe, {args.finetune_steps} steps.", "",
             "| run | Fashion-MNIST test accuracy | wall s |", "|---|---|---|"]
    for key in ("finetuned", "scratch"):
        rec = records[key]
        lines.append(f"| {rec['name']} | {100 * rec['summary']['test/accuracy']:.2f}% | {rec['wall_seconds']} |")
    lines += ["", f"MPP pre-training: final masked-patch accuracy "
              f"{100 * records['pretrain']['summary'].get('train/accuracy', float('nan')):.1f}% "
              f"({records['pretrain']['wall_seconds']} s).", "",
              "Few-shot linear evaluation (test accuracy, mean ± std over 5 seeds; shots drawn from a fixed "
              f"pool of {args.shot_pool} training images; l2 chosen on held-out training images):", "",
              "| dataset / representation | 1 | 5 | 10 | 25 |", "|---|---|---|---|---|"]
    for key, per_shot in fewshot.items():
        lines.append(f"| {key} | " + " | ".join(f"{100 * v['mean']:.1f} ± {100 * v['std']:.1f}"
                                              for v in per_shot.values()) + " |")
    with atomic_file(RESULTS / "mpp.md") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
