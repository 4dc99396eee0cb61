"""CPU deployment: vitkit's exports (ONNX Runtime fp32, dynamic int8, static int8; OpenVINO fp32, bf16, static
int8) against timm's paths (eager fp32, ``torch.compile`` fp32 and, where the CPU computes bf16 natively, bf16
weights), one ViT with the same weights, timed in turn within each repeat (medians; ratios are medians of
per-repeat ratios; timm's fastest path is the fastest that keeps the top-1 class of most images), and the int8
exports' accuracy on trained checkpoints.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/bench_deploy.py speed [--model ViT-S/16] [--repeats 7]
    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/bench_deploy.py accuracy RUN/model --dataset digits

To see a CPU without AVX-512, bf16 or int8 dot products on one that has them, cap the instruction sets the math
libraries use (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``): torch, timm and
OpenVINO's oneDNN kernels then run AVX2 code (some of OpenVINO's own kernels still use AVX-512), and the ONNX
Runtime rows are left out, as its kernels ignore these caps.

``speed`` times random-weight models (the head re-drawn, so that the logits are not all zero) at batch 16, the
static int8 graphs calibrated on random images (speed does not depend on the scales); each row says the precision
that ran (the graph's products for ONNX, the plugin's per-layer precisions for OpenVINO). ``accuracy`` gives the
test top-1 of a trained checkpoint in PyTorch and in each export, int8 calibrated on 256 training images through
the evaluation transform, as ``vitkit convert --quantize int8 --calibration DATASET`` does. Both print Markdown;
``--out FILE`` also writes it, with the machine, its CPU flags, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vitkit.benchmark import timm_twin
from vitkit.checkpoints import load
from vitkit.checkpoints.onnx import OnnxModel, write_onnx
from vitkit.checkpoints.openvino import OpenVinoModel, write_openvino
from vitkit.checkpoints.quantize import INT8_DOT_FLAGS
from vitkit.data import evaluation_loader, load_dataset
from vitkit.evaluate.calibration import calibration_batches
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models import create_model
from vitkit.runtime import cpu_flags, native_bf16

from timing import cpu_model

FLAGS_SHOWN = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")  # honoured by torch and oneDNN


def isa_caps() -> dict[str, str]:
    """The instruction-set caps set in the environment (``ISA_CAPS``)."""
    return {name: os.environ[name] for name in ISA_CAPS if os.environ.get(name)}


def exports(model, folder: Path, calibration: list[np.ndarray]) -> dict[str, Path]:
    """vitkit's exports of ``model``: fp32, dynamic and static int8 ONNX; fp32 and static int8 OpenVINO."""
    paths = {"onnx fp32": folder / "fp32.onnx", "onnx dynamic": folder / "dynamic.onnx",
             "onnx static": folder / "static.onnx", "openvino": folder / "fp32.xml", "openvino int8": folder / "int8.xml"}
    write_onnx(model, paths["onnx fp32"])
    if not isa_caps():
        write_onnx(model, paths["onnx dynamic"], quantize="int8")
        write_onnx(model, paths["onnx static"], quantize="int8", calibration=calibration)
    write_openvino(model, paths["openvino"], traced=paths["onnx fp32"])
    write_openvino(model, paths["openvino int8"], traced=paths["onnx fp32"], quantize="int8", calibration=calibration)
    return paths


def deployed(paths: dict[str, Path]) -> dict[str, torch.nn.Module]:
    """Each export as vitkit runs it (``vitkit eval`` / ``predict``): OpenVINO in fp32 and, where the CPU computes
    bf16 natively, in bf16 (its int8 graph then runs its other layers in bf16, else in fp32)."""
    low = torch.bfloat16 if native_bf16(torch.device("cpu")) else torch.float32
    runners = {} if isa_caps() else {"vitkit onnxruntime fp32": OnnxModel(paths["onnx fp32"]),
                                     "vitkit onnxruntime int8 dynamic": OnnxModel(paths["onnx dynamic"]),
                                     "vitkit onnxruntime int8 static": OnnxModel(paths["onnx static"])}
    runners["vitkit openvino fp32"] = OpenVinoModel(paths["openvino"], torch.float32)
    if low == torch.bfloat16:
        runners["vitkit openvino bf16"] = OpenVinoModel(paths["openvino"], low)
    runners["vitkit openvino int8"] = OpenVinoModel(paths["openvino int8"], low)
    return runners


def timm_paths(model, images: torch.Tensor) -> dict[str, tuple[str, Callable[[], torch.Tensor]]]:
    """timm's ways to run ``model``'s weights: eager fp32, compiled fp32, and bf16 weights where native."""
    twin = timm_twin(model).eval()
    compiled = torch.compile(twin)
    paths = {"timm eager": ("fp32", lambda: twin(images)), "timm torch.compile": ("fp32", lambda: compiled(images))}
    if native_bf16(torch.device("cpu")):
        low, low_images = timm_twin(model).eval().to(torch.bfloat16), images.to(torch.bfloat16)
        paths["timm bf16 weights"] = ("bf16", lambda: low(low_images).float())
    return paths


