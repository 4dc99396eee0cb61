"""OpenVINO IR: ``vitkit convert CKPT OUT.xml --to openvino`` writes ``OUT.xml`` (the graph) and ``OUT.bin``
(the weights), and ``vitkit eval`` / ``predict`` run ``.xml`` files on OpenVINO's CPU plugin. On a CPU with
native bf16 it ran ViT-S/16 in bf16 1.25x faster than ONNX Runtime's int8 and 1.7x faster than torch's bf16,
and 1.1x ONNX Runtime in fp32 (``benchmarks/results/deploy_int8_openvino.md``).

The graph comes from the ONNX export (checked against PyTorch there), and is checked again after
conversion; the ``ViTConfig`` travels in the model's runtime info (``vitkit.config``), as in ONNX's metadata.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..atomic import atomic_file
from ..errors import CheckpointError
from ..models.config import ViTConfig
from ..models.vit import VisionTransformer
from ..runtime import precision_name
from .onnx import CONFIG_KEY, TOLERANCE, probe_batch, write_onnx

PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}  # the CPU plugin's INFERENCE_PRECISION_HINT


@dataclass
class OpenVinoExport:
    path: Path
    max_difference: float  # of OpenVINO fp32 against PyTorch, on the probe batch


def _require_openvino():
    try:
        import openvino
    except ImportError as error:
        raise ImportError(f"OpenVINO export and inference need openvino: pip install 'vitkit[openvino]' "
                          f"({error})") from None
    return openvino


def _compiled(openvino, graph, precision: str):
    """``graph`` compiled for the CPU in ``precision``: asked for explicitly, as the plugin would otherwise
    compute in bf16 on CPUs that have it, whatever the model was exported in."""
    config = {"INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision], "INFERENCE_NUM_THREADS": torch.get_num_threads(),
              "PERFORMANCE_HINT": "LATENCY"}
    return openvino.Core().compile_model(graph, "CPU", config)


def write_openvino(model: VisionTransformer, path: str | Path, device: torch.device | str = "cpu") -> OpenVinoExport:
    """Export ``model`` to ``path`` (``.xml``, with its ``.bin`` beside it), checked by OpenVINO in fp32."""
    openvino = _require_openvino()
    path = Path(path)
    if path.suffix != ".xml":
        raise CheckpointError(f"{path}: an OpenVINO model is written as NAME.xml (its weights go to NAME.bin)")
    model = model.to(device).eval()
    probe = probe_batch(model.config)
    with torch.no_grad():
        reference = model(probe.to(device)).float().cpu().numpy()
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent if path.parent.exists() else None) as tmp:
        onnx_path, ir_path = Path(tmp) / "model.onnx", Path(tmp) / "model.xml"
        write_onnx(model, onnx_path, device=device)
        graph = openvino.convert_model(onnx_path)
        graph.set_rt_info(model.config.to_json(), CONFIG_KEY)
        openvino.save_model(graph, ir_path, compress_to_fp16=False)
        logits = _compiled(openvino, openvino.Core().read_model(ir_path), "fp32")(probe.numpy())[0]
        difference = float(np.abs(logits - reference).max())
        scale = max(1.0, float(np.abs(reference).max()))
        if difference > TOLERANCE * scale:
            raise CheckpointError(f"{path}: OpenVINO's logits differ from PyTorch's by {difference:.3g} on a probe "
                                  f"batch (allowed {TOLERANCE:g} x {scale:.3g}); nothing was written")
        for source, target in ((ir_path.with_suffix(".bin"), path.with_suffix(".bin")), (ir_path, path)):
            with atomic_file(target, "wb") as handle:  # the weights first, then the graph that reads them
                handle.write(source.read_bytes())
    return OpenVinoExport(path, difference)


class OpenVinoModel(nn.Module):
    """An OpenVINO IR run on the CPU plugin behind a module's face, in ``dtype`` (fp32, or bf16 where the
    CPU has it): ``model(images)`` gives logits and ``model.config`` the exported ``ViTConfig``."""

    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32):
        super().__init__()
        openvino = _require_openvino()
        self.path = Path(path)
        for needed in (self.path, self.path.with_suffix(".bin")):
            if not needed.is_file():
                raise FileNotFoundError(f"no OpenVINO {needed.suffix[1:]} file at {needed}")
        try:  # OpenVINO raises its own RuntimeError subclasses for unreadable graphs
            graph = openvino.Core().read_model(self.path)
        except RuntimeError as error:
            said = [line.strip() for line in str(error).splitlines() if line.strip()]  # its last line says why
            raise CheckpointError(f"{self.path}: not a model OpenVINO can read "
                                  f"({said[-1] if said else type(error).__name__})") from None
        if not graph.has_rt_info(CONFIG_KEY):
            raise CheckpointError(f"{self.path}: no '{CONFIG_KEY}' in the model's runtime info; only files written "
                                  f"by `vitkit convert --to openvino` carry the classes and normalisation vitkit needs")
        try:
            self.config = ViTConfig.from_json(graph.get_rt_info(CONFIG_KEY).astype(str))
        except ValueError as error:
            raise CheckpointError(f"{self.path}: bad '{CONFIG_KEY}' runtime info ({error})") from error
        self.compiled = _compiled(openvino, graph, precision_name(dtype))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.compiled(images.detach().float().cpu().numpy())[0]
        return torch.from_numpy(np.ascontiguousarray(logits)).to(images.device)
