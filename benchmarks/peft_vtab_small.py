"""Parameter-efficient fine-tuning at VTAB-1k's size, on data at hand: a backbone trained here on MNIST, adapted
to two 1,000-image tasks by every method of ``vitkit finetune --peft``, each run through the command line.

    PYTHONPATH=src python benchmarks/peft_vtab_small.py [--data-dir ../shared/data] [--out runs/bench/peft_vtab_small]
        [--backbone-steps 3000] [--steps 300] [--batch 64] [--threads 1] [--methods none linear lora ...]

1. Backbone: ``vitkit train --preset mnist`` (28 px grey, patch 4, D=64, 4 blocks), cut to ``--backbone-steps``
   (0: the preset's 10 epochs); reused from ``OUT/backbone`` when that run finished before.
2. Tasks, written as ``npz:`` files under ``OUT/tasks`` (VTAB-1k's shape: 800 training and 200 validation images
   drawn at random from the training split, seed 0; the whole test split): Fashion-MNIST (28 px grey) and the
   CIFAR-10 subset (32 px colour, which ``--channels grey --image-size 28`` brings to the backbone's input).
3. Every method on every task with the same schedule (AdamW, ``--steps`` steps of ``--batch``, cosine, 10% warm-up,
   no weight decay), at each of three learning rates; the rate with the best validation accuracy is kept, and its
   test accuracy reported (the run trained on the 800 images; VTAB's protocol then trains again on all 1,000).

Writes benchmarks/results/peft_vtab_small.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vitkit.atomic import atomic_file

import peft_records as records

VITKIT = str(Path(sys.executable).with_name("vitkit"))
METHODS = ("none", "linear", "lora", "dora", "vpt-deep", "adaptformer", "bitfit")
LABELS = {"none": "full fine-tuning"}
# Three learning rates per method: PEFT methods train few, freshly initialised weights and take a higher rate.
RATES = {"none": (3e-4, 1e-3, 3e-3), "linear": (3e-3, 1e-2, 3e-2)}
PEFT_RATES = (1e-3, 3e-3, 1e-2)
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def vtab_sized(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, classes,
               path: Path, seed: int = 0) -> dict:
    """An ``npz:`` task of 800 training and 200 validation images drawn (without overlap) from the given training
    images, and the whole test split."""
    order = np.random.default_rng(seed).permutation(len(x_train))
    train, val = order[:800], order[800:1000]
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as handle:
        np.savez(handle, x_train=x_train[train], y_train=y_train[train].astype(np.int64), x_val=x_train[val],
                 y_val=y_train[val].astype(np.int64), x_test=x_test, y_test=y_test.astype(np.int64),
                 classes=np.array(classes))
    return {"train": 800, "val": 200, "test": len(x_test), "image": list(x_train.shape[1:])}


def write_tasks(data_dir: Path, out: Path) -> dict[str, dict]:
    import torchvision

    tasks = {}
    train = torchvision.datasets.FashionMNIST(str(data_dir), train=True, download=False)
    test = torchvision.datasets.FashionMNIST(str(data_dir), train=False, download=False)
    path = out / "tasks" / "fashion-mnist-1k.npz"
    tasks["fashion-mnist"] = {"path": str(path), "flags": [], "source": f"{data_dir}/FashionMNIST/raw",
                              **vtab_sized(train.data.numpy(), train.targets.numpy(), test.data.numpy(),
                                           test.targets.numpy(), train.classes, path)}
    source = data_dir / "cifar10-subset" / "cifar10_subset.npz"
    arrays = np.load(source)
    path = out / "tasks" / "cifar10-subset-1k.npz"
    tasks["cifar10-subset"] = {"path": str(path), "flags": ["--channels", "grey", "--image-size", "28"],
                               "source": str(source), **vtab_sized(arrays["x_train"], arrays["y_train"],
                                                                   arrays["x_test"], arrays["y_test"], CIFAR_CLASSES,
                                                                   path)}
    return tasks


def timed(command: list[str], log: Path) -> float:
    """Run ``command`` (its output into ``log``); its wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}); see {log}")
    return round(time.perf_counter() - started, 1)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def backbone(args) -> dict:
    run_dir = args.out / "backbone"
    command = [VITKIT, "train", "--preset", "mnist", "--data-dir", str(args.data_dir), "--run-dir", str(run_dir)]
    command += ["--steps", str(args.backbone_steps)] if args.backbone_steps else []
    if (run_dir / "summary.json").is_file() and (run_dir / "model").is_dir():
        record = json.loads((run_dir / "backbone.json").read_text()) if (run_dir / "backbone.json").is_file() else {}
        return {**record, "reused": True}
    shutil.rmtree(run_dir, ignore_errors=True)
    wall = timed(command, args.out / "logs" / "backbone.log")
    summary = json.loads((run_dir / "summary.json").read_text())
    record = {"command": " ".join(["vitkit", *command[1:]]), "wall_seconds": wall, "steps": summary["steps"],
              "test_accuracy_pct": 100 * summary["test/accuracy"], "parameters": summary.get("params/total"),
              "model_bytes": folder_bytes(run_dir / "model")}
    (run_dir / "backbone.json").write_text(json.dumps(record, indent=1))
    return record