def speed(name: str, repeats: int, batch: int = 16) -> str:
    torch.manual_seed(0)
    model = create_model(name).eval()
    torch.nn.init.normal_(model.head.weight, std=0.02)
    rng = np.random.default_rng(0)
    calibration = [rng.standard_normal((8, 3, *model.config.image_size)).astype(np.float32) for _ in range(2)]
    images = torch.from_numpy(rng.standard_normal((batch, 3, *model.config.image_size)).astype(np.float32))
    with tempfile.TemporaryDirectory() as folder:
        runners = {label: (network.precision, lambda n=network: n(images))
                   for label, network in deployed(exports(model, Path(folder), calibration)).items()}
        runners.update(timm_paths(model, images))
        with torch.no_grad():
            reference = model(images)
            agreement = {}
            for label, (_, run) in runners.items():  # warm-up (compilation), and how far each is from torch fp32
                run()
                logits = run()
                agreement[label] = (float((logits.float() - reference).abs().max()),
                                    int((logits.argmax(-1) == reference.argmax(-1)).sum()))
            seconds: dict[str, list[float]] = {label: [] for label in runners}
            load_before = os.getloadavg()[0]
            for repeat in range(repeats):
                for label, (_, run) in list(runners.items())[::1 if repeat % 2 == 0 else -1]:
                    start = time.perf_counter()
                    run()
                    seconds[label].append(time.perf_counter() - start)
    right = [label for label in runners if label.startswith("timm") and agreement[label][1] > batch // 2]
    timm_best = min(right, key=lambda label: statistics.median(seconds[label]))  # of the paths that compute right
    vitkit_best = min((label for label in runners if label.startswith("vitkit")),
                      key=lambda label: statistics.median(seconds[label]))
    lines = [f"{name}, batch {batch}, {torch.get_num_threads()} threads, median of {repeats} interleaved repeats, "
             f"load {load_before:.1f} -> {os.getloadavg()[0]:.1f}; logits scale {reference.abs().max():.3g}", "",
             f"| runtime | precision that ran | img/s (min-max) | vs timm's fastest ({timm_best}) | "
             f"max abs diff vs torch fp32 | top-1 as torch fp32 (of {batch}) |", "|---|---|---:|---:|---:|---:|"]
    for label, times in seconds.items():
        ratio = statistics.median(b / t for b, t in zip(seconds[timm_best], times))
        difference, same = agreement[label]
        lines.append(f"| {label} | {runners[label][0]} | {batch / statistics.median(times):.1f} "
                     f"({batch / max(times):.1f}-{batch / min(times):.1f}) | {ratio:.2f}x | {difference:.3g} | {same} |")
    best = statistics.median(b / t for b, t in zip(seconds[timm_best], seconds[vitkit_best]))
    lines += ["", f"Fastest vitkit runtime: {vitkit_best} ({runners[vitkit_best][0]}), {best:.2f}x timm's fastest "
                  f"path ({timm_best}, {runners[timm_best][0]})."]
    return "\n".join(lines)


def top1(run: Callable[[torch.Tensor], torch.Tensor], loader) -> tuple[float, int]:
    right = total = 0
    with torch.no_grad():
        for images, labels in loader:
            right += int((run(images).argmax(-1) == labels).sum())
            total += len(labels)
    return 100 * right / total, total


def accuracy(checkpoint: str, dataset: str, calibration_images: int = 256) -> str:
    model = load(checkpoint).eval()
    calibration = calibration_batches(model.config, dataset, calibration_images)
    test = evaluation_loader(load_dataset(dataset, "test"), checkpoint_transform(model.config), 64)
    with tempfile.TemporaryDirectory() as folder:
        runners = {"PyTorch fp32 (the checkpoint)": ("fp32", model)}
        runners.update({label: (network.precision, network)
                        for label, network in deployed(exports(model, Path(folder), calibration)).items()})
        found = {label: top1(network, test) for label, (_, network) in runners.items()}
    reference = found["PyTorch fp32 (the checkpoint)"][0]
    lines = [f"{checkpoint} on {dataset} (test split, {found[next(iter(found))][1]} images); int8 calibrated on "
             f"{calibration_images} train images", "", "| runtime | precision that ran | top-1 | vs fp32 |",
             "|---|---|---:|---:|"]
    lines += [f"| {label} | {runners[label][0]} | {value:.2f}% | {value - reference:+.2f} |"
              for label, (value, _) in found.items()]
    return "\n".join(lines)


def machine() -> str:
    flags = cpu_flags()
    shown = [flag for flag in FLAGS_SHOWN if flag in flags]
    cpu = cpu_model()
    import onnxruntime
    import openvino

    capped = f"; instruction sets capped: {', '.join(f'{k}={v}' for k, v in isa_caps().items())} (torch's kernels: " \
             f"{torch.backends.cpu.get_cpu_capability()})" if isa_caps() else ""
    return (f"{cpu}, {os.cpu_count()} cores visible, {torch.get_num_threads()} threads; CPU flags: {' '.join(shown)} "
            f"(native bf16: {native_bf16(torch.device('cpu'))}, int8 dot products: "
            f"{any(f in flags for f in INT8_DOT_FLAGS)}){capped}; torch {torch.__version__}, onnxruntime "
            f"{onnxruntime.__version__}, openvino {openvino.__version__.split('-')[0]}; "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["speed", "accuracy"])
    parser.add_argument("checkpoint", nargs="?", help="accuracy: a trained checkpoint")
    parser.add_argument("--dataset", default="digits", help="accuracy: the checkpoint's dataset")
    parser.add_argument("--model", default="ViT-S/16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the table, with the machine and command, to this file")
    args = parser.parse_args()
    if args.what == "accuracy" and not args.checkpoint:
        parser.error("accuracy needs a trained checkpoint")
    table = speed(args.model, args.repeats) if args.what == "speed" else accuracy(args.checkpoint, args.dataset)
    caps = "".join(f"{name}={value} " for name, value in isa_caps().items())
    text = (f"Machine: {machine()}\n\nCommand: `{caps}OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} "
            f"PYTHONPATH=src python benchmarks/bench_deploy.py {' '.join(sys.argv[1:])}`\n\n{table}\n")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
