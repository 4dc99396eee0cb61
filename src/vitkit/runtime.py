"""Where a model runs and in which precision: one place decides, for the command line, training and
benchmarks alike.

``auto`` precision means bf16 only where the hardware computes in it natively: a CUDA GPU with bf16
support, or a CPU with AVX512-BF16 or AMX (told by torch's CPU capability and the CPU flags). On other
CPUs bf16 is emulated and several times slower than fp32, so ``auto`` stays in fp32 there.
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

import torch

from .errors import ConfigError, DeviceError

PRECISIONS = ("fp32", "bf16", "fp16", "auto")
TRAINING_PRECISIONS = ("fp32", "bf16", "auto")  # fp16 is left out: without loss scaling its gradients underflow
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def best_device() -> torch.device:
    """The fastest device present: a CUDA GPU, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("mps") if mps_available() else torch.device("cpu")


def select_device(name: str | None = None) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N``, ``mps``, or None for the best available; a device this machine lacks
    is a ``DeviceError`` saying what it has."""
    if not name:
        return best_device()
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"unknown device {name!r}; expected cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DeviceError(f"--device {name}: no CUDA GPU is available on this machine (torch {torch.__version__}"
                              f"{', built without CUDA' if torch.version.cuda is None else ''}); use --device cpu")
        if device.index is not None and device.index >= count:
            raise DeviceError(f"--device {name}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    elif device.type == "mps" and not mps_available():
        raise DeviceError(f"--device {name}: Apple's MPS backend is not available on this machine; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"unsupported device {name!r}; expected cpu, cuda, cuda:N or mps")
    return device


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo (empty where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 at full speed rather than emulating it."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        kernels = torch.backends.cpu.get_cpu_capability()  # torch's kernels need AVX512 (or AMX) to use the flags
        return kernels.startswith(("AVX512", "AMX")) and any(flag in cpu_flags() for flag in NATIVE_BF16_CPU_FLAGS)
    return False


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """The compute dtype ``precision`` stands for on ``device``."""
    if precision not in PRECISIONS:
        raise DeviceError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    return DTYPES[precision]


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The compute dtype of training in ``precision`` on ``device`` (one of ``TRAINING_PRECISIONS``; a recipe
    checks its field against the same list)."""
    if precision not in TRAINING_PRECISIONS:
        raise ConfigError(f"precision={precision!r} for training; expected one of {', '.join(TRAINING_PRECISIONS)}")
    return resolve_precision(precision, device)


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision for the block when ``dtype`` is not fp32: matrix products in ``dtype``, reductions in fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def precision_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timer reads the time of the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device) -> float | None:
    """Peak memory allocated since the last reset, on a GPU; None on the CPU, where torch does not track it."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def timed(function, device: torch.device) -> float:
    """Seconds one call of ``function`` takes on ``device``, its queued work included."""
    synchronize(device)
    start = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - start
