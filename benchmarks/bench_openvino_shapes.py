"""OpenVINO compiled for the input's fixed shape (as ``OpenVinoModel`` runs an export) against the same graph
compiled for any shape, in bf16 (where the CPU has it, else fp32) and static int8, timed in turn within each repeat;
ratios are medians of per-repeat ratios.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/bench_openvino_shapes.py [--model ViT-S/16] [--batch 16]
        [--repeats 9] [--out benchmarks/results/openvino_shapes.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_deploy import machine

from vitkit.checkpoints.openvino import _compiled, _core, write_openvino
from vitkit.models import create_model
from vitkit.runtime import native_bf16, precision_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-S/16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = create_model(args.model).eval()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.batch, 3, *model.config.image_size)).astype(np.float32)
    calibration = [rng.standard_normal((8, 3, *model.config.image_size)).astype(np.float32) for _ in range(2)]
    low = precision_name(torch.bfloat16 if native_bf16(torch.device("cpu")) else torch.float32)
    runners = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, quantize in ((low, None), ("int8", "int8")):
            path = write_openvino(model, Path(folder) / f"{name}.xml", quantize=quantize,
                                  calibration=calibration if quantize else None).path
            graph = _core().read_model(path)
            fixed = graph.clone()
            fixed.reshape({graph.inputs[0].get_any_name(): list(images.shape)})
            runners[f"{name}, any shape"] = _compiled(graph, low)
            runners[f"{name}, fixed shape"] = _compiled(fixed, low)
    seconds: dict[str, list[float]] = {label: [] for label in runners}
    for label, compiled in runners.items():  # warm-up
        compiled(images)
    for repeat in range(args.repeats):
        for label, compiled in list(runners.items())[::1 if repeat % 2 == 0 else -1]:
            start = time.perf_counter()
            compiled(images)
            seconds[label].append(time.perf_counter() - start)
    lines = [f"{args.model}, batch {args.batch}, {torch.get_num_threads()} threads, median of {args.repeats} "
             f"interleaved repeats; other layers of the int8 graph in {low}", "",
             "| graph, compiled for | img/s (min-max) | fixed against any shape |", "|---|---:|---:|"]
    for label, times in seconds.items():
        kind = label.split(",")[0]
        ratio = statistics.median(a / b for a, b in zip(seconds[f"{kind}, any shape"], times))
        lines.append(f"| {label} | {args.batch / statistics.median(times):.1f} "
                     f"({args.batch / max(times):.1f}-{args.batch / min(times):.1f}) | {ratio:.2f}x |")
    text = (f"# OpenVINO: a graph compiled for the input's shape against the same graph compiled for any shape\n\n"
            f"Machine: {machine()}\n\nCommand: `OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} "
            f"PYTHONPATH=src python benchmarks/bench_openvino_shapes.py {' '.join(sys.argv[1:])}`\n\n"
            + "\n".join(lines) + "\n")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
