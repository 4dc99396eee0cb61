"""ONNX export (``write_onnx``, checked by ONNX Runtime before it is published) and the runner of an exported
graph (``OnnxModel``, what ``vitkit eval`` / ``predict`` run): a format beside the others of ``checkpoints``.

The graph takes images of any batch, height and width (multiples of the patch): position tables are resampled and rotary tables computed in it for the input's grid. With ``naflex`` it takes a NaFlex
batch instead (``patches``, ``coords``, ``mask``, ``grids`` as :class:`~vitkit.models.naflex.PatchBatch` holds
them; any batch and number of patches). Every export is checked by ONNX Runtime before it replaces anything:
probe batches of other sizes than the traced one (another batch, and another image size or patch count) must
give PyTorch's logits.

The model's ``ViTConfig`` (class names and input normalisation included) travels in the file's metadata
(``vitkit.config``), with ``classes``, ``mean``, ``std`` and ``crop_pct`` also as plain entries for other
readers.
``quantize="int8"`` computes the dense layers in int8: with ``calibration`` images statically (QDQ, activation
scales calibrated ahead: ``quantize.quantize_onnx_static``), else dynamically (activations quantised on the fly);
the attention products stay in fp32 either way.
"""

from __future__ import annotations

import io
import json
import logging
import warnings
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..atomic import move_into_place, staging_beside
from ..errors import CheckpointError, InputError
from ..models.config import ViTConfig
from ..models.naflex import PatchBatch, naflex_batch, patch_batch
from ..models.vit import VisionTransformer
from ..paths import regular_file, resolved, within
from .quantize import check_quantize, onnx_precision, quantize_onnx_static

OPSET = 17
INPUT, OUTPUT = "images", "logits"
NAFLEX_INPUTS = ("patches", "coords", "mask", "grids")  # a PatchBatch's fields, in its order
CONFIG_KEY = "vitkit.config"
TOLERANCE = 1e-4  # of the logits' scale: max |ONNX - PyTorch| / max(1, max |logit|)
PROTOBUF_LIMIT = 2**31  # bytes: an ONNX file is one protobuf message, and protobuf stops at 2 GiB
_TRACE_BATCH, _PROBE_BATCH = 2, 3


@dataclass
class OnnxExport:
    path: Path
    opset: int
    max_difference: float  # of the fp32 graph against PyTorch, on the probe batch
    quantized_difference: float | None = None  # of the int8 graph, for information
    quantized_agreement: float | None = None  # share of probe images whose top-1 class int8 keeps
    precision: str = "fp32"  # what the written graph's matrix products take (quantize.onnx_precision)


def _require_runtime():
    try:
        import onnx
        import onnxruntime
    except ImportError as error:
        raise ImportError(f"ONNX export and inference need onnx and onnxruntime: pip install 'vitkit[export]' "
                          f"({error})") from None
    return onnx, onnxruntime


def session(path: str | Path, device: torch.device | None = None):
    """An ONNX Runtime session on ``device``'s execution provider (CUDA when asked and installed, else CPU)."""
    _, ort = _require_runtime()
    wanted = ["CUDAExecutionProvider"] if device is not None and device.type == "cuda" else []
    providers = [p for p in wanted if p in ort.get_available_providers()] + ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # as many threads as torch uses (OMP_NUM_THREADS)
    return ort.InferenceSession(str(path), options, providers=providers)


def _metadata(config: ViTConfig) -> dict[str, str]:
    mean, std = config.input_statistics
    classes = config.provenance.classes or [str(i) for i in range(config.num_classes)]
    return {CONFIG_KEY: config.to_json(), "classes": json.dumps(list(classes)), "mean": json.dumps(list(mean)),
            "std": json.dumps(list(std)), "crop_pct": json.dumps(config.provenance.crop_pct)}


