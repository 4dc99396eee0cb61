"""RoPE families against timm's Eva with the same weights: a timm model (random timm init) is saved as a hub
directory, read back with vitkit.load, and both are timed by vitkit.benchmark (medians of interleaved repeats),
eager against eager and compiled against compiled, inference and a training step (forward, backward, AdamW).

    PYTHONPATH=src python benchmarks/bench_rope.py [--models vit_small_patch16_dinov3 eva02_small_patch14_224]
        [--batch 8] [--repeats 5] [--runtimes eager timm compile timm-compile] [--tag NAME]

Writes benchmarks/results/rope[_NAME].json and .md with the machine (CPU model and flags, threads, load), the
date and the ratio per row (above 1: vitkit is faster).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
from pathlib import Path

import torch

import vitkit
from vitkit.atomic import atomic_file
from vitkit.benchmark import EXTRA_RUNTIMES, RUNTIMES, TABLE_HEADER, bench

RESULTS = Path(__file__).resolve().parent / "results"
# The timm architectures measured and the shape each stands for.
SHAPES = {"vit_small_patch16_dinov3": "DINOv3-S/16", "eva02_small_patch14_224": "EVA02-S/14"}
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "avx_vnni", "fma")


def cpu() -> dict[str, object]:
    """The CPU's model name and the vector/matrix flags that decide GEMM speed, from /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or platform.machine(), "flags": []}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name", "unknown"), "flags": [f for f in CPU_FLAGS if f in flags],
            "cores": os.cpu_count()}


def pair(architecture: str, workdir: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """timm's model with timm's random initialisation, and vitkit's reading of it from a saved hub directory."""
    import timm
    from timm.models._hub import save_for_hf

    torch.manual_seed(0)
    theirs = timm.create_model(architecture).eval()
    save_for_hf(theirs, str(workdir / architecture))
    ours = vitkit.load(workdir / architecture).eval()
    with torch.no_grad():
        x = torch.randn(1, 3, *ours.config.image_size)
        difference = (ours(x) - theirs(x)).abs().max().item()
    if difference > 1e-4:
        raise SystemExit(f"{architecture}: vitkit's logits differ from timm's by {difference:g}; not the same model")
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runtimes", nargs="+", choices=RUNTIMES + EXTRA_RUNTIMES,
                        default=["eager", "timm", "compile", "timm-compile"])
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's choice); on a "
                        "machine shared with other work one thread per process times steadier")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    load_before, measured = os.getloadavg(), {}
    with tempfile.TemporaryDirectory(prefix="vitkit-rope-") as workdir:
        for architecture in args.models:
            ours, theirs = pair(architecture, Path(workdir))
            measured[architecture] = bench(ours, args.batch, device, args.runtimes, ["fp32"], args.repeats,
                                           twin=theirs)
    machine = {"cpu": cpu(), "threads": torch.get_num_threads(), "torch": torch.__version__,
               "timm": __import__("timm").__version__, "date": datetime.date.today().isoformat(),
               "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "batch": args.batch,
               "repeats": args.repeats}
    stem = f"rope_{args.tag}" if args.tag else "rope"
    results = {name: {"rows": [row.to_dict() for row in rows], "skipped": skipped}
               for name, (rows, skipped) in measured.items()}
    with atomic_file(RESULTS / f"{stem}.json") as handle:
        json.dump({"machine": machine, "results": results}, handle, indent=1)
    info, threads = machine["cpu"], f"{machine['threads']} thread{'s' if machine['threads'] > 1 else ''}"
    lines = [f"RoPE models against timm's Eva holding the same weights (timm {machine['timm']}, torch "
             f"{machine['torch']}), {machine['date']}. CPU: {info['model']} ({', '.join(info['flags'])}), "
             f"{threads}, load {load_before[0]:.1f} -> {machine['loadavg_after'][0]:.1f}. "
             f"224 px, batch {args.batch}, fp32, median of {args.repeats} interleaved repeats. `vs timm fp32` is the "
             "median per-repeat ratio of timm's time to vitkit's in the same phase (above 1: vitkit faster): eager "
             "against timm eager, compiled against timm compiled. Where the time goes: rope_profile.md.", "",
             "| model | timm architecture | " + " | ".join(TABLE_HEADER) + " |",
             "|---|---|---|---|---|" + "---:|" * (len(TABLE_HEADER) - 3)]
    for architecture, (rows, skipped) in measured.items():
        lines += ["| " + " | ".join([SHAPES[architecture], architecture, *row.cells()]) + " |" for row in rows]
        lines += [f"| {SHAPES[architecture]} | {architecture} | {runtime} | skipped: {reason} |" +
                  " |" * (len(TABLE_HEADER) - 2) for runtime, reason in skipped.items()]
    with atomic_file(RESULTS / f"{stem}.md") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
