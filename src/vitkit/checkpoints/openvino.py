"""OpenVINO IR: ``vitkit convert CKPT OUT.xml --to openvino`` writes ``OUT.xml`` (the graph) and ``OUT.bin``
(the weights), and ``vitkit eval`` / ``predict`` run ``.xml`` files on OpenVINO's CPU plugin; ``--quantize int8``
writes a static int8 IR (NNCF, calibrated). Which export runs fastest on which CPU, against timm, is measured in
``benchmarks/results/deploy_cpu.md``.

The graph comes from the ONNX trace and is checked once, by OpenVINO against PyTorch, after conversion. It is
saved for any batch and image size, and compiled at run time for the shape of the input it is given; the
``ViTConfig`` travels in the model's runtime info (``vitkit.config``), as in ONNX's metadata, beside the SHA-256
of the ``.bin`` (``vitkit.weights_sha256``), which the reader checks: the two files cannot be replaced in one
step, and a graph must never run another export's weights.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Sequence
from xml.etree import ElementTree
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..atomic import move_group_into_place, staging_beside, sweep
from ..errors import CheckpointError
from ..models.config import ViTConfig
from ..models.vit import VisionTransformer
from ..paths import regular_file
from ..runtime import precision_name
from .onnx import (CONFIG_KEY, INPUT, NAFLEX_INPUTS, ExportedModel, checked_difference, feeds, probe_logits,
                   quantized_agreement, trace)
from .quantize import check_quantize, openvino_precision, quantize_openvino

WEIGHTS_KEY = "vitkit.weights_sha256"  # runtime info: the digest of the .bin the graph was exported with
_DIGEST_PENDING = "pending-" + "0" * 56  # a digest's length, filled in once the weights are written
STATIC_SHAPES = 4  # input shapes an OpenVinoModel compiles for, one after another, before it compiles for any
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}  # the CPU plugin's INFERENCE_PRECISION_HINT


@dataclass
class OpenVinoExport:
    path: Path
    max_difference: float  # of OpenVINO fp32 against PyTorch, on the probe batch
    quantized_difference: float | None = None  # of the int8 graph (run with fp32 elsewhere), for information
    quantized_agreement: float | None = None  # share of probe images whose top-1 class int8 keeps


def _require_openvino():
    try:
        import openvino
    except ImportError as error:
        raise ImportError(f"OpenVINO export and inference need openvino: pip install 'vitkit[openvino]' "
                          f"({error})") from None
    return openvino


@functools.cache
def _core():
    """The process's one OpenVINO Core. Graphs compiled by several Cores and then released left the process to
    crash at its next fork where a Python SIGCHLD handler was set (as torch's DataLoader sets one)."""
    return _require_openvino().Core()


def _compiled(graph, precision: str):
    """``graph`` compiled for the CPU in ``precision``: asked for explicitly, as the plugin would otherwise
    compute in bf16 on CPUs that have it, whatever the model was exported in."""
    config = {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision], "INFERENCE_NUM_THREADS": torch.get_num_threads(),
              "PERFORMANCE_HINT": "LATENCY"}
    return _core().compile_model(graph, "CPU", config)


def write_openvino(model: VisionTransformer, path: str | Path, device: torch.device | str = "cpu",
                   traced: Path | None = None, naflex: bool = False, quantize: str | None = None,
                   calibration: Sequence[np.ndarray] | None = None) -> OpenVinoExport:
    """Export ``model`` to ``path`` (``.xml``, with its ``.bin`` beside it; with ``naflex`` taking NaFlex
    batches), checked by OpenVINO in fp32; ``traced`` is an ONNX export of this very model to convert instead of
    tracing again. ``quantize="int8"`` quantises the checked graph's matrix products statically on
    ``calibration`` (batches of preprocessed images; ``quantize.quantize_openvino``); the precision of the rest
    is told to the runtime at load (on a CPU with native bf16, OpenVINO's default is bf16).

    The two files are published as one unit (``atomic.move_group_into_place``): a kill before that leaves the
    previous pair, and one while they are moved in leaves the new graph waiting, moved in by the next export or
    read of ``path``. The graph also records the SHA-256 of its weights, so that a pair of two exports (copied by
    hand) is refused when read, never run."""
    openvino = _require_openvino()
    path = Path(path)
    if path.suffix != ".xml":
        raise CheckpointError(f"{path}: an OpenVINO model is written as NAME.xml (its weights go to NAME.bin)")
    check_quantize(quantize, calibration, model.config.in_chans, naflex, str(path), needs_calibration=True)
    model = model.to(device).eval()
    probes = probe_logits(model, naflex, device)
    with staging_beside(path) as tmp:  # the export is built beside its target, then renamed
        onnx_path, ir_path, bin_path = traced or tmp / "model.onnx", tmp / "model.xml", tmp / "model.bin"
        if traced is None:
            trace(model, onnx_path, device, metadata=False, naflex=naflex)  # checked once, below, as OpenVINO runs it
        graph = openvino.convert_model(onnx_path)
        if quantize:  # the fp32 graph checked first, then quantised
            fp32_difference = _checked(_compiled(graph, "fp32"), probes, path)
            graph = quantize_openvino(graph, calibration)
        graph.set_rt_info(model.config.to_json(), CONFIG_KEY)
        graph.set_rt_info(_DIGEST_PENDING, WEIGHTS_KEY)
        openvino.save_model(graph, ir_path, compress_to_fp16=False)
        del graph
        graph_text = ir_path.read_text(encoding="utf-8")
        if graph_text.count(_DIGEST_PENDING) != 1:
            raise CheckpointError(f"{path}: OpenVINO wrote the runtime info in a form vitkit does not know; "
                                  f"nothing was written")
        ir_path.write_text(graph_text.replace(_DIGEST_PENDING, weights_digest(bin_path)), encoding="utf-8")
        compiled = _compiled(_core().read_model(ir_path), "fp32")
        if quantize:
            report = OpenVinoExport(path, fp32_difference, *quantized_agreement(_runner(compiled), probes[0]))
        else:
            report = OpenVinoExport(path, _checked(compiled, probes, path))
        move_group_into_place((bin_path, path.with_suffix(".bin")), (ir_path, path))  # the weights, then their graph
    return report