def _rms_norm(g, x, normalized_shape, weight, eps):
    """aten::rms_norm as opset 17's ops (RMSNormalization is an op from opset 23, which torch's TorchScript
    exporter does not write): x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape) axes (no
    weight: Gemma 4's norm of the values)."""
    from torch.onnx import symbolic_helper

    axes = list(range(-len(symbolic_helper._get_const(normalized_shape, "is", "normalized_shape")), 0))
    eps = g.op("CastLike", g.op("Constant", value_t=torch.tensor(symbolic_helper._get_const(eps, "f", "eps"))), x)
    mean_square = g.op("ReduceMean", g.op("Mul", x, x), axes_i=axes, keepdims_i=1)
    normalised = g.op("Div", x, g.op("Sqrt", g.op("Add", mean_square, eps)))
    return normalised if symbolic_helper._is_none(weight) else g.op("Mul", normalised, weight)


class _NaFlexInputs(nn.Module):
    """``model`` on a NaFlex batch's four tensors, the inputs an exported NaFlex graph takes."""

    def __init__(self, model: VisionTransformer):
        super().__init__()
        self.model = model

    def forward(self, patches: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor, grids: torch.Tensor
                ) -> torch.Tensor:
        return self.model(PatchBatch(patches, coords, mask, grids))


def trace(model: VisionTransformer, path: Path, device: torch.device, metadata: bool = True,
          naflex: bool = False) -> None:
    """Export ``model`` to ``path``, written once: traced into memory, then saved with its metadata. The batch,
    height and width are dynamic (with ``naflex``: the batch and the number of patches)."""
    onnx, _ = _require_runtime()
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm, OPSET)  # AIMv2's norms
    example = probe_inputs(model.config, naflex, _TRACE_BATCH)[0]
    if naflex:
        module, names = _NaFlexInputs(model), list(NAFLEX_INPUTS)
        inputs = tuple(getattr(example.to(device), name) for name in NAFLEX_INPUTS)
        axes = {name: {0: "batch", 1: "patches"} for name in names[:3]} | {names[3]: {0: "batch"}}
    else:
        module, names, inputs = model, [INPUT], (example.to(device),)
        axes = {INPUT: {0: "batch", 2: "height", 3: "width"}}
    # a dense head's outputs are maps whose size follows the image's
    outputs = {0: "batch"} if model.config.dense_head == "none" else {0: "batch", 2: "rows", 3: "cols"}
    if model.config.pool in ("soft", "merge"):  # Gemma 4's soft tokens, Qwen's merger's: one per cell of the image
        outputs = {0: "batch", 1: "tokens"}
    traced = io.BytesIO()
    with warnings.catch_warnings():  # the tracer's notes on shape checks, which hold at every size the graph takes
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, traced, dynamo=False, opset_version=OPSET, input_names=names,
                          output_names=[OUTPUT], dynamic_axes=axes | {OUTPUT: outputs})
    graph = onnx.load_from_string(traced.getvalue())
    del traced  # the graph holds the weights now
    if metadata:
        for key, value in _metadata(model.config).items():
            graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def quantize_onnx(source: Path, target: Path) -> Path:
    """``source``'s weights as int8 (dynamic quantisation; the metadata travels), written to ``target``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process graphs: the traced graph is already shape-inferred
    try:
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, reduce_range=True)  # 7 bits: any x86 CPU
    finally:
        root.setLevel(level)
    return target


def feeds(inputs: torch.Tensor | PatchBatch, names: list[str]) -> dict[str, np.ndarray]:
    """The arrays of a graph's inputs ``names``, of images or a NaFlex batch (a graph whose result does not depend
    on an input, such as the grids under rotary tables of patch indices, has no such input)."""
    if isinstance(inputs, PatchBatch):
        arrays = {name: getattr(inputs, name).detach().cpu() for name in names}
        return {name: (array.float() if name == "patches" else array).numpy() for name, array in arrays.items()}
    return {INPUT: inputs.detach().float().cpu().numpy()}


def _runner(graph: Path, device: torch.device):
    """``graph`` loaded into one ONNX Runtime session, as a function of images or a NaFlex batch to logits."""
    run = session(graph, device)
    names = [i.name for i in run.get_inputs()]
    return lambda inputs: run.run([OUTPUT], feeds(inputs, names))[0]


def probe_inputs(config: ViTConfig, naflex: bool = False, batch: int = _PROBE_BATCH
                 ) -> list[torch.Tensor | PatchBatch]:
    """Fixed random inputs an export is traced on (the first) or checked on, ``batch`` images each: at the
    config's size and at a taller, wider one; or NaFlex batches of images of up to three aspect ratios at the
    config's number of patches and at a few more."""
    generator = torch.Generator().manual_seed(0)
    height, width = config.image_size
    if not naflex:
        cell = config.soft_pool if config.pool == "soft" else config.merge_size or 1  # soft tokens', merger's
        step = config.effective_patch_size * cell  # whole cells
        return [torch.randn(batch, config.in_chans, *size, generator=generator)
                for size in ((height, width), (height + step, width + 2 * step))]
    budget = config.grid_size[0] * config.grid_size[1]
    shapes = [(height, width), (height, 2 * width), (2 * height, width)][:batch]
    images = [torch.randn(config.in_chans, *shape, generator=generator) for shape in shapes]
    if config.pool == "soft":  # Gemma 4's soft tokens: images in whole pooling cells, padded in whole cells
        cell = config.soft_pool ** 2
        return [patch_batch(images, config.patch_size, patches) for patches in (2 * budget, 2 * budget + cell)]
    return [naflex_batch(images, config.patch_size, patches) for patches in (budget, budget + 5)]


