"""The default job (`vitkit train`, the digits preset) over several seeds: each seed's test accuracy, the mean, and
the wall time of every run, for the default and for variants of it given as flags, run in the same invocation.

    PYTHONPATH=src python benchmarks/digits_seeds.py --tag NAME [--seeds 0 1 2 3 4] \\
        [--candidate LABEL='FLAGS' ...] [--no-default] [--render]

Every invocation runs ``vitkit train --seed N --run-dir runs/digits_seeds/TAG/LABEL/seedN FLAGS`` as a process of
its own (imports, data, training, the final test: what ``make run`` costs), the default job (label ``default``, no
flags) first, seed by seed with the candidates interleaved (seed 0 of each, then seed 1 of each, ...), so that
load from other processes falls on all of them alike. The machine may be shared: the load average is recorded
before and after each run, and each candidate's time is given as the ratio of its summed wall time to the default's
in the same invocation. Test accuracy does not depend on the load (one thread, deterministic for a seed).

Results accumulate by tag in benchmarks/results/digits_seeds.json (an invocation replaces the record of its tag);
benchmarks/results/digits_seeds.md is written from all of them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from timing import cpu_model

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
RUNS = Path("runs") / "digits_seeds"  # relative to the repository root, where the runs start
# The recipe fields a record shows for each candidate (from the run's recipe.json).
SHOWN = {"model": ("args",), "augment": ("transform", "crop_scale", "hflip", "aug_level", "cutmix_alpha"),
         "objective": ("label_smoothing",), "optim": ("lr", "weight_decay", "ema_decay", "layer_decay"),
         "schedule": ("epochs", "batch_size", "warmup_steps"), "data": ("val_fraction",), "run": ("threads",)}


def vitkit_command() -> list[str]:
    """The ``vitkit`` entry point of this Python (its virtual environment), else ``python -m vitkit``."""
    script = Path(sys.executable).parent / "vitkit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vitkit"]


def one_run(label: str, flags: list[str], seed: int, tag: str) -> dict:
    run_dir = RUNS / tag / label / f"seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    args = ["train", "--seed", str(seed), "--run-dir", str(run_dir), *flags]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    load_before, started = os.getloadavg(), time.perf_counter()
    with open(run_dir.parent / f"seed{seed}.log", "w") as log:
        done = subprocess.run(vitkit_command() + args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{label} seed {seed}: vitkit exited with {done.returncode} "
                         f"(see {run_dir.parent / f'seed{seed}.log'})")
    summary = json.loads((REPO / run_dir / "summary.json").read_text())
    return {"seed": seed, "command": shlex.join(["vitkit", *args]), "test_accuracy": summary["test/accuracy"],
            "test_images": summary["test/images"], "val_accuracy": summary.get("val/accuracy"),
            "train_seconds": summary["train_seconds"], "wall_seconds": round(wall, 1),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def shown_recipe(run_dir: Path) -> dict:
    recipe = json.loads((REPO / run_dir / "recipe.json").read_text())
    return {f"{section}.{name}": recipe[section][name] for section, names in SHOWN.items() for name in names
            if name in recipe.get(section, {})}


def invocation(tag: str, candidates: dict[str, list[str]], seeds: list[int]) -> dict:
    runs: dict[str, list[dict]] = {label: [] for label in candidates}
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    for seed in seeds:
        for label, flags in candidates.items():
            result = one_run(label, flags, seed, tag)
            runs[label].append(result)
            print(f"{tag} {label} seed {seed}: {100 * result['test_accuracy']:.2f}% in {result['wall_seconds']} s "
                  f"(load {result['loadavg_before'][0]:.1f} -> {result['loadavg_after'][0]:.1f})", flush=True)
    base = sum(r["wall_seconds"] for r in runs["default"]) if "default" in runs else None
    rows = []
    for label, flags in candidates.items():
        accuracies = [r["test_accuracy"] for r in runs[label]]
        walls = [r["wall_seconds"] for r in runs[label]]
        rows.append({"label": label, "flags": shlex.join(flags),
                     "recipe": shown_recipe(RUNS / tag / label / f"seed{seeds[0]}"),
                     "mean_test_accuracy": statistics.fmean(accuracies),
                     "min_test_accuracy": min(accuracies), "max_test_accuracy": max(accuracies),
                     "seed0_test_accuracy": next((r["test_accuracy"] for r in runs[label] if r["seed"] == 0), None),
                     "mean_wall_seconds": round(statistics.fmean(walls), 1),
                     "wall_ratio_to_default": round(sum(walls) / base, 3) if base else None,
                     "runs": runs[label]})
    return {"tag": tag, "date": started.strftime("%Y-%m-%d %H:%M UTC"), "seeds": seeds,
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "arch": platform.machine(),
                        "python": platform.python_version(), "torch": torch_version()},
            "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "candidates": rows}


def torch_version() -> str:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True)
    return done.stdout.strip() or "unknown"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def recipe_text(recipe: dict) -> str:
    """The shown recipe fields as one line: ``model.args`` spread out, lists as ``a-b``."""
    fields = {**{f"model.{k}": v for k, v in recipe.get("model.args", {}).items()},
              **{k: v for k, v in recipe.items() if k != "model.args"}}
    return ", ".join(f"{key} {'-'.join(map(str, value)) if isinstance(value, list) else value}"
                     for key, value in fields.items())


def markdown(records: list[dict]) -> str:
    lines = ["# The default job (`vitkit train`) over seeds: test accuracy and wall time", "",
             "`vitkit train` (the `digits` preset: sklearn's 8x8 digits, 359 test images, one image = 0.28 points) "
             "and variants of it given as flags, each trained once per seed by `benchmarks/digits_seeds.py`, one "
             "process per run (the wall time covers imports, data, training, the final test and the figures). "
             "The runs of one invocation are interleaved seed by seed, so that the load of other processes falls "
             "on all candidates alike; `time vs default` is a candidate's summed wall time over the default's in "
             "the same invocation (`default` is `vitkit train` with no flags as the preset stood when the "
             "invocation ran: its recipe is listed under each invocation, model fields not listed being "
             "`ViTConfig`'s defaults, such as `drop_path` 0; the runs' recipes are in the JSON record).", "",
             "    PYTHONPATH=src python benchmarks/digits_seeds.py --tag TAG --candidate LABEL='FLAGS' ...", ""]
    for record in records:
        machine = record["machine"]
        lines += [f"## {record['tag']}", "",
                  f"{record['date']}; {machine['cpu']}, {machine['cores']} cores ({machine['arch']}), torch "
                  f"{machine['torch']}, one thread per run; load average {record['loadavg_start'][0]:.1f} at the "
                  f"start, {record['loadavg_end'][0]:.1f} at the end (other jobs shared the machine when the load is "
                  f"above 1). Seeds {', '.join(map(str, record['seeds']))}; the command of each run is `vitkit train "
                  f"--seed N --run-dir runs/digits_seeds/{record['tag']}/LABEL/seedN FLAGS`.", "",
                  *([f"`default` trained: {recipe_text(record['candidates'][0]['recipe'])}.", ""]
                    if record["candidates"][0]["label"] == "default" else []),
                  "| candidate | flags | mean | seed 0 | min - max | per seed | mean wall s | time vs default |",
                  "|---|---|---:|---:|---|---|---:|---:|"]
        for row in record["candidates"]:
            per_seed = " ".join(f"{100 * r['test_accuracy']:.2f}" for r in row["runs"])
            ratio = "-" if row["wall_ratio_to_default"] is None else f"{row['wall_ratio_to_default']:.2f}"
            lines.append(f"| {row['label']} | `{row['flags'] or '(none)'}` | {percent(row['mean_test_accuracy'])} | "
                         f"{percent(row['seed0_test_accuracy'])} | {percent(row['min_test_accuracy'])} - "
                         f"{percent(row['max_test_accuracy'])} | {per_seed} | {row['mean_wall_seconds']} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def write(record: dict) -> None:
    path = RESULTS / "digits_seeds.json"
    records = json.loads(path.read_text()) if path.exists() else []
    records = [r for r in records if r["tag"] != record["tag"]] + [record]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    tmp.replace(path)
    (RESULTS / "digits_seeds.md").write_text(markdown(records))


def parse_candidate(text: str) -> tuple[str, list[str]]:
    label, equals, flags = text.partition("=")
    if not equals or not label or "/" in label or label == "default":
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL='FLAGS' (a label other than 'default')")
    return label, shlex.split(flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", help="name of this invocation's record (required unless --render)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--candidate", type=parse_candidate, action="append", default=[],
                        metavar="LABEL='FLAGS'", help="a variant: `vitkit train` flags (repeatable)")
    parser.add_argument("--no-default", action="store_true", help="leave out the default job (no time ratios)")
    parser.add_argument("--render", action="store_true", help="only write digits_seeds.md again from the JSON")
    args = parser.parse_args()
    if args.render:
        (RESULTS / "digits_seeds.md").write_text(markdown(json.loads((RESULTS / "digits_seeds.json").read_text())))
        return
    if not args.tag:
        parser.error("--tag is required")
    candidates = {} if args.no_default else {"default": []}
    for label, flags in args.candidate:
        if label in candidates:
            parser.error(f"candidate {label} given twice")
        candidates[label] = flags
    if not candidates:
        parser.error("nothing to run")
    os.chdir(REPO)
    record = invocation(args.tag, candidates, args.seeds)
    write(record)
    for row in record["candidates"]:
        print(f"== {row['label']}: mean {percent(row['mean_test_accuracy'])}, seed 0 "
              f"{percent(row['seed0_test_accuracy'])}, mean wall {row['mean_wall_seconds']} s, "
              f"x{row['wall_ratio_to_default']} of default", flush=True)


if __name__ == "__main__":
    main()
