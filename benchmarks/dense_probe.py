"""Dense heads on data at hand: MNIST digits pasted on 64-96 px canvases (``dense_digits.py``), probed from a backbone
trained here with the ``mnist`` preset. Segmentation by a linear head, linear-ms and DPT on the frozen backbone,
and linear with the backbone fine-tuned; depth by linear and DPT, frozen. mIoU, aAcc, the depth metrics and the
wall time of each run; overlays of four validation images; and the frozen probe's feature pass per family
(vitkit's ``dense_features`` against timm's ``forward_intermediates`` of the same architecture, same run).

    PYTHONPATH=src:benchmarks python benchmarks/dense_probe.py --data-dir ../shared/data

writes benchmarks/results/dense_probe.{json,md} and docs/figures/dense-digits.png; runs go to runs/dense-probe/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import dense_digits
from peft_records import machine, write
from timing import REPO, repo_relative

WORK = REPO / "runs" / "dense-probe"
FIGURE = REPO / "docs" / "figures" / "dense-digits.png"
PROBE = ["--image-size", "64", "--eval-every", "0", "--checkpoint-every", "0"]  # the rest: the head's dense preset
RUNS = {  # name: (objective, head, peft, flags beyond the dense preset's)
    "segmentation linear, frozen": ("segmentation", "linear", "linear", []),
    "segmentation linear, frozen, 2,000 steps": ("segmentation", "linear", "linear", ["--steps", "2000"]),
    "segmentation linear, frozen, whole images (features cached)": ("segmentation", "linear", "linear",
                                                                     ["--transform", "eval"]),
    "segmentation linear-ms, frozen": ("segmentation", "linear-ms", "linear", []),
    "segmentation dpt, frozen": ("segmentation", "dpt", "linear", []),
    "segmentation linear, fine-tuned (layer decay 0.3)": ("segmentation", "linear", "none", ["--layer-decay", "0.3"]),
    "depth linear, frozen": ("depth", "linear", "linear", []),
    "depth dpt, frozen": ("depth", "dpt", "linear", []),
}
SWEEP = {  # the learning rates beside each head's preset (--sweep): what the dense presets were chosen from
    "segmentation linear, frozen, lr 1e-3": ("segmentation", "linear", "linear", ["--lr", "1e-3"]),
    "segmentation linear, frozen, lr 3e-2": ("segmentation", "linear", "linear", ["--lr", "3e-2"]),
    "segmentation dpt, frozen, lr 1e-2": ("segmentation", "dpt", "linear", ["--lr", "1e-2"]),
}
FAMILIES = {  # vitkit name: timm architecture of the same shape
    "ViT-S/16": "vit_small_patch16_224", "DINOv2-S/14-reg4": "vit_small_patch14_reg4_dinov2",
    "DINOv3-S/16": "vit_small_patch16_dinov3", "EVA02-S/14": "eva02_small_patch14_224",
    "PE-core-S/16": "vit_pe_core_small_patch16_384",
}


def vitkit_command(*args: str) -> None:
    """``python -m vitkit ARGS`` in a process of its own (its output kept out of the record)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-m", "vitkit", *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"vitkit {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def probe_runs(data: Path, backbone: Path, runs: dict, quick: bool = False) -> dict:
    """Each of ``runs`` from the backbone: its test numbers and wall seconds (``quick``: 20 steps each, to try
    the script)."""
    results = {}
    for name, (objective, head, peft, flags) in runs.items():
        flags = [*flags, "--steps", "20"] if quick else flags
        run_dir = WORK / name.split(" (")[0].replace(" ", "-").replace(",", "")
        shutil.rmtree(run_dir, ignore_errors=True)
        dataset = f"{'maskfolder' if objective == 'segmentation' else 'depthfolder'}:{data / objective}"
        started = time.perf_counter()
        vitkit_command("finetune", str(backbone), "--objective", objective, "--head", head, "--peft", peft,
                       "--dataset", dataset, "--run-dir", str(run_dir), *PROBE, *flags)
        summary = json.loads((run_dir / "summary.json").read_text())
        results[name] = {"run_dir": repo_relative(run_dir), "wall_seconds": round(time.perf_counter() - started, 1),
                         "train_seconds": summary["train_seconds"], "steps": summary["steps"], "flags": flags,
                         "trained_params": summary["params/trained"], "total_params": summary["params/total"],
                         **{key.removeprefix("test/"): value for key, value in summary.items()
                            if key.startswith("test/") and key != "test/split"}}
        print(name, {k: v for k, v in results[name].items() if k in ("mIoU", "aAcc", "abs_rel", "a1", "wall_seconds")},
              flush=True)
    return results


def overlay_figure(data: Path) -> None:
    """Four validation canvases: the picture, its mask, and the three frozen heads' predictions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vitkit.atomic import atomic_file
    from vitkit.evaluate.dense import class_colours

    images = sorted((data / "segmentation" / "val" / "images").iterdir())[:4]
    heads = ["linear", "linear-ms", "dpt"]
    colours = class_colours(11)
    figure, axes = plt.subplots(len(images), 2 + len(heads), figsize=(2 * (2 + len(heads)), 2 * len(images)))
    for head in heads:
        vitkit_command("predict", str(WORK / f"segmentation-{head}-frozen" / "model"), *map(str, images), "--out",
                       str(WORK / "predictions" / head))
    from PIL import Image

    for row, image in enumerate(images):
        truth = np.array(Image.open(data / "segmentation" / "val" / "masks" / image.name))
        panels = [np.array(Image.open(image).convert("RGB")), np.where(truth[..., None] == 255, 255,
                                                                       colours[np.minimum(truth, 10)])]
        panels += [np.array(Image.open(WORK / "predictions" / head / f"{image.stem}-overlay.png")) for head in heads]
        for column, (panel, title) in enumerate(zip(panels, ["image", "mask (white: ignored)", *heads])):
            axes[row, column].imshow(panel)
            axes[row, column].axis("off")
            if row == 0:
                axes[row, column].set_title(title, fontsize=9)
    figure.tight_layout()
    with atomic_file(FIGURE, "wb") as handle:
        figure.savefig(handle, format="png", dpi=80)
    plt.close(figure)


def family_timing(repeats: int = 5, batch: int = 8, size: int = 224) -> dict:
    """Seconds of the frozen probe's feature pass (no gradient) for a batch at ``size`` px, per family: vitkit's
    ``dense_features`` of a linear head against timm's ``forward_intermediates`` (last block, normed, NCHW), both
    with random weights, alternated, median of ``repeats``."""
    import timm

    from vitkit.models import create_model

    results = {}
    images = torch.randn(batch, 3, size, size)
    for name, architecture in FAMILIES.items():
        ours = create_model(name, image_size=size, dense_head="linear", num_classes=8).eval()
        peer = timm.create_model(architecture, pretrained=False, img_size=size, num_classes=0).eval()
        times = {"vitkit": [], "timm": []}
        with torch.no_grad():
            for repeat in range(repeats + 1):
                for library, run in (("vitkit", lambda: ours.dense_features(images)),
                                     ("timm", lambda: peer.forward_intermediates(
                                         images, indices=1, norm=True, output_fmt="NCHW", intermediates_only=True))):
                    started = time.perf_counter()
                    run()
                    if repeat:  # the first pass warms up
                        times[library].append(time.perf_counter() - started)
        ours_s, timm_s = statistics.median(times["vitkit"]), statistics.median(times["timm"])
        results[name] = {"timm": architecture, "vitkit_seconds": round(ours_s, 4), "timm_seconds": round(timm_s, 4),
                         "ratio": round(ours_s / timm_s, 3), "tokens": ours.config.grid_size[0] * ours.config.grid_size[1]}
        print(name, results[name], flush=True)
    return results


def report(record: dict) -> str:
    m = record["machine"]
    lines = ["# Dense heads on pasted digits", "",
             f"Measured {m['date']} on {m['model']} ({m['threads']} threads, torch {m['torch']}; load "
             f"{m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after; {m['wall_seconds']:.0f} s in all) by "
             "`PYTHONPATH=src:benchmarks python benchmarks/dense_probe.py --data-dir ../shared/data`.", "",
             f"Data: `{record['data']['command']}`: {record['data']['train']} training and {record['data']['val']} "
             "validation canvases of 64-96 px, 1-3 MNIST digits each at scale 0.8-2 (validation digits from MNIST's "
             "test set); 11 classes (background and the ten digits), the strokes' soft edges ignored; depth 2 / scale "
             "metres for a digit, 8 m behind. Backbone: "
             f"`{record['backbone']['command']}` ({record['backbone']['test_accuracy'] * 100:.2f}% MNIST test "
             f"accuracy, {record['backbone']['train_seconds']:.0f} s), probed at 64 px (a 16x16 grid). Every probe: "
             "its head's preset (`dense-linear`: AdamW at 1e-2, `dense-dpt`: at 1e-3; weight decay 1e-4, 600 steps "
             "of 16 random crops, linear decay after 50 warm-up steps) unless the run's name says otherwise; "
             "metrics on all validation canvases at their own size.", "",
             "| run | trained params | mIoU | aAcc | AbsRel | RMSE (m) | δ<1.25 | train s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in record["runs"].items():
        def cell(key, scale=100, digits=2):
            return f"{r[key] * scale:.{digits}f}" if key in r else ""
        lines.append(f"| {name} | {r['trained_params']:,} of {r['total_params']:,} | {cell('mIoU')} | {cell('aAcc')} | "
                     f"{cell('abs_rel', 1, 3)} | {cell('rmse', 1, 3)} | {cell('a1')} | {r['train_seconds']:.0f} |")
    lines += ["", "Overlays (validation canvases; the frozen heads): `docs/figures/dense-digits.png`.", "",
              "## The frozen probe's feature pass per family", "",
              "Batch of 8 at 224 px, random weights, no gradient, median of 5 alternated passes: vitkit's "
              "`dense_features` (the last block's normed patch map, what `--head linear` reads) against timm's "
              "`forward_intermediates(indices=1, norm=True, output_fmt='NCHW')` of the same architecture.", "",
              "| family | timm architecture | tokens | vitkit s | timm s | vitkit / timm |", "|---|---|---:|---:|---:|---:|"]
    for name, r in record["families"].items():
        lines.append(f"| {name} | {r['timm']} | {r['tokens']} | {r['vitkit_seconds']:.3f} | {r['timm_seconds']:.3f} | "
                     f"{r['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def sweep_report(record: dict) -> str:
    m = record["machine"]
    lines = ["# Dense heads: learning rates beside the presets'", "",
             f"Measured {m['date']} on {m['model']} ({m['threads']} threads, torch {m['torch']}; load "
             f"{m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after) by `PYTHONPATH=src:benchmarks "
             "python benchmarks/dense_probe.py --data-dir ../shared/data --sweep`, on the data and backbone of "
             "`dense_probe.md` (whose runs at the presets' rates, linear at 1e-2 and DPT at 1e-3, are beside these): "
             "600 steps of 16 random crops, AdamW, weight decay 1e-4, the backbone frozen.", "",
             "| run | mIoU | aAcc | train s |", "|---|---:|---:|---:|"]
    for name, r in record["runs"].items():
        lines.append(f"| {name} | {100 * r['mIoU']:.2f} | {100 * r['aAcc']:.2f} | {r['train_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="the folder holding torchvision's MNIST")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--val", type=int, default=400)
    parser.add_argument("--skip-backbone", action="store_true", help="reuse runs/dense-probe/backbone")
    parser.add_argument("--quick", action="store_true", help="a try of the script: few images and steps, no record")
    parser.add_argument("--sweep", action="store_true", help="the learning rates beside the presets' instead "
                        "(results/dense_lr_sweep.md; needs the backbone and data of a run without it)")
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    threads = torch.get_num_threads()
    data = WORK / "data"
    if args.sweep:
        record = {"runs": probe_runs(data, WORK / "backbone" / "model", SWEEP)}
        record["machine"] = machine(threads, load, started)
        print(write("dense_lr_sweep", record, sweep_report))
        return
    shutil.rmtree(data, ignore_errors=True)
    dense_digits.write(data, "mnist", args.data_dir, {"train": args.train, "val": args.val}, (64, 96), (0.8, 2.0),
                       (1, 3))
    backbone_dir = WORK / "backbone"
    backbone_args = ["train", "--preset", "mnist", "--data-dir", args.data_dir, "--run-dir", str(backbone_dir)]
    if not args.skip_backbone:
        shutil.rmtree(backbone_dir, ignore_errors=True)
        vitkit_command(*backbone_args, *(["--epochs", "0.05"] if args.quick else []))
    backbone = json.loads((backbone_dir / "summary.json").read_text())
    record = {
        "data": {"command": f"python benchmarks/dense_digits.py {repo_relative(data)} --source mnist --data-dir "
                            f"{repo_relative(args.data_dir)} --train {args.train} --val {args.val}",
                 "train": args.train, "val": args.val},
        "backbone": {"command": "vitkit " + " ".join(backbone_args[:3] + ["--data-dir", repo_relative(args.data_dir)]),
                     "test_accuracy": backbone["test/accuracy"], "train_seconds": backbone["train_seconds"]},
        "runs": probe_runs(data, backbone_dir / "model", RUNS, args.quick),
    }
    if args.quick:
        print(report({**record, "families": {}, "machine": machine(threads, load, started)}))
        return
    overlay_figure(data)
    record["families"] = family_timing()
    record["machine"] = machine(threads, load, started)
    print(write("dense_probe", record, report))


if __name__ == "__main__":
    main()
