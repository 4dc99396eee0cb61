"""Time-to-accuracy on real data (run on demand; results go to benchmarks/results/train_<name>.json).

    PYTHONPATH=src python benchmarks/bench_train.py digits mnist fashion finetune [--data-dir ../shared/data]
    PYTHONPATH=src python benchmarks/bench_train.py fashion --set schedule.epochs=20 --set run.threads=1 --tag e20

``--set SECTION.FIELD=JSON`` changes a recipe field of every run; ``--tag`` names such a variant (its results go
to train_<name>_<tag>.json, and ``finetune`` starts from that variant's Fashion-MNIST model).

- digits:   `vitkit train` with no arguments (target: >= 98% test accuracy within 45 s on 2 cores; over seeds: digits_seeds.py)
- mnist:    the `mnist` preset from scratch (target: >= 99.0% within 10 minutes)
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
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vitkit.atomic import atomic_file
from vitkit.train import resolve
from vitkit.train.presets import merge

from timing import repo_relative, timed_run

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = Path("runs/bench")


@dataclass
class Bench:
    """The runs of one invocation: where the data lies, and the variant (``--set``, ``--tag``) of every run."""

    data_dir: str
    changes: dict = field(default_factory=dict)
    tag: str = ""

    def named(self, name: str) -> str:
        return f"{name}_{self.tag}" if self.tag else name

    def measure(self, name: str, recipe_overrides: dict, preset: str | None = None, target: float | None = None,
                budget_s: float | None = None) -> dict:
        name = self.named(name)
        recipe = resolve(preset, overrides=merge({"run": {"dir": str(RUNS / name), "log_every": 100}},
                                                 recipe_overrides, self.changes))
        summary, timing = timed_run(recipe)
        wall = timing["wall_seconds"]
        recorded = recipe.to_dict()  # the paths relative to the repository root: no record names this machine
        recorded["data"]["data_dir"] = repo_relative(recorded["data"]["data_dir"])
        init = recorded["model"]["init"]  # a checkpoint folder here; a model name or hub id stays as it is
        recorded["model"]["init"] = repo_relative(init) if init and os.path.exists(init) else init
        recorded["run"]["dir"] = repo_relative(recorded["run"]["dir"])
        summary = {**summary, "run_dir": repo_relative(summary["run_dir"])} if "run_dir" in summary else summary
        record = {"name": name, "recipe": recorded, "summary": summary, **timing, "cpu_count": os.cpu_count(),
                  "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                  "machine": platform.machine(), "target_accuracy": target, "budget_seconds": budget_s,
                  "accuracy_met": None if target is None else summary["test/accuracy"] >= target,
                  "time_met": None if budget_s is None else wall <= budget_s}
        with atomic_file(RESULTS / f"train_{name}.json") as handle:
            json.dump(record, handle, indent=1)
        print(f"== {name}: test accuracy {100 * summary['test/accuracy']:.2f}% in {wall:.0f} s "
              f"(load {timing['loadavg_before'][0]:.1f} -> {timing['loadavg_after'][0]:.1f})", flush=True)
        return record

    def finetune(self) -> None:
        pretrained = RUNS / self.named("fashion") / "model"
        if not (pretrained / "config.json").exists():
            raise SystemExit(f"{pretrained} missing: run the 'fashion' benchmark (with the same --tag) first")
        budget = dict(model=dict(image_size=56), data=dict(dataset="mnist", data_dir=self.data_dir, val_fraction=0.02),
                      augment=dict(transform="finetune", hflip=False), objective=dict(label_smoothing=0.0),
                      optim=dict(optimizer="sgd", lr=0.03, momentum=0.9, weight_decay=0.0, clip_norm=1.0),
                      schedule=dict(steps=300, batch_size=64, warmup_steps=30, decay="cosine"))
        tuned = self.measure("finetune_fashion28_to_mnist56", merge(budget, {"model": {"init": str(pretrained)}}),
                             preset="paper-finetune")
        pre = json.loads((pretrained / "config.json").read_text())  # the same architecture, from scratch
        scratch_args = {k: pre[k] for k in ("patch_size", "dim", "depth", "num_heads", "mlp_dim", "in_chans", "pool")}
        scratch_budget = merge(budget, {"model": {"args": scratch_args}})
        scratch = self.measure("scratch_mnist56_sgd", scratch_budget, preset="paper-finetune")
        adamw = self.measure("scratch_mnist56_adamw", merge(scratch_budget, {"optim": {
            "optimizer": "adamw", "lr": 2e-3, "weight_decay": 0.05}}), preset="paper-finetune")
        rows = [(r["name"], r["summary"]["test/accuracy"], r["wall_seconds"]) for r in (tuned, scratch, adamw)]
        lines = ["| run (MNIST 56 px, 300 steps x 64 images) | test accuracy | wall s |", "|---|---:|---:|"]
        lines += [f"| {name} | {100 * acc:.2f}% | {wall:.0f} |" for name, acc, wall in rows]
        with atomic_file(RESULTS / f"train_{self.named('finetune')}.md") as handle:
            handle.write("\n".join(lines) + "\n")
        print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="+", choices=["digits", "mnist", "fashion", "finetune"])
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=JSON",
                        help="recipe change for every run")
    parser.add_argument("--tag", default="", help="name of the variant --set makes")
    args = parser.parse_args()
    if args.set and not args.tag:
        parser.error("--set makes a variant: name it with --tag (the baseline's results stay as they are)")
    changes: dict = {}
    for item in args.set:
        key, equals, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not (equals and dot):
            parser.error(f"--set {item}: expected SECTION.FIELD=JSON")
        try:
            changes.setdefault(section, {})[name] = json.loads(value)
        except json.JSONDecodeError as error:
            parser.error(f"--set {item}: the value is not JSON ({error})")
    bench = Bench(args.data_dir, changes, args.tag)
    for which in args.which:
        if which == "digits":
            bench.measure("digits", {}, preset="digits", target=0.98, budget_s=45)
        elif which == "mnist":
            bench.measure("mnist", {"data": {"data_dir": args.data_dir}}, preset="mnist", target=0.99, budget_s=600)
        elif which == "fashion":
            bench.measure("fashion", {"data": {"data_dir": args.data_dir}}, preset="fashion-mnist", target=0.90)
        else:
            bench.finetune()


if __name__ == "__main__":
    main()
