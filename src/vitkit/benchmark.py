"""Throughput of one model in every runtime and precision the machine offers: what ``vitkit bench`` measures.

Rows: torch eager, ``torch.compile``, ONNX Runtime (fp32 and int8 weights), OpenVINO's CPU plugin and timm
holding the same weights, each in fp32 and, for torch, OpenVINO and timm, in the low precision the device runs
natively (bf16, or fp16 on GPUs without bf16); inference and, for the torch models, a training step (forward, backward,
AdamW). Beside images/s each row gives GFLOP/s (2 x multiply-adds, counted by torch; a training step
counts as 3 forward passes), the GEMM peak of its dtype measured on square matrices in the same run, the
fraction of that peak reached, and the peak GPU memory. Every candidate is timed once per repeat, in
turn (phase by phase, every other repeat backwards), so that load from other processes hits all alike; medians
are reported, and speed against timm's fp32 row of the same phase is the median of the per-repeat ratios:
against timm eager, or, for the compiled rows where timm's model was compiled too (runtime ``timm-compile``,
asked for by name), compiled against compiled. Families timm's plain ViT cannot hold (rotary embeddings, SwiGLU,
...) are compared with a timm model given as ``twin`` (e.g. the timm Eva a checkpoint was read from).
"""

from __future__ import annotations

import copy
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .checkpoints.timm_families import is_timm_family, write_timm_family
from .errors import CheckpointError
from .models.stats import forward_flops
from .models.vit import VisionTransformer
from .runtime import DTYPES, autocast, native_bf16, peak_memory_mib, precision_name, reset_peak_memory, timed
from .train.optim import step_kernel

RUNTIMES = ("eager", "compile", "onnxruntime", "openvino", "timm")
# Runtimes measured only when named (compiling timm's model too doubles the compile time of a run).
EXTRA_RUNTIMES = ("timm-compile",)
# The timm row each runtime's speed is measured against, where it ran (otherwise timm eager).
REFERENCE = {"compile": "timm-compile"}
PHASES = ("inference", "train_step")
# The columns of a row as `vitkit bench` and benchmarks/bench_model.py print it (Row.cells).
TABLE_HEADER = ("runtime", "precision", "phase", "images/s", "GFLOP/s", "peak GFLOP/s", "of peak", "peak MiB",
                "vs timm fp32")
TRAIN_STEP_PASSES = 3  # backward costs about twice the forward


@dataclass
class Row:
    runtime: str
    precision: str
    phase: str
    batch_size: int
    images_per_s: float
    gflops_per_s: float
    peak_gflops_per_s: float
    fraction_of_peak: float
    peak_memory_mib: float | None
    median_s: float
    speedup_vs_timm: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> list[str]:
        """The row as text under TABLE_HEADER: one formatting for the terminal table and the Markdown one."""
        return [self.runtime, self.precision, self.phase, f"{self.images_per_s:.1f}", f"{self.gflops_per_s:.1f}",
                f"{self.peak_gflops_per_s:.1f}", f"{100 * self.fraction_of_peak:.0f}%",
                "-" if self.peak_memory_mib is None else f"{self.peak_memory_mib:.0f}",
                "-" if self.speedup_vs_timm is None else f"{self.speedup_vs_timm:.2f}x"]


@dataclass
class Candidate:
    runtime: str
    precision: str
    phase: str
    step: Callable[[], None]
    peak_dtype: str  # whose GEMM peak the row is measured against


def low_precision(device: torch.device) -> torch.dtype | None:
    """The reduced precision ``device`` computes natively, if any."""
    if native_bf16(device):
        return torch.bfloat16
    return torch.float16 if device.type == "cuda" else None


