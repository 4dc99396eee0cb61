"""Throughput of one model in every runtime and precision the machine offers: what ``vitkit bench`` measures.

Rows: torch eager, ``torch.compile``, ONNX Runtime (fp32 and int8 weights), OpenVINO's CPU plugin (its int8 row
static, calibrated on the timed images, where NNCF is installed) and timm holding the same weights, each in fp32
and, for torch, OpenVINO and timm, in the low precision the device runs natively (bf16, or fp16 on GPUs without
bf16); inference and, for the torch models, a training step (forward, backward, AdamW). Beside images/s (the
median, and the slowest and fastest repeat) each row gives GFLOP/s (2 x multiply-adds, counted by torch; a training
step counts as 3 forward passes), the hardware's peak in its precision
(``vitkit.peaks``: computed from the CPU's features and clock or a GPU's datasheet, or measured, and saying which),
the fraction of that peak reached (on a GPU, against the datasheet: the MFU), and the peak GPU memory. Every
candidate is timed once per repeat, in turn (phase by phase, every other repeat backwards), so that load from other
processes hits all alike; by default repeats stop once every row's spread is small (``repeats`` fixes the count).
Speed against timm's fp32 row of the same phase is the median of the per-repeat ratios:
against timm eager, or, for the compiled rows where timm's model was compiled too (runtime ``timm-compile``,
asked for by name), compiled against compiled. Families timm's plain ViT cannot hold (rotary embeddings, SwiGLU,
...) are compared with a timm model given as ``twin`` (e.g. the timm Eva a checkpoint was read from).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .atomic import atomic_file
from .checkpoints.adapters import merged
from .checkpoints.runnable import load_model, refuse_dense, source_config
from .checkpoints.gemma4 import is_gemma4
from .checkpoints.timm import write_timm
from .checkpoints.timm_families import is_timm_family
from .errors import CheckpointError
from .memory import Plan, check, estimate
from .models.config import pair
from .models.stats import forward_flops
from .models.vit import VisionTransformer
from .peaks import Peak, hardware_peak
from .runtime import autocast, native_bf16, peak_memory_mib, precision_name, reset_peak_memory, select_device, timed
from .train.optim import step_kernel

RUNTIMES = ("eager", "compile", "onnxruntime", "openvino", "timm")
# Runtimes measured only when named: torch.compile takes a minute or more per row on a CPU (timm's model twice that).
EXTRA_RUNTIMES = ("timm-compile",)
DEFAULT_RUNTIMES = ("eager", "onnxruntime", "openvino", "timm")
# The timm row each runtime's speed is measured against, where it ran (otherwise timm eager).
REFERENCE = {"compile": "timm-compile"}
PHASES = ("inference", "train_step")
# The columns of a row as `vitkit bench` and benchmarks/bench_model.py print it (Row.cells).
TABLE_HEADER = ("runtime", "precision", "phase", "images/s", "min-max", "GFLOP/s", "peak GFLOP/s", "of peak",
                "peak MiB", "vs timm fp32")
TRAIN_STEP_PASSES = 3  # backward costs about twice the forward
# Default repeats: at least MIN_REPEATS, then more until every row's (max - min) / median is at most SETTLED, up to
# MAX_REPEATS or until the repeats have taken REPEAT_BUDGET_S.
MIN_REPEATS, MAX_REPEATS, SETTLED, REPEAT_BUDGET_S = 3, 9, 0.10, 45.0


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
    slowest_images_per_s: float | None = None
    fastest_images_per_s: float | None = None
    peak_source: str = ""  # how the peak was got: "computed: ...", "measured: ...", "datasheet: ..."
    gemm_gflops_per_s: float | None = None  # what a matrix product of the row's precision reached in the same run
    repeats: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def cells(self) -> list[str]:
        """The row as text under TABLE_HEADER: one formatting for the terminal table and the Markdown one."""
        spread = "-" if self.slowest_images_per_s is None else \
            f"{self.slowest_images_per_s:.1f}-{self.fastest_images_per_s:.1f}"
        return [self.runtime, self.precision, self.phase, f"{self.images_per_s:.1f}", spread,
                f"{self.gflops_per_s:.1f}",
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
    """timm's ``VisionTransformer`` holding ``model``'s weights (plain ViTs with timm's numerics, registers and
    LayerScale included), or for the rotary and RMSNorm families the ``Eva`` (or AIMv2, Gemma 4's or Qwen3's
    encoder, C-RADIO's NaFlexViT) that vitkit's timm writer describes, built by timm from that hub directory;
    raises ValueError for a model timm cannot mirror."""
    import timm.models.vision_transformer as timm_vit

    config = model.config
    if config.prompt_tokens or config.adapter_dim:
        raise ValueError("timm's models hold no VPT prompts or AdaptFormer adapters")
    if is_timm_family(config) or is_gemma4(config) or config.merge_size or config.pos_interp_crop:
        return _written_twin(model)  # C-RADIO's cropped table: timm's naflexvit_*_radio
    if config.backbone is not None or config.pos_embed != "learned" or config.gelu != "exact" or \
            config.representation_size:
        raise ValueError("timm's plain ViT mirrors learned 1-D position embeddings, exact GELU, no hybrid stem "
                         "and no pre-logits layer")
    twin = timm_vit.VisionTransformer(
        img_size=config.image_size, patch_size=config.patch_size, in_chans=config.in_chans,
        num_classes=config.num_classes, embed_dim=config.dim, depth=config.depth, num_heads=config.num_heads,
        mlp_ratio=config.mlp_dim / config.dim, class_token=config.class_token, fc_norm=config.fc_norm,
        global_pool="token" if config.pool == "token" else "avg", dynamic_img_size=False,
        reg_tokens=config.reg_tokens, no_embed_class=config.no_embed_class, pre_norm=config.pre_norm,
        final_norm=config.final_norm, init_values=config.layer_scale, qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm)  # registers, LayerScale, no final norm: TIPSv2, C-RADIO, InternViT-300M
    state = {("pos_embed" if name == "pos_embed.weight" else name): t for name, t in model.state_dict().items()}
    try:
        twin.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"timm's layout differs: {str(error).splitlines()[0]}") from None
    return twin.to(next(model.parameters()).device)


def _written_twin(model: VisionTransformer) -> nn.Module:
    """The model timm builds from vitkit's timm export of ``model`` (its hub directory); ValueError where the
    writer refuses it."""
    import timm

    with tempfile.TemporaryDirectory() as folder:
        try:
            write_timm(model, Path(folder) / "twin")
        except CheckpointError as error:
            raise ValueError(str(error)) from None
        twin = timm.create_model(f"local-dir:{Path(folder) / 'twin'}", pretrained=True)
    return twin.eval().to(next(model.parameters()).device)


def peak_notes(rows: Sequence[Row]) -> list[str]:
    """One line per precision of the products (int8 for ``int8+fp32`` and ``int8+bf16``): its peak, how it was
    got, and the matrix product measured in the same run."""
    notes = {}
    for row in rows:
        products = row.precision.partition("+")[0]
        measured = "" if row.gemm_gflops_per_s is None else \
            f"; a matrix product reached {row.gemm_gflops_per_s:.1f} here"
        notes.setdefault(products, f"peak {products}: {row.peak_gflops_per_s:.1f} GFLOP/s, {row.peak_source}{measured}")
    return list(notes.values())


def settled(seconds: Sequence[Sequence[float]]) -> bool:
    """Whether every row's repeats lie within SETTLED of its median (max - min against the median)."""
    return all((max(times) - min(times)) <= SETTLED * statistics.median(times) for times in seconds)


def more_repeats(done: int, repeats: int | None, seconds: Sequence[Sequence[float]], spent: float) -> bool:
    """Whether to time another repeat: ``repeats`` when given, else the default rule (see MIN_REPEATS)."""
    if repeats is not None:
        return done < repeats
    if done < MIN_REPEATS:
        return True
    return done < MAX_REPEATS and spent < REPEAT_BUDGET_S and not settled(seconds)


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

                def add_openvino(path: Path, dtype: torch.dtype, name: str) -> None:
                    network = OpenVinoModel(path, dtype)  # its precision: what the plugin runs
                    found.append(Candidate("openvino", network.precision, "inference", lambda: network(images), name))

                path = write_openvino(model, workdir / "model.xml", device, traced).path
                for dtype in dtypes:
                    if wanted(precision_name(dtype)):
                        add_openvino(path, dtype, precision_name(dtype))
                if wanted("int8"):  # static int8, calibrated on the timed images: the scales do not change the speed
                    try:
                        path = write_openvino(model, workdir / "int8.xml", device, traced, quantize="int8",
                                              calibration=[images.cpu().numpy()]).path
                    except ImportError as error:  # NNCF, in the deploy extra
                        skipped["openvino int8"] = str(error)
                    else:
                        add_openvino(path, dtypes[-1], "int8")  # its other layers as the plugin runs them best
            except ImportError as error:
                skipped["openvino"] = str(error)
    return found, skipped


def bench(model: VisionTransformer, batch_size: int = 8, device: torch.device | str = "cpu",
          runtimes: Sequence[str] = DEFAULT_RUNTIMES, precisions: Sequence[str] | None = None,
          repeats: int | None = None, warmup: int = 2, peak_size: int | None = None,
          twin: nn.Module | None = None) -> tuple[list[Row], dict[str, str]]:
    """Time ``model`` in each runtime and precision available; returns the rows and the runtimes skipped
    (with the reason). ``repeats``: how many (default: until the spread is small, see MIN_REPEATS); ``peak_size``:
    the largest side of the matrix products that measure the peaks (default: 8192 on a GPU, 2048 elsewhere);
    ``twin``: the timm model holding ``model``'s weights, for families ``timm_twin`` cannot rebuild."""
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
        peak = {dtype: hardware_peak(dtype, device, peak_size) for dtype in sorted({c.peak_dtype for c in found})}
        for candidate in found:  # compilation, allocator, caches
            for _ in range(warmup):
                candidate.step()
        seconds: dict[int, list[float]] = {index: [] for index in range(len(found))}
        memory: dict[int, float | None] = {}
        # One phase after the other, so that the rows compared run seconds apart, not a whole repeat; every other
        # repeat backwards, so that neither side of a comparison always runs first.
        order = sorted(range(len(found)), key=lambda index: PHASES.index(found[index].phase))
        start, repeat = time.perf_counter(), 0
        while found and more_repeats(repeat, repeats, list(seconds.values()), time.perf_counter() - start):
            for index in order if repeat % 2 == 0 else order[::-1]:
                candidate = found[index]
                reset_peak_memory(device)
                seconds[index].append(timed(candidate.step, device))
                memory[index] = peak_memory_mib(device)
            repeat += 1
    return assemble(found, seconds, memory, peak, flops, batch_size), skipped


def assemble(found: Sequence[Candidate], seconds: dict[int, list[float]], memory: dict[int, float | None],
             peak: dict[str, Peak], flops: float, batch_size: int) -> list[Row]:
    """The rows from each candidate's timed repeats: medians, spreads, fractions of the peaks, speed against timm."""
    rows, measured = [], {c.runtime for c in found}
    for index, candidate in enumerate(found):
        median = statistics.median(seconds[index])
        work = flops * (TRAIN_STEP_PASSES if candidate.phase == "train_step" else 1) / 1e9
        against = REFERENCE.get(candidate.runtime) if REFERENCE.get(candidate.runtime) in measured else "timm"
        reference = next((i for i, c in enumerate(found) if (c.runtime, c.precision, c.phase) ==
                          (against, "fp32", candidate.phase)), None)
        speedup = None if reference is None else statistics.median(
            [theirs / ours for theirs, ours in zip(seconds[reference], seconds[index])])
        ceiling = peak[candidate.peak_dtype]
        rows.append(Row(candidate.runtime, candidate.precision, candidate.phase, batch_size, batch_size / median,
                        work / median, ceiling.gflops, work / median / ceiling.gflops,
                        memory[index], median, speedup, batch_size / max(seconds[index]),
                        batch_size / min(seconds[index]), ceiling.how, ceiling.measured_gflops, len(seconds[index])))
    return rows


BENCH_FILE = "bench.json"
# Runtimes that hold a copy of the weights of their own (the eager model and its training copy are counted apart;
# a compiled model shares the eager one's).
COPYING_RUNTIMES = ("onnxruntime", "openvino", "timm", "timm-compile")


@dataclass
class BenchRun:
    """The rows and skipped runtimes of ``bench_checkpoint`` with the setting they were measured in (threads and
    load average taken after the run), and the file they were written to."""

    source: str
    image_size: tuple[int, int]
    batch_size: int
    device: torch.device
    threads: int
    load: float
    repeats: int | None  # asked for; each row holds the repeats it ran
    rows: list[Row]
    skipped: dict[str, str]
    written: Path | None = None

    def record(self) -> dict:
        """The rows and their setting, as ``bench.json`` holds them."""
        return {"model": self.source, "image_size": list(self.image_size), "batch_size": self.batch_size,
                "device": str(self.device), "threads": self.threads, "load": self.load, "repeats": self.repeats,
                "rows": [row.to_dict() for row in self.rows], "skipped": self.skipped}


def bench_checkpoint(source: str, batch_size: int = 8, device: str | None = None,
                     runtimes: Sequence[str] = DEFAULT_RUNTIMES, precisions: Sequence[str] | None = None,
                     repeats: int | None = None, peak_size: int | None = None, image_size: tuple[int, int] | None = None,
                     overrides: dict | None = None, out: str | Path | None = None, *, adapter: str | None = None
                     ) -> BenchRun:
    """``bench`` of a checkpoint, or of a named variant (``ViT-S/16``, random weights), with ``overrides`` and the
    adapter folder ``adapter`` (its LoRA merged into the weights, as ``vitkit convert`` exports it), at
    ``image_size`` (default: the model's) on ``device`` (default: the best available), after refusing a run that
    cannot fit (``check_bench_size``); the rows and their setting are written to ``out/bench.json`` when ``out``
    is given."""
    chosen = select_device(device)
    overrides = {**(overrides or {}), **({"image_size": image_size} if image_size else {})}
    check_bench_size(source, overrides, batch_size, runtimes, chosen, adapter=adapter)
    model = merged(load_model(source, overrides, adapter=adapter))
    refuse_dense(model.config, source, "vitkit bench")
    rows, skipped = bench(model, batch_size, chosen, runtimes, precisions, repeats, peak_size=peak_size)
    result = BenchRun(source, tuple(model.config.image_size), batch_size, chosen, torch.get_num_threads(),
                      os.getloadavg()[0], repeats, rows, skipped)
    if out:
        result.written = Path(out) / BENCH_FILE
        with atomic_file(result.written) as handle:
            json.dump(result.record(), handle, indent=1)
    return result


def check_bench_size(source: str, overrides: dict, batch_size: int, runtimes: Sequence[str],
                     device: torch.device, *, adapter: str | None = None) -> None:
    """Refuse a benchmark that cannot fit before its model is built: the peak of a training step at the batch and
    size asked for (with ``adapter``'s prompts), with a copy of the weights per runtime compared, against what the
    machine has."""
    config = source_config(source, overrides, adapter=adapter)
    size = pair(overrides.get("image_size", config.image_size))  # a checkpoint's table is resized after loading
    copies = 2 + sum(runtime in COPYING_RUNTIMES for runtime in runtimes)

    def measure(plan: Plan):
        return estimate(config, plan.batch, plan.image_size, training=True, device=device.type,
                        weight_copies=copies)

    check(Plan(batch_size, size, stride=config.effective_patch_size), measure, "vitkit bench", device=device)
