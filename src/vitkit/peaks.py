"""The hardware's peak arithmetic rate in each precision, the ceiling `vitkit bench` measures every row against.

On a CPU the peak is computed from the processor's features and clock (operations a cycle a core times cores
times GHz) and measured with the fastest matrix-product kernel at hand; the larger is the peak, so that a
measurement that falls short (a slow kernel, a small matrix, a busy machine) never makes a ceiling a model runs
above. On a GPU the peak is the datasheet's dense figure for the device, with the product measured in the same run
beside it (an unknown GPU: the measured one). Every peak says how it was got.
"""

from __future__ import annotations

import os
import re
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .runtime import DTYPES, cpu_flags, timed

# Operations a cycle a core (a multiply-add counts 2), widest first: the first row whose flags the CPU has applies.
# A precision without a native kernel is computed in fp32 (bf16, fp16) or falls back to it, so fp32's rate bounds it.
CPU_RATES: dict[str, tuple[tuple[tuple[str, ...], str, int], ...]] = {
    "fp32": ((("avx512f",), "AVX-512 FMA fp32", 64), (("avx2", "fma"), "AVX2 FMA fp32", 32),
             (("avx",), "AVX fp32", 16), ((), "SSE fp32", 8)),
    "bf16": ((("amx_bf16",), "AMX-BF16", 1024), (("avx512_bf16",), "AVX-512 BF16", 128)),
    "fp16": ((("amx_fp16",), "AMX-FP16", 1024), (("avx512_fp16",), "AVX-512 FP16", 128)),
    "int8": ((("amx_int8",), "AMX-INT8", 2048), (("avx512_vnni",), "AVX-512 VNNI", 256),
             (("avx_vnni",), "AVX-VNNI", 128), (("avx512bw",), "AVX-512 u8s8 vpmaddubsw", 128),
             (("avx2",), "AVX2 u8s8 vpmaddubsw", 64)),
}

# Dense (no sparsity) datasheet TFLOP/s of GPUs by a part of the name torch.cuda.get_device_name gives, the more
# specific names first; fp32 is the plain (non tensor-core) rate, which torch's fp32 matrix products use by default.
GPU_DATASHEET: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2, "int8": 1513.0}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0, "int8": 1670.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0, "int8": 1979.0}),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0, "int8": 1979.0}),
    ("GH200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0, "int8": 1979.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5, "int8": 624.0}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6, "int8": 733.0}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3, "int8": 242.0}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2, "int8": 140.0}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2, "int8": 250.0}),
    ("RTX 4090", {"bf16": 165.0, "fp16": 165.0, "fp32": 82.6, "int8": 661.0}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("T4", {"fp16": 65.0, "fp32": 8.1, "int8": 130.0}),
)

# A measured product is sized to take about this long, so that a slow kernel (int8 emulated on an old CPU) costs
# a second, not minutes.
GEMM_SECONDS = 0.3
GEMM_PROBE = 256  # the side of the first, sizing product
GEMM_TRIES = 3  # the fastest of these counts: a peak is what the hardware reaches, not what a busy moment leaves


@dataclass(frozen=True)
class Peak:
    """A precision's ceiling in GFLOP/s (int8: GOP/s), how it was got, and the rate a matrix product reached in
    this run (the same figure where the peak is the measured one)."""

    gflops: float
    how: str
    measured_gflops: float


def cpu_clock_ghz(max_freq: Path = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"),
                  cpuinfo: Path = Path("/proc/cpuinfo")) -> float | None:
    """The CPU's highest clock in GHz: cpufreq's cpuinfo_max_freq (kHz), else the larger of /proc/cpuinfo's "cpu
    MHz" and the "@ x.xxGHz" of its model name; None where neither can be read."""
    try:
        return int(max_freq.read_text().split()[0]) / 1e6
    except (OSError, ValueError, IndexError):
        pass
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    found = [float(mhz) / 1e3 for mhz in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)[:1]]
    found += [float(ghz) for ghz in re.findall(r"^model name\s*:.*@\s*([\d.]+)\s*GHz", text, re.M)[:1]]
    return max(found, default=None)


def cpu_cores() -> int:
    """The cores a benchmark computes on: torch's intra-op threads, at most the CPUs this process may use."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(torch.get_num_threads(), usable))


def computed_cpu_peak(precision: str, flags: frozenset[str], cores: int, ghz: float) -> tuple[float, str]:
    """GFLOP/s of ``precision`` from the CPU's ``flags``, ``cores`` and clock, and the arithmetic as text
    ("AMX-BF16 1024 FLOP/cycle x 2 cores x 3.00 GHz"); a precision without a native kernel gets fp32's."""
    for needs, name, per_cycle in CPU_RATES.get(precision, ()) + CPU_RATES["fp32"]:
        if all(flag in flags for flag in needs):
            unit = "OP" if precision == "int8" and "fp32" not in name else "FLOP"
            return per_cycle * cores * ghz, f"{name} {per_cycle} {unit}/cycle x {cores} cores x {ghz:.2f} GHz"
    raise AssertionError("the SSE row needs no flag")