def finetune(args, task: str, spec: dict, method: str, lr: float) -> dict:
    run_dir = args.out / "runs" / task / f"{method}-lr{lr:g}"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [VITKIT, "finetune", str(args.out / "backbone" / "model"), "--dataset", f"npz:{spec['path']}",
               *spec["flags"], "--peft", method, "--optimizer", "adamw", "--lr", f"{lr:g}", "--weight-decay", "0",
               "--steps", str(args.steps), "--batch-size", str(args.batch), "--warmup-steps", str(args.steps // 10),
               "--schedule", "cosine", "--eval-every", "0", "--threads", str(args.threads), "--seed", "0",
               "--run-dir", str(run_dir)]
    wall = timed(command, args.out / "logs" / task / f"{method}-lr{lr:g}.log")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"task": task, "method": method, "lr": lr, "command": " ".join(["vitkit", *command[1:]]),
            "wall_seconds": wall, "train_seconds": summary["train_seconds"],
            "val_accuracy_pct": 100 * summary["val/accuracy"], "test_accuracy_pct": 100 * summary["test/accuracy"],
            "test_images": summary["test/images"],
            "trained": summary["params/trained"], "total": summary["params/total"],
            "trained_share": summary["params/trained_share"], "model_bytes": folder_bytes(run_dir / "model"),
            "adapter_bytes": folder_bytes(run_dir / "adapter")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench/peft_vtab_small"))
    parser.add_argument("--backbone-steps", type=int, default=3000, help="0: the mnist preset's 10 epochs")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    load_before, started = os.getloadavg(), time.perf_counter()
    base = backbone(args)
    print(f"backbone: {base}", flush=True)
    tasks = write_tasks(args.data_dir, args.out)
    runs = []
    for task, spec in tasks.items():
        for method in args.methods:
            for lr in RATES.get(method, PEFT_RATES):
                runs.append(finetune(args, task, spec, method, lr))
                print(json.dumps(runs[-1]), flush=True)
    chosen = {}
    for run in runs:
        key = f"{run['task']}/{run['method']}"
        if key not in chosen or run["val_accuracy_pct"] > chosen[key]["val_accuracy_pct"]:
            chosen[key] = run
    command = "PYTHONPATH=src python benchmarks/peft_vtab_small.py " + " ".join(sys.argv[1:])
    record = {"command": command.strip(), "machine": records.machine(args.threads, load_before, started),
              "settings": {"steps": args.steps, "batch": args.batch,
                           "rates": {m: RATES.get(m, PEFT_RATES) for m in args.methods}},
              "backbone": base, "tasks": tasks, "chosen": chosen, "runs": runs}
    print(records.write("peft_vtab_small", record, report))


def size(count: int) -> str:
    return f"{count / 1024:,.0f} KiB" if count >= 10 * 1024 else f"{count:,} B"


def report(record: dict) -> str:
    machine, base, settings = record["machine"], record["backbone"], record["settings"]
    tasks = record["tasks"]
    lines = ["# Parameter-efficient fine-tuning at VTAB-1k's size, on a CPU", "",
             f"Machine: {machine['model']}, {machine['cores']} cores, torch {machine['torch']}, fp32, "
             f"{machine['threads']} thread(s) a run, one run at a time; load {machine['loadavg_before'][0]:.1f} -> "
             f"{machine['loadavg_after'][0]:.1f} (other processes shared the machine, so wall times are rough); "
             f"measured {machine['date']} with `{record['command']}` ({machine['wall_seconds'] / 60:.0f} min wall"
             f"{', the backbone reused' if base.get('reused') else ''}; record: `peft_vtab_small.json`).", "",
             f"**Backbone**: `{base['command']}` — the `mnist` preset (28 px grey, patch 4, D=64, 4 blocks, "
             f"{base['parameters']:,} parameters) cut to {base['steps']:,} steps to keep the whole benchmark near 25 "
             f"minutes (the preset's 10 epochs are 4,590 steps: 99.11% in 497 s, `train_speed.md`); "
             f"{base['test_accuracy_pct']:.2f}% on MNIST's test split, {base['wall_seconds'] / 60:.1f} min on the "
             f"shared machine. The script trains it into `OUT/backbone` once and reuses it while it is there.", "",
             "**Tasks** (VTAB-1k's shape: 800 training and 200 validation images drawn at random, seed 0, from the "
             "training split; the whole test split), written by the script as `npz:` files:", ""]
    for task, spec in tasks.items():
        flags = f", fine-tuned with `{' '.join(spec['flags'])}`" if spec["flags"] else ""
        lines.append(f"- {task}: from `{spec['source']}`, images {'x'.join(map(str, spec['image']))}{flags}; "
                     f"{spec['test']:,} test images.")
    rates = ", ".join(f"{LABELS.get(m, m)} {' / '.join(f'{r:g}' for r in rs)}" for m, rs in settings["rates"].items())
    lines += ["", f"**Schedule**, the same for every method: AdamW, {settings['steps']} steps of batch "
              f"{settings['batch']} ({settings['steps'] * settings['batch'] / 800:.0f} epochs of the 800 images), "
              f"{settings['steps'] // 10} warm-up steps, cosine decay, no weight decay, gradient clipping at 1, the "
              f"`vitkit finetune` defaults otherwise (resize and random crop). Each method ran at three learning rates "
              f"({rates}); the one with the best validation accuracy is kept and its test accuracy shown. LoRA and "
              f"DoRA: r=8, alpha 8 on qkv, fc1, fc2; VPT-deep: 10 prompts; AdaptFormer: width 64, scale 0.1. "
              f"On a backbone this narrow (D=64), r=8 is an eighth of the width, so the shares trained are far "
              f"above ViT-B/16's (see `peft_cost.md`).", ""]
    chosen = record["chosen"]
    for task in tasks:
        rows = [run for key, run in chosen.items() if key.startswith(task + "/")]
        lines += [f"## {task}", "", "| method | lr kept | val % | test % | trained | share | adapter on disk | "
                  "model on disk | wall s (train s) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for run in rows:
            adapter = size(run["adapter_bytes"]) if run["adapter_bytes"] else "- (whole model)"
            lines.append(f"| {LABELS.get(run['method'], run['method'])} | {run['lr']:g} | "
                         f"{run['val_accuracy_pct']:.2f} | {run['test_accuracy_pct']:.2f} | {run['trained']:,} | "
                         f"{run['trained_share']:.2%} | {adapter} | {size(run['model_bytes'])} | "
                         f"{run['wall_seconds']:.0f} ({run['train_seconds']:.0f}) |")
        lines.append("")
    means = {}
    for run in chosen.values():
        means.setdefault(run["method"], []).append(run["test_accuracy_pct"])
    lines += ["## Mean over the two tasks", "", "| method | mean test % |", "|---|---:|"]
    lines += [f"| {LABELS.get(m, m)} | {sum(v) / len(v):.2f} |" for m, v in means.items()]
    lines += ["", "Every run, each learning rate (test % / val %): "
              + "; ".join(f"{r['task']} {LABELS.get(r['method'], r['method'])} lr {r['lr']:g}: "
                          f"{r['test_accuracy_pct']:.2f} / {r['val_accuracy_pct']:.2f}" for r in record["runs"]) + ".",
              "", "Wall seconds count the whole `vitkit finetune` process (start, training, the validation and test "
              "passes, writing the model and adapter); train seconds the steps alone.", ""]
    return "\n".join(lines + reading(record))


def reading(record: dict) -> list[str]:
    """How far the figures carry: where the kept rates sit in their grids, the test sets' sampling error, and
    the training times on a backbone this small."""
    chosen, rates = record["chosen"], record["settings"]["rates"]
    top = [run for run in chosen.values() if run["lr"] == max(rates[run["method"]])]
    errors = {}
    for run in chosen.values():  # the binomial standard error of a test accuracy near the task's mean
        errors.setdefault(run["task"], []).append(run["test_accuracy_pct"])
    spread = ", ".join(f"{task} about {100 * (p * (1 - p) / record['tasks'][task]['test']) ** 0.5:.1f}"
                       for task, values in errors.items() for p in [sum(values) / len(values) / 100])
    train = {}
    for run in chosen.values():
        train.setdefault(run["method"], []).append(run["train_seconds"])
    full = sum(train["none"]) / len(train["none"]) if "none" in train else None
    slower = [f"{LABELS.get(m, m)} {sum(v) / len(v) / full:.2f}x" for m, v in train.items() if m != "none"] if full \
        else []
    lines = ["Reading these figures:", "",
             f"- The rate kept was the highest of its grid in {len(top)} of the {len(chosen)} cases (a tie on "
             f"validation keeps the lower rate), so higher rates may do better still (each method's grid has three "
             f"rates a factor 3 apart).",
             f"- One seed per run. A test accuracy's binomial standard error is {spread} points: differences of a "
             f"point or two on the CIFAR-10 subset's 1,017 test images are within it. The 200 validation images "
             f"count 0.5 points each.",
             "- On this tiny backbone (D=64, 50 tokens) only the linear probe trained clearly faster than full "
             "fine-tuning, and the machine's load moved run times by tens of percent. Training seconds of the kept "
             "runs over full fine-tuning's (below 1: faster): " + ", ".join(slower) + ". On ViT-B/16 the PEFT "
             "steps are faster than full fine-tuning's (`peft_cost.md`)."]
    return lines + [""]


if __name__ == "__main__":
    main()