def probe_logits(model: VisionTransformer, naflex: bool, device: torch.device
                 ) -> list[tuple[torch.Tensor | PatchBatch, np.ndarray]]:
    """The probe inputs an export is checked on, each with PyTorch's logits."""
    with torch.no_grad():
        return [(probe, model(probe.to(device)).float().cpu().numpy()) for probe in probe_inputs(model.config, naflex)]


def checked_difference(run, probes: list[tuple[torch.Tensor | PatchBatch, np.ndarray]], path: Path,
                       runtime: str, what: str = "logits") -> float:
    """The largest |difference| of ``run`` (inputs -> an array of ``what``: logits) from PyTorch's over the
    probes; one beyond the tolerance is refused, naming the probe."""
    largest = 0.0
    for inputs, reference in probes:
        difference = float(np.abs(run(inputs) - reference).max())
        scale = max(1.0, float(np.abs(reference).max()))
        if difference > TOLERANCE * scale:
            shape = tuple((inputs.patches if isinstance(inputs, PatchBatch) else inputs).shape)
            raise CheckpointError(f"{path}: {runtime}'s {what} differ from PyTorch's by {difference:.3g} on a probe "
                                  f"of shape {shape} (allowed {TOLERANCE:g} x {scale:.3g}); nothing was written")
        largest = max(largest, difference)
    return largest


def quantized_agreement(run, probe: tuple[torch.Tensor | PatchBatch, np.ndarray]) -> tuple[float, float]:
    """How far an int8 graph ``run`` (inputs -> logits) is from PyTorch's logits on one probe: the largest
    |difference| and the share of images whose top-1 class it keeps."""
    inputs, reference = probe
    logits = run(inputs)
    return float(np.abs(logits - reference).max()), float((logits.argmax(-1) == reference.argmax(-1)).mean())


def write_onnx(model: VisionTransformer, path: str | Path, quantize: str | None = None,
               device: torch.device | str = "cpu", naflex: bool = False,
               calibration: Sequence[np.ndarray] | None = None) -> OnnxExport:
    """Export ``model`` (traced on ``device``; with ``naflex`` taking NaFlex batches) to ``path``, check it with
    ONNX Runtime, then put it in place; ``quantize="int8"`` with ``calibration`` (batches of preprocessed
    images) writes static int8, without it dynamic int8."""
    path, device = Path(path), torch.device(device)
    check_quantize(quantize, calibration, model.config.in_chans, naflex, str(path))
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if weight_bytes >= PROTOBUF_LIMIT:  # checked before any work: the exporter would fail late, with protobuf's words
        raise CheckpointError(f"{path}: the model's weights take {weight_bytes / 2**30:.2f} GiB, and an ONNX file "
                              f"holds at most 2 GiB (protobuf's limit); export a smaller variant to ONNX, or "
                              f"keep this one in the native format")
    model = model.to(device).eval()
    probes = probe_logits(model, naflex, device)
    with staging_beside(path) as tmp:  # the export is built beside its target, then renamed
        exported = tmp / "fp32.onnx"
        trace(model, exported, device, naflex=naflex)
        report = OnnxExport(path, OPSET, checked_difference(_runner(exported, device), probes, path, "ONNX Runtime"))
        if quantize:
            quantized = tmp / "int8.onnx"
            if calibration is None:
                quantize_onnx(exported, quantized)
            else:
                quantize_onnx_static(exported, quantized, calibration, INPUT, tmp)
            report.quantized_difference, report.quantized_agreement = quantized_agreement(
                _runner(quantized, device), probes[0])
            exported = quantized
        report.precision = graph_precision(exported)
        move_into_place((exported, path))
    return report