def gpu_datasheet(name: str, precision: str) -> float | None:
    """The dense datasheet TFLOP/s of the GPU called ``name`` in ``precision``; None for a GPU not in the table."""
    for part, figures in GPU_DATASHEET:
        if part in name:
            return figures.get(precision)
    return None


def _torch_gemm(precision: str, device: torch.device, size: int) -> Callable[[], object]:
    """One ``size``-square product through torch (int8: ``torch._int_mm``, accumulating in int32)."""
    if precision == "int8":
        a = torch.randint(-128, 128, (size, size), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, a)
    a = torch.randn(size, size, device=device).to(DTYPES[precision])
    return lambda: torch.mm(a, a)


def _onnxruntime_int8_gemm(size: int) -> Callable[[], object]:
    """One ``size``-square u8 x s8 product as ONNX Runtime's MatMulInteger with constant weights, the kernel of
    its quantised models (AMX, VNNI or u8s8 AVX2 as the CPU has)."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.integers(-128, 128, (size, size), dtype=np.int8), "w")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, [size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [size, size])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = cpu_cores()
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = rng.integers(0, 256, (size, size), dtype=np.uint8)
    return lambda: session.run(None, {"x": x})


def gemm_kernels(precision: str, device: torch.device) -> dict[str, Callable[[int], Callable[[], object]]]:
    """The matrix-product kernels at hand for ``precision`` on ``device``, by the name a peak states."""
    library = "cuBLAS" if device.type == "cuda" else "oneDNN/MKL"
    found = {f"torch.mm ({library})" if precision != "int8" else "torch._int_mm":
             lambda size: _torch_gemm(precision, device, size)}
    if precision == "int8" and device.type == "cpu" and all(importlib.util.find_spec(name) for name in
                                                            ("onnx", "onnxruntime")):
        found["ONNX Runtime MatMulInteger"] = _onnxruntime_int8_gemm
    return found


def _rate(build: Callable[[int], Callable[[], object]], device: torch.device, size: int) -> tuple[float, int]:
    """GFLOP/s of the fastest of a few products at most ``size`` square, sized on a CPU from a small probe product
    to take about GEMM_SECONDS each (a GPU takes ``size`` itself: its probe times the launch); and the side used."""
    first = min(GEMM_PROBE, size)
    probe = build(first)
    probe()  # first call: kernel selection, packing
    rate = 2.0 * first ** 3 / max(min(timed(probe, device) for _ in range(2)), 1e-9)
    sized = max(first, min(size, int((rate * GEMM_SECONDS / 2.0) ** (1 / 3)) // 64 * 64))
    side = size if device.type == "cuda" else sized
    step = probe if side == first else build(side)
    step()
    best = min(timed(step, device) for _ in range(GEMM_TRIES))
    return 2.0 * side ** 3 / best / 1e9, side


def measured_peak(precision: str, device: torch.device, size: int) -> tuple[float, str]:
    """The fastest rate a matrix product of ``precision`` reaches here, among the kernels at hand, and which (NaN
    where none ran)."""
    results = []
    for name, build in gemm_kernels(precision, device).items():
        try:
            gflops, side = _rate(build, device, size)
        except (RuntimeError, NotImplementedError):  # a kernel this build or device lacks
            continue
        results.append((gflops, f"{name} {side}^3"))
    return max(results, default=(float("nan"), "no kernel ran"))


def hardware_peak(precision: str, device: torch.device, size: int | None = None) -> Peak:
    """The peak of ``precision`` on ``device`` (see the module doc), measured with products of at most ``size``
    (default: 8192 on a GPU, 2048 elsewhere)."""
    size = size or (8192 if device.type == "cuda" else 2048)
    measured, kernel = measured_peak(precision, device, size)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        sheet = gpu_datasheet(name, precision)
        if sheet is None:
            return Peak(measured, f"measured: {kernel} ({name} is not in the datasheet table)", measured)
        return Peak(sheet * 1e3, f"datasheet: {name} {precision} dense {sheet:g} TFLOP/s", measured)
    ghz = cpu_clock_ghz()
    if device.type != "cpu" or ghz is None:
        return Peak(measured, f"measured: {kernel}", measured)
    computed, arithmetic = computed_cpu_peak(precision, cpu_flags(), cpu_cores(), ghz)
    if not computed < measured:  # a NaN measurement too
        return Peak(computed, f"computed: {arithmetic}", measured)
    return Peak(measured, f"measured: {kernel}", measured)