def _torch_steps(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype,
                 wrap: Callable[[nn.Module], nn.Module]) -> dict[str, Callable[[], None]]:
    """Inference and a training step of ``model`` (wrapped, e.g. compiled); training runs on a copy, so
    that the model keeps the weights every runtime shares."""
    device = images.device
    evaluated = wrap(model.eval())

    @torch.no_grad()
    def inference() -> None:
        with autocast(device, dtype):
            evaluated(images)

    copied = copy.deepcopy(model).train()
    trained = wrap(copied)
    params = list(copied.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-5, **step_kernel(params))  # the kernel training uses

    def train_step() -> None:
        with autocast(device, dtype):
            loss = nn.functional.cross_entropy(trained(images).float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return {"inference": inference, "train_step": train_step}


def timm_twin(model: VisionTransformer) -> nn.Module:
    """timm's ``VisionTransformer`` holding ``model``'s weights (plain ViTs with timm's numerics), or for the
    rotary and RMSNorm families the ``Eva`` (or AIMv2) that vitkit's timm writer describes, built by timm from
    that hub directory; raises ValueError for a model timm cannot mirror."""
    import timm
    import timm.models.vision_transformer as timm_vit

    config = model.config
    if is_timm_family(config):
        with tempfile.TemporaryDirectory() as folder:
            try:
                write_timm_family(model, Path(folder) / "twin")
            except CheckpointError as error:
                raise ValueError(str(error)) from None
            twin = timm.create_model(f"local-dir:{Path(folder) / 'twin'}", pretrained=True)
        return twin.eval().to(next(model.parameters()).device)
    if config.backbone is not None or config.pos_embed != "learned" or config.gelu != "exact" or \
            config.representation_size:
        raise ValueError("timm's plain ViT mirrors learned 1-D position embeddings, exact GELU, no hybrid stem "
                         "and no pre-logits layer")
    twin = timm_vit.VisionTransformer(
        img_size=config.image_size, patch_size=config.patch_size, in_chans=config.in_chans,
        num_classes=config.num_classes, embed_dim=config.dim, depth=config.depth, num_heads=config.num_heads,
        mlp_ratio=config.mlp_dim / config.dim, class_token=config.class_token, fc_norm=config.fc_norm,
        global_pool="token" if config.pool == "token" else "avg", dynamic_img_size=False)
    state = {("pos_embed" if name == "pos_embed.weight" else name): t for name, t in model.state_dict().items()}
    try:
        twin.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"timm's layout differs: {str(error).splitlines()[0]}") from None
    return twin.to(next(model.parameters()).device)


def gemm_peak_step(dtype: str, device: torch.device, size: int) -> tuple[Callable[[], None], float]:
    """One ``size``-square matrix product in ``dtype`` (int8 products accumulate in int32) and its FLOPs."""
    if dtype == "int8":
        a = torch.randint(-128, 128, (size, size), dtype=torch.int8, device=device)
        return (lambda: torch._int_mm(a, a)), 2.0 * size ** 3
    a = torch.randn(size, size, device=device).to(DTYPES[dtype])
    return (lambda: torch.mm(a, a)), 2.0 * size ** 3


def candidates(model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor, runtimes: Sequence[str],
               precisions: Sequence[str] | None, workdir: Path, twin: nn.Module | None = None
               ) -> tuple[list[Candidate], dict[str, str]]:
    """What can run here, and why the rest cannot; ``twin`` is the timm model to compare with (by default
    ``timm_twin(model)``)."""
    device = images.device
    dtypes = [torch.float32] + [d for d in [low_precision(device)] if d is not None]
    found, skipped = [], {}

    def wanted(precision: str) -> bool:
        return precisions is None or precision in precisions

    def add(runtime: str, network: nn.Module, wrap: Callable[[nn.Module], nn.Module] = lambda module: module) -> None:
        for dtype in dtypes:
            name = precision_name(dtype)
            if wanted(name):
                for phase, step in _torch_steps(network, images, labels, dtype, wrap).items():
                    found.append(Candidate(runtime, name, phase, step, name))

    if "eager" in runtimes:
        add("eager", model)
    if "compile" in runtimes:
        add("compile", model, torch.compile)
    peers = [runtime for runtime in ("timm", "timm-compile") if runtime in runtimes]
    if peers:
        try:
            peer = twin if twin is not None else timm_twin(model)
        except (ImportError, ValueError) as error:
            skipped.update({runtime: str(error) for runtime in peers})
        else:
            if "timm" in peers:
                add("timm", peer)
            if "timm-compile" in peers:
                add("timm-compile", peer, torch.compile)
    traced = None  # the checked fp32 ONNX export, traced once: quantised for int8, converted for OpenVINO
    if "onnxruntime" in runtimes:
        try:
            from .checkpoints.onnx import OnnxModel, quantize_onnx, write_onnx

            traced = write_onnx(model, workdir / "fp32.onnx", None, device).path
            for precision in ("fp32", "int8"):
                if wanted(precision):
                    path = traced if precision == "fp32" else quantize_onnx(traced, workdir / "int8.onnx")
                    session = OnnxModel(path, device)  # its precision: what the graph's products take
                    found.append(Candidate("onnxruntime", session.precision, "inference", lambda s=session: s(images),
                                           precision))
        except ImportError as error:
            skipped["onnxruntime"] = str(error)
    if "openvino" in runtimes:
        if device.type != "cpu":
            skipped["openvino"] = f"vitkit runs OpenVINO on its CPU plugin, not on {device.type}"
        else:
            try:
                from .checkpoints.openvino import OpenVinoModel, write_openvino

                path = write_openvino(model, workdir / "model.xml", device, traced).path
                for dtype in dtypes:
                    name = precision_name(dtype)
                    if wanted(name):
                        network = OpenVinoModel(path, dtype)  # its precision: what the plugin runs
                        found.append(Candidate("openvino", network.precision, "inference", lambda n=network: n(images),
                                               name))
            except ImportError as error:
                skipped["openvino"] = str(error)
    return found, skipped


