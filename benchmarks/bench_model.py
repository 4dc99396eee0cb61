"""Model speed against timm: inference and training-step throughput of the same ViT with the same weights.

timm's model is built, its state dict is read by ``vitkit.load`` (so both hold identical weights, and
their logits are checked to agree), and the two are timed interleaved, several repeats, so that load
from other processes hits both alike; medians and the median per-repeat ratio are reported. On a GPU
the peak memory of each phase is reported too.

    PYTHONPATH=src python benchmarks/bench_model.py [--models ViT-S/16 ViT-B/16] [--batch 8] [--repeats 5]

Writes benchmarks/results/model.json and model.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file
from torch import nn

import vitkit
from vitkit.atomic import atomic_file

RESULTS = Path(__file__).resolve().parent / "results"
TIMM_NAMES = {"ViT-Ti/16": "vit_tiny_patch16_224", "ViT-S/16": "vit_small_patch16_224",
              "ViT-B/16": "vit_base_patch16_224", "ViT-B/32": "vit_base_patch32_224",
              "ViT-L/16": "vit_large_patch16_224"}


def twins(name: str, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """timm's model and vitkit's, holding the same weights."""
    torch.manual_seed(0)
    theirs = timm.create_model(TIMM_NAMES[name], pretrained=False)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "timm.safetensors"
        save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, path)
        ours = vitkit.load(path)
    return ours.to(device), theirs.to(device)


def phases(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict[str, Callable[[], None]]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def inference() -> None:
        model.eval()
        with torch.no_grad():
            model(images)

    def train_step() -> None:
        model.train()
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return {"inference": inference, "train_step": train_step}


def measure(function: Callable[[], None], device: torch.device) -> tuple[float, float | None]:
    """Seconds, and peak memory in MiB on a GPU (None on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    function()
    if device.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated() / 2**20
    return time.perf_counter() - start, None


def bench(name: str, batch: int, repeats: int, device: torch.device) -> dict:
    ours, theirs = twins(name, device)
    images = torch.randn(batch, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    with torch.no_grad():
        logits = ours.eval()(images)
        agree = (logits - theirs.eval()(images)).abs().max().item()
    runs = {"vitkit": phases(ours, images, labels), "timm": phases(theirs, images, labels)}
    for library in runs.values():  # warm-up: allocator, kernels, caches
        for phase in library.values():
            phase()
    seconds = {lib: {phase: [] for phase in runs[lib]} for lib in runs}
    memory: dict = {lib: {} for lib in runs}
    for _ in range(repeats):
        for phase in ("inference", "train_step"):
            for lib in runs:
                took, peak = measure(runs[lib][phase], device)
                seconds[lib][phase].append(took)
                memory[lib][phase] = peak
    record: dict = {"model": name, "batch": batch, "max_abs_logit": logits.abs().max().item(),
                    "max_logit_difference": agree}
    for phase in ("inference", "train_step"):
        ratios = [t / p for t, p in zip(seconds["timm"][phase], seconds["vitkit"][phase])]
        record[phase] = {lib: {"median_s": statistics.median(seconds[lib][phase]),
                               "images_per_s": batch / statistics.median(seconds[lib][phase]),
                               "peak_mib": memory[lib][phase]} for lib in runs}
        record[phase]["speedup_vs_timm"] = statistics.median(ratios)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ViT-S/16", "ViT-B/16"], choices=sorted(TIMM_NAMES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    records = [bench(name, args.batch, args.repeats, device) for name in args.models]
    machine = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
               "threads": args.threads, "torch": torch.__version__, "timm": timm.__version__,
               "loadavg": os.getloadavg(), "repeats": args.repeats}
    with atomic_file(RESULTS / "model.json") as handle:
        json.dump({"machine": machine, "results": records}, handle, indent=1)
    lines = [f"Same weights, 224 px, batch {args.batch}, median of {args.repeats} interleaved repeats on "
             f"{machine['device']} ({args.threads} threads, load {machine['loadavg'][0]:.1f}).", "",
             "| model | phase | vitkit img/s | timm img/s | vitkit speed / timm | peak MiB vitkit / timm |",
             "|---|---|---:|---:|---:|---:|"]
    for record in records:
        for phase in ("inference", "train_step"):
            ours, theirs = record[phase]["vitkit"], record[phase]["timm"]
            peak = "-" if ours["peak_mib"] is None else f"{ours['peak_mib']:.0f} / {theirs['peak_mib']:.0f}"
            lines.append(f"| {record['model']} | {phase} | {ours['images_per_s']:.1f} | {theirs['images_per_s']:.1f} "
                         f"| {record[phase]['speedup_vs_timm']:.2f}x | {peak} |")
    with atomic_file(RESULTS / "model.md") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