def _runner(compiled):
    """A compiled model as a function of images or a NaFlex batch to logits."""
    names = input_names(compiled)
    return lambda inputs: compiled(feeds(inputs, names))[0]


def _checked(compiled, probes, path: Path) -> float:
    """The largest logit difference of a compiled fp32 graph from PyTorch's (``onnx.checked_difference``)."""
    return checked_difference(_runner(compiled), probes, path, "OpenVINO")


def input_names(graph) -> list[str]:
    """The exported names of a graph's inputs, compiled or not (OpenVINO may give a port more names than the one
    vitkit gave it)."""
    known = (INPUT, *NAFLEX_INPUTS)
    return [next((name for name in known if name in port.get_names()), port.get_any_name()) for port in graph.inputs]


def recorded_digest(graph: Path) -> str | None:
    """The weights digest an IR's top-level runtime info records (``vitkit.weights_sha256``), read from its XML."""
    try:
        entry = ElementTree.parse(graph).getroot().find(f"rt_info/{WEIGHTS_KEY}")
    except ElementTree.ParseError as error:
        raise CheckpointError(f"{graph}: not a model OpenVINO can read (XML: {error})") from None
    return None if entry is None else entry.get("value")


def weights_digest(path: Path) -> str:
    """The SHA-256 of an IR's weights file, read in chunks."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


class OpenVinoModel(ExportedModel):
    """An OpenVINO IR run on the CPU plugin in ``dtype`` (fp32, or bf16 where the CPU has it; see
    :class:`~vitkit.checkpoints.onnx.ExportedModel`)."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.path = Path(path)
        if self.path.parent.is_dir():  # an export of this pair cut short while moving it in: finished first
            sweep(self.path.parent, only=self.path.name)
        for needed in (self.path, self.path.with_suffix(".bin")):
            regular_file(needed)  # a FIFO would block OpenVINO's reader
        weights = self.path.with_suffix(".bin")
        recorded = recorded_digest(self.path)  # before OpenVINO reads the weights: another export's may not parse
        if recorded is not None and recorded != weights_digest(weights):
            raise CheckpointError(f"{self.path}: {weights} is not the weights file this graph was exported with "
                                  f"(its SHA-256 differs from the one the graph records: an export interrupted "
                                  f"between writing the two, or files of two exports); convert the model again")
        try:  # OpenVINO raises its own RuntimeError subclasses for unreadable graphs
            graph = _core().read_model(self.path)
        except RuntimeError as error:
            said = [line.strip() for line in str(error).splitlines() if line.strip()]  # its last line says why
            raise CheckpointError(f"{self.path}: not a model OpenVINO can read "
                                  f"({said[-1] if said else type(error).__name__})") from None
        if not graph.has_rt_info(CONFIG_KEY):
            raise CheckpointError(f"{self.path}: no '{CONFIG_KEY}' in the model's runtime info; only files written "
                                  f"by `vitkit convert --to openvino` carry the classes and normalisation vitkit needs")
        try:
            self.config = ViTConfig.from_json(graph.get_rt_info(CONFIG_KEY).astype(str), str(self.path))
        except ValueError as error:
            raise CheckpointError(f"{self.path}: bad '{CONFIG_KEY}' runtime info ({error})") from error
        self.inputs = input_names(graph)
        self._graph, self._hint = graph, precision_name(dtype)
        self._compiled, self._shapes, self._shapes_compiled = None, None, 0
        self._turn = threading.Lock()  # one compiled graph and its one infer request: callers on threads take turns

    @property
    def precision(self) -> str:
        """What the plugin runs the matrix products in (``quantize.openvino_precision``)."""
        with self._turn:
            if self._compiled is None:
                self._compile(None)
            return openvino_precision(self._compiled)

    def run(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """The logits of ``arrays`` from the graph compiled for their shapes: the CPU plugin runs a graph of fixed
        shapes faster (ViT-S/16, batch 16: 1.11x in bf16, 1.39x in int8; ``benchmarks/bench_openvino_shapes.py``).
        A new shape is compiled in place of the last (in under a second for a ViT-S); past ``STATIC_SHAPES`` shapes,
        the graph is compiled once for any shape. Calls from several threads take turns."""
        shapes = {name: array.shape for name, array in arrays.items()}
        with self._turn:
            fixed = self._shapes_compiled < STATIC_SHAPES
            if shapes != self._shapes and (fixed or self._shapes is not None):  # else compiled for any shape already
                self._compile(shapes if fixed else None)
            return self._compiled(arrays)[0]

    def _compile(self, shapes: dict[str, tuple[int, ...]] | None) -> None:
        """Compile the graph for ``shapes`` (None: for any) in place of the compilation held: one at a time, as
        each holds the weights again in the plugin's own layout."""
        self._compiled = None
        graph = self._graph
        if shapes is not None:
            graph = graph.clone()
            graph.reshape({name: list(shape) for name, shape in shapes.items()})
            self._shapes_compiled += 1
        self._compiled, self._shapes = _compiled(graph, self._hint), shapes
