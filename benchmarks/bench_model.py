"""Model speed per runtime and precision, against timm with the same weights: `vitkit bench` for several
variants, written to files (the measuring is vitkit.benchmark's).

    PYTHONPATH=src python benchmarks/bench_model.py [--models ViT-S/16 ViT-B/16] [--batch 16] [--repeats 5]
        [--runtimes eager compile onnxruntime timm] [--tag NAME]

Writes benchmarks/results/model[_NAME].json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch

import vitkit
from vitkit.atomic import atomic_file
from vitkit.benchmark import RUNTIMES, TABLE_HEADER, bench
from vitkit.runtime import best_device

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ViT-S/16", "ViT-B/16"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES))
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    device = best_device()
    load_before = os.getloadavg()
    measured = {}
    for name in args.models:
        torch.manual_seed(0)
        measured[name] = bench(vitkit.create_model(name), args.batch, device, args.runtimes, repeats=args.repeats)
    results = {name: {"rows": [row.to_dict() for row in rows], "skipped": skipped}
               for name, (rows, skipped) in measured.items()}
    machine = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
               "threads": torch.get_num_threads(), "torch": torch.__version__, "loadavg_before": load_before,
               "loadavg_after": os.getloadavg(), "batch": args.batch, "repeats": args.repeats}
    stem = f"model_{args.tag}" if args.tag else "model"
    with atomic_file(RESULTS / f"{stem}.json") as handle:
        json.dump({"machine": machine, "results": results}, handle, indent=1)
    lines = [f"224 px, batch {args.batch}, median of {args.repeats} interleaved repeats on {machine['device']} "
             f"({machine['threads']} threads, load {load_before[0]:.1f} -> {machine['loadavg_after'][0]:.1f}). "
             f"`vs timm fp32` is the median per-repeat ratio to timm fp32 with the same weights, same phase.", "",
             "| model | " + " | ".join(TABLE_HEADER) + " |", "|---|---|---|---|" + "---:|" * (len(TABLE_HEADER) - 3)]
    for name, (rows, skipped) in measured.items():
        lines += ["| " + " | ".join([name, *row.cells()]) + " |" for row in rows]
        lines += [f"| {name} | {runtime} | skipped: {reason} |" + " |" * (len(TABLE_HEADER) - 2)
                  for runtime, reason in skipped.items()]
    with atomic_file(RESULTS / f"{stem}.md") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
