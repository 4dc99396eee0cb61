"""Cost of looking inside: attention capture plus rollout against a plain (fused-attention) forward pass.

Both are timed in the same run, interleaved, several repeats, so that load from other processes on a
shared machine hits both alike; the median of the per-repeat ratios is reported.

    PYTHONPATH=src python benchmarks/bench_analysis.py [--model ViT-B/16] [--batch 32] [--repeats 5]

Writes benchmarks/results/analysis.json and analysis.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import vitkit
from vitkit.analysis import attention_rollout, capture_attention
from vitkit.atomic import atomic_file

RESULTS = Path(__file__).resolve().parent / "results"


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B/16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = vitkit.create_model(args.model, image_size=args.image_size).eval()
    images = torch.randn(args.batch, 3, args.image_size, args.image_size)

    def forward() -> None:
        with torch.no_grad():
            model(images)

    def capture_and_rollout() -> None:
        attention_rollout(*capture_attention(model, images))

    forward(), capture_and_rollout()  # warm-up: allocator, kernels, position-table cache
    plain, analysed = [], []
    for _ in range(args.repeats):
        plain.append(timed(forward))
        analysed.append(timed(capture_and_rollout))
    ratios = [a / p for a, p in zip(analysed, plain)]
    result = {
        "model": args.model, "batch": args.batch, "image_size": args.image_size, "repeats": args.repeats,
        "forward_s": plain, "capture_rollout_s": analysed, "ratios": ratios,
        "median_forward_s": statistics.median(plain), "median_capture_rollout_s": statistics.median(analysed),
        "median_ratio": statistics.median(ratios), "target_ratio": 1.5,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "load_average_1min_at_end": os.getloadavg()[0], "machine": platform.processor() or platform.machine(),
    }
    RESULTS.mkdir(exist_ok=True)
    with atomic_file(RESULTS / "analysis.json") as handle:
        json.dump(result, handle, indent=2)
    with atomic_file(RESULTS / "analysis.md") as handle:
        handle.write(f"# Attention capture + rollout vs plain forward\n\n"
                     f"{args.model}, {args.batch} images at {args.image_size} px, CPU, {result['threads']} threads, "
                     f"torch {torch.__version__}; {args.repeats} interleaved repeats after a warm-up; a shared "
                     f"machine ({os.cpu_count()} CPUs, 1-minute load {result['load_average_1min_at_end']:.1f} "
                     "at the end), so single repeats are noisy and the median ratio is the figure.\n\n"
                     "| repeat | forward (s) | capture + rollout (s) | ratio |\n|---|---|---|---|\n")
        for index, (p, a, r) in enumerate(zip(plain, analysed, ratios), 1):
            handle.write(f"| {index} | {p:.2f} | {a:.2f} | {r:.2f} |\n")
        handle.write(f"\nMedian ratio **{result['median_ratio']:.2f}** (target <= 1.5).\n")
    print(json.dumps({k: result[k] for k in ("median_forward_s", "median_capture_rollout_s", "median_ratio")}))


if __name__ == "__main__":
    main()