def _refuse_outside_data(path: Path) -> None:
    """Refuse an ONNX file whose tensors name external-data files outside its folder (through ``..``, an absolute
    location or a link): ONNX Runtime would read them, and only its newer releases check."""
    onnx, _ = _require_runtime()
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    try:
        graph = onnx.load(str(path), load_external_data=False)
    except Exception:  # not ONNX at all: ONNX Runtime says what is wrong with it
        return
    folder = resolved(path.parent)
    for tensor in filter(uses_external_data, _get_all_tensors(graph)):
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        within(folder, location, CheckpointError, f"{path}: the external data of tensor {tensor.name!r}")


def graph_precision(path: Path) -> str:
    """What an ONNX file's matrix products compute in, read from its graph (``quantize.onnx_precision``)."""
    onnx, _ = _require_runtime()
    return onnx_precision(onnx.load(str(path), load_external_data=False))


class ExportedModel(nn.Module):
    """An exported graph behind a module's face: ``model(images)`` (or, for a graph exported with ``naflex``,
    ``model(patch_batch)``) gives logits and ``model.config`` the exported ``ViTConfig``, so evaluation and
    prediction take either. Subclasses set ``path``, ``config`` and ``inputs`` (the graph's input names) and run
    the graph on arrays."""

    path: Path
    inputs: list[str]
    precision: str  # what the graph's matrix products run in, as the graph or the runtime tells

    @property
    def naflex(self) -> bool:
        """Whether the graph takes NaFlex batches (exported with ``naflex``) rather than images."""
        return NAFLEX_INPUTS[0] in self.inputs

    def run(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def forward(self, inputs: torch.Tensor | PatchBatch) -> torch.Tensor:
        """Logits of (B, C, H, W) images, or of a NaFlex batch for a graph exported with ``naflex``."""
        if self.naflex != isinstance(inputs, PatchBatch):
            wanted = "NaFlex batches (eval/predict --max-patches N)" if self.naflex else "image tensors"
            raise InputError(f"{self.path} takes {wanted}; got {type(inputs).__name__}")
        logits = np.ascontiguousarray(self.run(feeds(inputs, self.inputs)))
        count, (_, sizes) = len(inputs), output_shape(self.config)
        if logits.ndim != len(sizes) or len(logits) != count or any(
                want is not None and size != want for size, want in zip(logits.shape[1:], sizes[1:])):
            shown = [count, *(want if want is not None else "any" for want in sizes[1:])]
            raise CheckpointError(f"{self.path}: gave logits of shape {list(logits.shape)} for {count} images; "
                                  f"expected {shown}, as the exported config says")
        return torch.from_numpy(logits).to(inputs.patches.device if self.naflex else inputs.device)


def output_shape(config: ViTConfig) -> tuple[str, list[int | None]]:
    """What an exported graph of ``config`` gives, in words and as sizes (None where any size goes): logits
    (batch, classes), features (batch, D) without a head, Gemma 4's soft tokens (batch, tokens, D), Qwen's merged
    tokens (batch, tokens, merge_dim), or a dense
    head's (batch, classes or 1, rows, cols)."""
    if config.dense_head != "none":
        return "(batch, classes or 1, rows, cols)", [None, 1 if config.dense_output == "depth" else config.num_classes,
                                                     None, None]
    if config.pool == "soft":
        return "(batch, soft tokens, D)", [None, None, config.dim]
    if config.pool == "merge":
        return "(batch, merged tokens, width)", [None, None, config.token_dim]
    return "(batch, classes)", [None, config.num_classes or None]


class OnnxModel(ExportedModel):
    """An exported model run by ONNX Runtime (see :class:`ExportedModel`)."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu"):
        super().__init__()
        self.path, self.device = Path(path), torch.device(device)
        regular_file(self.path)
        _refuse_outside_data(self.path)
        try:  # onnxruntime's own errors (InvalidProtobuf, ...) derive from Exception alone
            self.session = session(self.path, self.device)
        except Exception as error:
            raise CheckpointError(f"{self.path}: not a model ONNX Runtime can read ({error})") from error
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.precision = graph_precision(self.path)
        metadata = self.session.get_modelmeta().custom_metadata_map
        if CONFIG_KEY not in metadata:
            raise CheckpointError(f"{self.path}: no '{CONFIG_KEY}' in the ONNX metadata; only files written by "
                                  f"`vitkit convert --to onnx` carry the classes and normalisation vitkit needs")
        try:
            self.config = ViTConfig.from_json(metadata[CONFIG_KEY], str(self.path))
        except ValueError as error:  # not JSON, or not a valid config
            raise CheckpointError(f"{self.path}: bad '{CONFIG_KEY}' metadata ({error})") from error
        self._check_head_fits()
        self._check_signature()

    def _check_head_fits(self) -> None:
        """Refuse metadata that claims a head larger than the file could hold (at least a byte a weight, int8),
        before anything sized by the number of classes (class names, logits, a confusion matrix) is made."""
        config, size = self.config, self.path.stat().st_size
        weights = config.num_classes * (config.representation_size or config.dim)
        if weights > size:
            raise CheckpointError(f"{self.path}: '{CONFIG_KEY}' metadata says num_classes={config.num_classes}, a head "
                                  f"of {weights:,} weights, but the file holds {size:,} bytes")

    def _check_signature(self) -> None:
        """The graph takes what ``forward`` feeds it and gives what its config promises, as ``write_onnx`` makes
        them: one input ``images`` (batch, C, H, W), or a NaFlex batch's inputs with ``patches`` (batch, N, P*P*C),
        and an output ``logits`` (``output_shape``); a size the graph fixes must be the config's (a bare tower's
        feature width is not checked)."""
        config = self.config
        patch = config.patch_size ** 2 * config.in_chans
        expected = {INPUT: ("(batch, C, H, W)", [None, config.in_chans, *config.image_size]),
                    NAFLEX_INPUTS[0]: ("(batch, patches, P*P*C)", [None, None, patch]),
                    OUTPUT: output_shape(config)}
        first = NAFLEX_INPUTS[0] if self.naflex else INPUT
        allowed = set(NAFLEX_INPUTS) if self.naflex else {INPUT}
        for kind, found, name in (("input", self.session.get_inputs(), first),
                                  ("output", self.session.get_outputs(), OUTPUT)):
            wanted, sizes = expected[name]
            node = next((node for node in found if node.name == name), None)
            if node is None or kind == "input" and not {node.name for node in found} <= allowed:
                raise CheckpointError(f"{self.path}: {kind}s {[node.name for node in found]}; expected "
                                      f"{'among them ' if kind == 'output' else ''}'{name}' of shape {wanted}"
                                      f"{' and no other' if kind == 'input' and not self.naflex else ''}")
            if len(node.shape) != len(sizes) or any(isinstance(size, int) and want is not None and size != want
                                                    for size, want in zip(node.shape, sizes)):
                raise CheckpointError(f"{self.path}: {kind} '{name}' of shape {node.shape}; expected {wanted} = "
                                      f"{['batch' if want is None else want for want in sizes]}, as the file's "
                                      f"'{CONFIG_KEY}' says")

    def run(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run([OUTPUT], arrays)[0]
