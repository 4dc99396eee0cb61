"""ONNX: one more format ``vitkit convert`` writes and ``vitkit eval`` / ``predict`` read, so it sits beside
the other formats. Every export is checked by ONNX Runtime before it replaces anything: a probe batch
of another size than the traced one (the batch axis is dynamic) must give PyTorch's logits.

The model's ``ViTConfig`` (class names and input normalisation included) travels in the file's metadata
(``vitkit.config``), with ``classes``, ``mean``, ``std`` and ``crop_pct`` also as plain entries for other
readers.
``quantize="int8"`` stores the weights of the dense layers in int8 (ONNX Runtime's dynamic quantisation:
activations are quantised on the fly, attention products stay in fp32).
"""

from __future__ import annotations

import io
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..atomic import move_into_place, staging_beside
from ..errors import CheckpointError
from ..models.config import ViTConfig
from ..models.vit import VisionTransformer

OPSET = 17
INPUT, OUTPUT = "images", "logits"
CONFIG_KEY = "vitkit.config"
TOLERANCE = 1e-4  # of the logits' scale: max |ONNX - PyTorch| / max(1, max |logit|)
QUANTIZATIONS = ("int8",)
PROTOBUF_LIMIT = 2**31  # bytes: an ONNX file is one protobuf message, and protobuf stops at 2 GiB
_TRACE_BATCH, _PROBE_BATCH = 2, 3


