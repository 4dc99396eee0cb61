"""``vitkit bench``: a model's throughput in every runtime and precision the machine has, against the GEMM peak
and timm."""

from __future__ import annotations

import argparse
import json
import sys

from ..benchmark import (BENCH_FILE, DEFAULT_RUNTIMES, EXTRA_RUNTIMES, MAX_REPEATS, MIN_REPEATS, RUNTIMES, SETTLED,
                         TABLE_HEADER, bench_checkpoint, peak_notes)
from .flags import checkpoint_flags, image_size_type, positive, print_table, runtime_flags

HELP: dict[str, tuple[str, str | None]] = {
    "bench": ("Inference and training-step throughput in every runtime and precision the machine has, against timm.",
              "example:\n  vitkit bench ViT-S/16 --batch-size 16 --runtimes eager onnxruntime timm"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    bench_ = sub.add_parser("bench", help="throughput per runtime and precision, against the GEMM peak and timm")
    checkpoint_flags(bench_, help="a checkpoint, or a named variant such as ViT-S/16 (random weights)")
    bench_.add_argument("--batch-size", "-b", type=positive, default=8)
    bench_.add_argument("--image-size", type=image_size_type, metavar="HxW", help="input size (default: the model's)")
    runtime_flags(bench_, precision=False)
    bench_.add_argument("--precision", nargs="+", choices=("fp32", "bf16", "fp16", "int8"),
                        help="only these (default: fp32, the low precision the device runs natively, int8 ONNX and "
                             "OpenVINO)")
    bench_.add_argument("--runtimes", nargs="+", choices=RUNTIMES + EXTRA_RUNTIMES, default=list(DEFAULT_RUNTIMES),
                        help=f"default: {' '.join(DEFAULT_RUNTIMES)} (compile takes a minute or more a row on a CPU; "
                             "timm-compile: timm's model compiled, the reference of the compile rows)")
    bench_.add_argument("--repeats", type=positive,
                        help=f"timed repeats of every row (default: {MIN_REPEATS}, more up to {MAX_REPEATS} while "
                             f"a row's slowest and fastest lie over {round(100 * SETTLED)}%% of its median apart)")
    bench_.add_argument("--peak-size", type=positive,
                        help="largest side of the matrix products that measure each precision's peak (default: 8192 "
                             "on a GPU, 2048 elsewhere)")
    bench_.add_argument("--json", action="store_true", help="the rows as a JSON list")
    bench_.add_argument("--out", metavar="DIR", help=f"folder that receives the rows and their setting as {BENCH_FILE}")
    bench_.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Inference and training-step throughput of a model in every runtime and precision available here."""
    done = bench_checkpoint(args.checkpoint, args.batch_size, args.device, args.runtimes, args.precision, args.repeats,
                            args.peak_size, args.image_size, args.overrides, args.out, adapter=args.adapter)
    if done.written:
        print(f"numbers in {done.written}", file=sys.stderr)
    if args.json:
        print(json.dumps(done.record()["rows"], indent=1))
        return 0
    height, width = done.image_size
    print(f"{args.checkpoint} at {height}x{width}, batch {args.batch_size} on {done.device} "
          f"({done.threads} threads, load {done.load:.1f}); images/s: the median of "
          f"{done.rows[0].repeats if done.rows else 0} interleaved repeats and the slowest-fastest")
    print_table(TABLE_HEADER, [row.cells() for row in done.rows])
    print("\n".join(peak_notes(done.rows)))
    for runtime, reason in done.skipped.items():
        print(f"skipped {runtime}: {reason}")
    return 0