def bench(model: VisionTransformer, batch_size: int = 8, device: torch.device | str = "cpu",
          runtimes: Sequence[str] = RUNTIMES, precisions: Sequence[str] | None = None, repeats: int = 5,
          warmup: int = 2, peak_size: int = 2048, twin: nn.Module | None = None) -> tuple[list[Row], dict[str, str]]:
    """Time ``model`` in each runtime and precision available; returns the rows and the runtimes skipped
    (with the reason). ``twin``: the timm model holding ``model``'s weights, for families ``timm_twin`` cannot
    rebuild."""
    unknown = set(runtimes) - set(RUNTIMES + EXTRA_RUNTIMES)
    if unknown:
        raise ValueError(f"unknown runtimes {sorted(unknown)}; expected some of {RUNTIMES + EXTRA_RUNTIMES}")
    device = torch.device(device)
    model = model.to(device)
    config = model.config
    images = torch.randn(batch_size, config.in_chans, *config.image_size, device=device)
    labels = torch.randint(0, max(config.num_classes, 1), (batch_size,), device=device)
    flops = forward_flops(config) * batch_size
    with tempfile.TemporaryDirectory(prefix="vitkit-bench-") as workdir:
        found, skipped = candidates(model, images, labels, runtimes, precisions, Path(workdir),
                                    None if twin is None else twin.to(device))
        peaks = {dtype: gemm_peak_step(dtype, device, peak_size) for dtype in sorted({c.peak_dtype for c in found})}
        for candidate in found:  # compilation, allocator, caches
            for _ in range(warmup):
                candidate.step()
        seconds: dict[int, list[float]] = {index: [] for index in range(len(found))}
        memory: dict[int, float | None] = {}
        peak_seconds: dict[str, list[float]] = {dtype: [] for dtype in peaks}
        # One phase after the other, so that the rows compared run seconds apart, not a whole repeat; every other
        # repeat backwards, so that neither side of a comparison always runs first.
        order = sorted(range(len(found)), key=lambda index: PHASES.index(found[index].phase))
        for repeat in range(repeats):
            for dtype, (step, _) in peaks.items():
                peak_seconds[dtype].append(timed(step, device))
            for index in order if repeat % 2 == 0 else order[::-1]:
                candidate = found[index]
                reset_peak_memory(device)
                seconds[index].append(timed(candidate.step, device))
                memory[index] = peak_memory_mib(device)
    peak = {dtype: flop / statistics.median(peak_seconds[dtype]) / 1e9 for dtype, (_, flop) in peaks.items()}
    rows, measured = [], {c.runtime for c in found}
    for index, candidate in enumerate(found):
        median = statistics.median(seconds[index])
        work = flops * (TRAIN_STEP_PASSES if candidate.phase == "train_step" else 1) / 1e9
        against = REFERENCE.get(candidate.runtime) if REFERENCE.get(candidate.runtime) in measured else "timm"
        reference = next((i for i, c in enumerate(found) if (c.runtime, c.precision, c.phase) ==
                          (against, "fp32", candidate.phase)), None)
        speedup = None if reference is None else statistics.median(
            [theirs / ours for theirs, ours in zip(seconds[reference], seconds[index])])
        rows.append(Row(candidate.runtime, candidate.precision, candidate.phase, batch_size, batch_size / median,
                        work / median, peak[candidate.peak_dtype], work / median / peak[candidate.peak_dtype],
                        memory[index], median, speedup))
    return rows, skipped
