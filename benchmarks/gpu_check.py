"""The GPU acceptance run behind `make gpu-check` (docs/guide/gpu.md), in one process of under 10 minutes:

1. `pytest -m cuda` (tests/test_cuda.py);
2. ViT-B/16 against timm holding the same weights, eager and compiled, fp32 and bf16, inference and training
   step (vitkit.benchmark), with the MFU against the device's dense bf16 datasheet peak and the matrix product
   measured in the same run beside it;
3. a short real training run: the CIFAR-10 subset, bf16, compiled: test accuracy and images/s.

It writes benchmarks/results/gpu.md (device, date, figures, the issue's goals met or not). ``--dry-run`` runs the
same code on a tiny model, collecting the tests instead of running them (the CPU test suite checks it that way).

    PYTHONPATH=src python benchmarks/gpu_check.py --data .gpu-data/cifar10_subset.npz
    PYTHONPATH=src python benchmarks/gpu_check.py --device cpu --dry-run --data digits --out /tmp/gpu.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import vitkit
from vitkit.benchmark import TABLE_HEADER, Row, bench, peak_notes
from vitkit.cli import main as vitkit_main
from vitkit.errors import DeviceError
from vitkit.runtime import select_device

ROOT = Path(__file__).resolve().parents[1]
# The goals of a GPU run: bf16 training >= 1.1x timm's images/s and >= 45% MFU; inference >= 1.2x timm eager bf16.
GOALS = {"train": 1.1, "mfu": 0.45, "inference": 1.2}
# The training run: a ViT-Ti-sized model on 32x32 images in 4x4 patches (64 tokens).
CIFAR_MODEL = {"patch_size": 4, "dim": 192, "depth": 6, "num_heads": 3, "mlp_dim": 768}
TINY_MODEL = {"patch_size": 4, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 16}


def run_tests(dry_run: bool) -> tuple[int, str]:
    """`pytest -m cuda` in a child process (``dry_run``: only collected); its exit code and summary line (its whole
    report on stderr)."""
    command = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "--durations=8",
               "tests/test_cuda.py"]
    result = subprocess.run([*command, *(["--collect-only"] if dry_run else [])], cwd=ROOT, capture_output=True,
                            text=True)
    # pytest's own report (tracebacks, the slowest tests) goes to stderr: one run on a lent machine says what to mend
    print(result.stdout[-20000:], result.stderr[-5000:], sep="\n", file=sys.stderr, flush=True)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return result.returncode, "\n".join([*failures, lines[-1] if lines else result.stderr.strip()[-500:]])


def run_bench(device: torch.device, dry_run: bool) -> list[Row]:
    """ViT-B/16 (``dry_run``: a tiny ViT) against timm: eager in fp32 and bf16, compiled in bf16."""
    if dry_run:
        model, batch = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1), 2
        return bench(model, batch, device, ("eager", "timm"), ["fp32", "bf16"], repeats=2, warmup=1, peak_size=128)[0]
    model, batch = vitkit.create_model("ViT-B/16"), 64
    rows = bench(model, batch, device, ("eager", "timm"), ["fp32", "bf16"], warmup=3)[0]
    return rows + bench(model, batch, device, ("compile", "timm-compile"), ["bf16"], warmup=3)[0]


def goals(rows: list[Row]) -> list[tuple[str, str, bool | None]]:
    """(goal, figure, met) for the issue's goals, from the bench rows (None where a row is missing)."""
    speed = {(row.runtime, row.precision, row.phase): row for row in rows}

    def ratio(ours: tuple, theirs: tuple) -> float | None:
        return speed[ours].images_per_s / speed[theirs].images_per_s if ours in speed and theirs in speed else None

    train = ratio(("compile", "bf16", "train_step"), ("timm-compile", "bf16", "train_step")) or \
        ratio(("eager", "bf16", "train_step"), ("timm", "bf16", "train_step"))
    inference = max(filter(None, [ratio((runtime, "bf16", "inference"), ("timm", "bf16", "inference"))
                                  for runtime in ("eager", "compile")]), default=None)
    mfu = max((row.fraction_of_peak for row in rows if row.precision == "bf16" and row.phase == "train_step"
               and row.runtime in ("eager", "compile")), default=None)
    found = [("bf16 training images/s against timm's (compiled against compiled, else eager)", train,
              GOALS["train"], "x"),
             ("bf16 training MFU (against the datasheet peak)", mfu, GOALS["mfu"], "%"),
             ("bf16 inference images/s against timm eager bf16", inference, GOALS["inference"], "x")]
    return [(f"{name} >= {goal:.0%}" if unit == "%" else f"{name} >= {goal}x",
             "-" if value is None else (f"{value:.0%}" if unit == "%" else f"{value:.2f}x"),
             None if value is None else value >= goal) for name, value, goal, unit in found]


