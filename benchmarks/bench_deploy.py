"""Deployment runtimes side by side: static int8 through ONNX Runtime (``quantize_static``, calibrated) against
dynamic int8, and OpenVINO (fp32, bf16, int8 from a static QDQ graph) against ONNX Runtime and torch eager, on one
ViT with the same weights, timed in turn within each repeat (medians; ratios are medians of per-repeat ratios).

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/bench_deploy.py speed [--model ViT-S/16] [--repeats 9]
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_deploy.py accuracy runs/digits/model

``speed`` times random-weight models (the head re-drawn, so that the logits are not all zero) at batch 16;
``accuracy`` gives the test top-1 of a trained checkpoint in fp32 ONNX, dynamic int8 and static int8
calibrated on 256 training images (the evaluation transform). OpenVINO rows appear when ``openvino`` is
importable (`vitkit[openvino]`). Prints a markdown table; the numbers on record are in
``benchmarks/results/deploy_int8_openvino.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from vitkit.checkpoints import load
from vitkit.checkpoints.onnx import INPUT, OUTPUT, session, write_onnx
from vitkit.data import evaluation_loader, load_dataset
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models import create_model


class Batches(CalibrationDataReader):
    """Calibration input for ``quantize_static``: one batch at a time, then None."""

    def __init__(self, batches: list[np.ndarray]):
        self.remaining = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self.remaining, None)
        return None if batch is None else {INPUT: batch}


def graphs(model, folder: Path, calibration: list[np.ndarray]) -> dict[str, Path]:
    """fp32 ONNX (checked by vitkit's export), dynamic int8 (what `--quantize int8` writes) and static int8
    (QDQ, uint8 activations, int8 weights, calibrated by min-max on ``calibration``)."""
    paths = {name: folder / f"{name}.onnx" for name in ("fp32", "dynamic", "prepared", "static")}
    write_onnx(model, paths["fp32"])
    quantize_dynamic(paths["fp32"], paths["dynamic"], weight_type=QuantType.QInt8)
    quant_pre_process(str(paths["fp32"]), str(paths["prepared"]))
    quantize_static(str(paths["prepared"]), str(paths["static"]), Batches(calibration), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return paths


def onnxruntime_runner(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    graph = session(path)
    return lambda images: graph.run([OUTPUT], {INPUT: images})[0]


def speed(name: str, repeats: int, batch: int = 16) -> None:
    torch.manual_seed(0)
    model = create_model(name).eval()
    torch.nn.init.normal_(model.head.weight, std=0.02)
    size = model.config.image_size
    rng = np.random.default_rng(0)
    calibration = [rng.standard_normal((8, 3, *size)).astype(np.float32) for _ in range(2)]
    images = rng.standard_normal((batch, 3, *size)).astype(np.float32)

    def eager(dtype: torch.dtype) -> Callable[[np.ndarray], np.ndarray]:
        @torch.no_grad()
        def run(x: np.ndarray) -> np.ndarray:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                return model(torch.from_numpy(x)).float().numpy()
        return run

    with tempfile.TemporaryDirectory() as folder:
        paths = graphs(model, Path(folder), calibration)
        runners = {"torch eager fp32": eager(torch.float32), "torch eager bf16 (autocast)": eager(torch.bfloat16),
                   "onnxruntime fp32": onnxruntime_runner(paths["fp32"]),
                   "onnxruntime int8 dynamic (vitkit's --quantize int8)": onnxruntime_runner(paths["dynamic"]),
                   "onnxruntime int8 static (QDQ, calibrated)": onnxruntime_runner(paths["static"])}
        try:
            import openvino
        except ImportError:
            print("openvino is not installed: its rows are left out")
        else:
            core = openvino.Core()

            def openvino_runner(path: Path, precision: str) -> Callable[[np.ndarray], np.ndarray]:
                compiled = core.compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                                 "INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                                 "PERFORMANCE_HINT": "LATENCY"})
                request = compiled.create_infer_request()
                return lambda x: request.infer({0: x})[0]

            runners.update({"openvino fp32": openvino_runner(paths["fp32"], "f32"),
                            "openvino bf16": openvino_runner(paths["fp32"], "bf16"),
                            "openvino int8 (the static QDQ graph)": openvino_runner(paths["static"], "f32")})
        reference = runners["torch eager fp32"](images)
        agreement = {}
        for label, run in runners.items():  # warm-up, and how far each runtime is from torch fp32
            logits = run(images)
            agreement[label] = (float(np.abs(logits - reference).max()), int((logits.argmax(-1) ==
                                                                              reference.argmax(-1)).sum()))
        seconds: dict[str, list[float]] = {label: [] for label in runners}
        load_before = os.getloadavg()[0]
        for _ in range(repeats):
            for label, run in runners.items():
                start = time.perf_counter()
                run(images)
                seconds[label].append(time.perf_counter() - start)
    print(f"{name}, batch {batch}, {torch.get_num_threads()} thread(s), median of {repeats} interleaved repeats, "
          f"load {load_before:.1f} -> {os.getloadavg()[0]:.1f}; logits scale {np.abs(reference).max():.3g}")
    print("| runtime | img/s | vs onnxruntime fp32 | vs onnxruntime int8 dynamic | max abs diff vs torch fp32 | "
          f"top-1 as torch fp32 (of {batch}) |")
    print("|---|---:|---:|---:|---:|---:|")
    bases = ("onnxruntime fp32", "onnxruntime int8 dynamic (vitkit's --quantize int8)")
    for label, times in seconds.items():
        ratios = " | ".join(f"{statistics.median(b / t for b, t in zip(seconds[base], times)):.2f}x" for base in bases)
        difference, same = agreement[label]
        print(f"| {label} | {batch / statistics.median(times):.1f} | {ratios} | {difference:.3g} | {same} |")


def accuracy(checkpoint: str, calibration_images: int = 256) -> None:
    model = load(checkpoint).eval()
    transform = checkpoint_transform(model.config)
    test = evaluation_loader(load_dataset("digits", "test"), transform, 256)
    calibration = []
    for images, _ in evaluation_loader(load_dataset("digits", "train"), transform, 64):
        calibration.append(images.numpy())
        if sum(len(b) for b in calibration) >= calibration_images:
            break
    with tempfile.TemporaryDirectory() as folder:
        paths = graphs(model, Path(folder), calibration)
        print("| graph | test top-1 |\n|---|---:|")
        for label in ("fp32", "dynamic", "static"):
            run = onnxruntime_runner(paths[label])
            right = total = 0
            for images, labels in test:
                right += int((run(images.numpy()).argmax(-1) == labels.numpy()).sum())
                total += len(labels)
            print(f"| {label} | {100 * right / total:.2f}% ({total} images) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["speed", "accuracy"])
    parser.add_argument("checkpoint", nargs="?", help="accuracy: a trained digits checkpoint")
    parser.add_argument("--model", default="ViT-S/16")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    if args.what == "speed":
        speed(args.model, args.repeats)
    elif not args.checkpoint:
        parser.error("accuracy needs a trained digits checkpoint")
    else:
        accuracy(args.checkpoint)


if __name__ == "__main__":
    main()