@dataclass
class OnnxExport:
    path: Path
    opset: int
    max_difference: float  # of the fp32 graph against PyTorch, on the probe batch
    quantized_difference: float | None = None  # of the int8 graph, for information
    quantized_agreement: float | None = None  # share of probe images whose top-1 class int8 keeps


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
    exporter does not write): x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape) axes."""
    from torch.onnx import symbolic_helper

    axes = list(range(-len(symbolic_helper._get_const(normalized_shape, "is", "normalized_shape")), 0))
    eps = g.op("CastLike", g.op("Constant", value_t=torch.tensor(symbolic_helper._get_const(eps, "f", "eps"))), x)
    mean_square = g.op("ReduceMean", g.op("Mul", x, x), axes_i=axes, keepdims_i=1)
    return g.op("Mul", g.op("Div", x, g.op("Sqrt", g.op("Add", mean_square, eps))), weight)


def trace(model: VisionTransformer, path: Path, device: torch.device, metadata: bool = True) -> None:
    """Export ``model`` to ``path``, written once: traced into memory, then saved with its metadata. The image size
    is fixed at the config's (only the batch axis is dynamic); rotary tables are computed in the graph for it."""
    onnx, _ = _require_runtime()
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm, OPSET)  # AIMv2's norms
    config = model.config
    example = torch.randn(_TRACE_BATCH, config.in_chans, *config.image_size, device=device)
    traced = io.BytesIO()
    with warnings.catch_warnings():  # the tracer's notes on shape checks that are constant for a fixed size
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), traced, dynamo=False, opset_version=OPSET, input_names=[INPUT],
                          output_names=[OUTPUT], dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}})
    graph = onnx.load_from_string(traced.getvalue())
    del traced  # the graph holds the weights now
    if metadata:
        for key, value in _metadata(config).items():
            graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def quantize_onnx(source: Path, target: Path) -> Path:
    """``source``'s weights as int8 (dynamic quantisation; the metadata travels), written to ``target``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process graphs: the traced graph is already shape-inferred
    try:
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    return target


def _logits(graph: Path, images: torch.Tensor, device: torch.device) -> np.ndarray:
    return session(graph, device).run([OUTPUT], {INPUT: images.cpu().numpy()})[0]


def probe_batch(config: ViTConfig) -> torch.Tensor:
    """The fixed random images an export is checked on (another batch size than the traced one)."""
    return torch.randn(_PROBE_BATCH, config.in_chans, *config.image_size, generator=torch.Generator().manual_seed(0))


def write_onnx(model: VisionTransformer, path: str | Path, quantize: str | None = None,
               device: torch.device | str = "cpu") -> OnnxExport:
    """Export ``model`` (traced on ``device``) to ``path``, check it with ONNX Runtime, then put it in place."""
    if quantize not in (None, *QUANTIZATIONS):
        raise CheckpointError(f"quantize={quantize!r}; expected one of {QUANTIZATIONS} or none")
    path, device = Path(path), torch.device(device)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if weight_bytes >= PROTOBUF_LIMIT:  # checked before any work: the exporter would fail late, with protobuf's words
        raise CheckpointError(f"{path}: the model's weights take {weight_bytes / 2**30:.2f} GiB, and an ONNX file "
                              f"holds at most 2 GiB (protobuf's limit); export a smaller variant to ONNX, or "
                              f"keep this one in the native format")
    model = model.to(device).eval()
    config = model.config
    probe = probe_batch(config)
    with torch.no_grad():
        reference = model(probe.to(device)).float().cpu().numpy()
    scale = max(1.0, float(np.abs(reference).max()))
    with staging_beside(path) as tmp:  # the export is built beside its target, then renamed
        exported = tmp / "fp32.onnx"
        trace(model, exported, device)
        difference = float(np.abs(_logits(exported, probe, device) - reference).max())
        if difference > TOLERANCE * scale:
            raise CheckpointError(f"{path}: ONNX Runtime's logits differ from PyTorch's by {difference:.3g} on a probe "
                                  f"batch of {_PROBE_BATCH} (allowed {TOLERANCE:g} x {scale:.3g}); nothing was written")
        report = OnnxExport(path, OPSET, difference)
        if quantize:
            quantized = tmp / "int8.onnx"
            quantize_onnx(exported, quantized)
            logits = _logits(quantized, probe, device)
            report.quantized_difference = float(np.abs(logits - reference).max())
            report.quantized_agreement = float((logits.argmax(-1) == reference.argmax(-1)).mean())
            exported = quantized
        move_into_place((exported, path))
    return report


class OnnxModel(nn.Module):
    """An exported model run by ONNX Runtime behind a module's face: ``model(images)`` gives logits and
    ``model.config`` the exported ``ViTConfig``, so evaluation and prediction take either."""

    def __init__(self, path: str | Path, device: torch.device | str = "cpu"):
        super().__init__()
        self.path, self.device = Path(path), torch.device(device)
        if not self.path.is_file():
            raise FileNotFoundError(f"no ONNX file at {self.path}")
        try:  # onnxruntime's own errors (InvalidProtobuf, ...) derive from Exception alone
            self.session = session(self.path, self.device)
        except Exception as error:
            raise CheckpointError(f"{self.path}: not a model ONNX Runtime can read ({error})") from error
        metadata = self.session.get_modelmeta().custom_metadata_map
        if CONFIG_KEY not in metadata:
            raise CheckpointError(f"{self.path}: no '{CONFIG_KEY}' in the ONNX metadata; only files written by "
                                  f"`vitkit convert --to onnx` carry the classes and normalisation vitkit needs")
        try:
            self.config = ViTConfig.from_json(metadata[CONFIG_KEY], str(self.path))
        except ValueError as error:  # not JSON, or not a valid config
            raise CheckpointError(f"{self.path}: bad '{CONFIG_KEY}' metadata ({error})") from error
        self._check_signature()

    def _check_signature(self) -> None:
        """The graph takes what ``forward`` feeds it and gives what its config promises: one input
        ``images`` (batch, C, H, W) and an output ``logits`` (batch, classes), as ``write_onnx`` makes them; a
        size the graph fixes must be the config's (a bare tower's feature width is not checked)."""
        config = self.config
        expected = {INPUT: ("(batch, C, H, W)", [None, config.in_chans, *config.image_size]),
                    OUTPUT: ("(batch, classes)", [None, config.num_classes or None])}
        for kind, found, name in (("input", self.session.get_inputs(), INPUT),
                                  ("output", self.session.get_outputs(), OUTPUT)):
            wanted, sizes = expected[name]
            node = next((node for node in found if node.name == name), None)
            if node is None or kind == "input" and len(found) != 1:
                raise CheckpointError(f"{self.path}: {kind}s {[node.name for node in found]}; expected "
                                      f"{'one ' if kind == 'input' else 'among them '}'{name}' of shape {wanted}")
            if len(node.shape) != len(sizes) or any(isinstance(size, int) and want is not None and size != want
                                                    for size, want in zip(node.shape, sizes)):
                raise CheckpointError(f"{self.path}: {kind} '{name}' of shape {node.shape}; expected {wanted} = "
                                      f"{['batch' if want is None else want for want in sizes]}, as the file's "
                                      f"'{CONFIG_KEY}' says")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.session.run([OUTPUT], {INPUT: images.detach().float().cpu().numpy()})[0]
        if logits.ndim != 2 or len(logits) != len(images) or self.config.num_classes not in (0, logits.shape[1]):
            expected = [len(images), self.config.num_classes or "features"]
            raise CheckpointError(f"{self.path}: gave logits of shape {list(logits.shape)} for {len(images)} images; "
                                  f"expected {expected}, as the file's '{CONFIG_KEY}' says")
        return torch.from_numpy(logits).to(images.device)