def run_training(device: torch.device, data: str, dry_run: bool) -> dict:
    """`vitkit train` on ``data`` in bf16, compiled (``dry_run``: a few steps of a tiny model, not compiled); the
    test accuracy, the median logged images/s, the wall time."""
    model = TINY_MODEL if dry_run else CIFAR_MODEL
    length = ["--steps", "3"] if dry_run else ["--epochs", "30"]
    compiled = [] if dry_run else ["--compile"]
    with tempfile.TemporaryDirectory(prefix="vitkit-gpu-check-") as folder:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = vitkit_main(["train", "--dataset", data, "--model-args", json.dumps(model), *length,
                                "--batch-size", "32" if dry_run else "256", "--lr", "1e-3", "--warmup-steps", "0"
                                if dry_run else "100", "--crop-scale", "0.35", "1.0", "--precision",
                                "bf16" if device.type == "cuda" else "auto", *compiled, "--device", str(device),
                                "--log-every", "1" if dry_run else "20", "--run-dir", str(Path(folder) / "run")])
        seconds = time.perf_counter() - start
        if code:
            return {"exit code": code}
        run = Path(folder) / "run"
        summary = json.loads((run / "summary.json").read_text())
        speeds = [record["train/images_per_s"] for record in map(json.loads, (run / "metrics.jsonl").read_text()
                                                                  .splitlines()) if "train/images_per_s" in record]
    return {"steps": summary["steps"], "test accuracy": f"{summary['test/accuracy']:.4f}",
            "images/s (median of the logged)": f"{statistics.median(speeds[1:] or speeds):.0f}",
            "wall seconds (compilation included)": f"{seconds:.0f}"}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({torch.cuda.device_count()} GPU(s))"
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def report(device: torch.device, data: str, tests: tuple[int, str], rows: list[Row], training: dict,
           dry_run: bool, seconds: float) -> str:
    """The Markdown of benchmarks/results/gpu.md."""
    table = [" | ".join(TABLE_HEADER), " | ".join("---" for _ in TABLE_HEADER)]
    table += [" | ".join(row.cells()) for row in rows]
    lines = [f"# GPU check{' (dry run)' if dry_run else ''}", "",
             f"{device_name(device)}; torch {torch.__version__}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {seconds:.0f} s in all. "
             f"Command: `make gpu-check` (benchmarks/gpu_check.py).", "",
             "## `pytest -m cuda`", "", f"exit code {tests[0]}:", "", "```", tests[1], "```", "",
             "## ViT-B/16 against timm (same weights)" if not dry_run else "## A tiny ViT against timm", "",
             *(f"| {line} |" for line in table), "", *(f"- {note}" for note in peak_notes(rows)), "",
             "| goal | measured | met |", "| --- | --- | --- |",
             *(f"| {goal} | {figure} | {'-' if met is None else 'yes' if met else 'no'} |"
               for goal, figure, met in goals(rows)), "",
             f"## Training: {data}, bf16{'' if dry_run else ', compiled'}", "",
             "| | |", "| --- | --- |", *(f"| {key} | {value} |" for key, value in training.items()), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data", default=".gpu-data/cifar10_subset.npz",
                        help="the training run's dataset: an .npz path (make gpu-data) or a vitkit dataset name")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu.md"))
    parser.add_argument("--dry-run", action="store_true", help="a tiny model; the tests only collected")
    args = parser.parse_args(argv)
    try:
        device = select_device(args.device)
    except DeviceError as error:
        print(f"gpu_check: {error} (a GPU machine, or --device cpu --dry-run)", file=sys.stderr)
        return 1
    data = args.data
    if data.endswith(".npz"):
        if not Path(data).is_file():
            print(f"gpu_check: {data}: no such file; expected the CIFAR-10 subset there (make gpu-data)",
                  file=sys.stderr)
            return 1
        data = f"npz:{data}"
    start = time.perf_counter()
    tests = run_tests(args.dry_run)
    print(f"tests: {tests[1]}", flush=True)
    rows = run_bench(device, args.dry_run)
    print(f"bench: {len(rows)} rows", flush=True)
    training = run_training(device, data, args.dry_run)
    print(f"training: {training}", flush=True)
    text = report(device, data, tests, rows, training, args.dry_run, time.perf_counter() - start)
    Path(args.out).write_text(text)
    print(text)
    return 0 if tests[0] == 0 and "exit code" not in training else 1


if __name__ == "__main__":
    sys.exit(main())
