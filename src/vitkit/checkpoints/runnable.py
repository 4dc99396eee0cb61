"""A checkpoint made ready to run: its config read before any model is built (for the memory checks), the model
put on a device with the precision it computes in, an exported ONNX or OpenVINO graph run by its runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..models import VisionTransformer, create_model, model_config
from ..models.config import ViTConfig
from ..runtime import resolve_precision, select_device
from .hub import is_remote
from .inference import kept_overrides
from .loading import load, read_config
from .onnx import ExportedModel, OnnxModel
from .openvino import OpenVinoModel

# The exported graphs a runtime runs, by extension, as the messages name them.
EXPORTED = {".onnx": "an ONNX", ".xml": "an OpenVINO"}


def is_checkpoint(source: str) -> bool:
    """Whether ``source`` names a checkpoint (a path that exists, or a remote name) rather than a named variant."""
    return Path(source).exists() or is_remote(source)


def source_config(source: str, overrides: dict[str, Any]) -> ViTConfig:
    """The config of the model a checkpoint (or a variant's name) describes with ``overrides``, before any
    weights are put into a model: what a size check needs to know (a vitkit directory's weights are not read)."""
    if not is_checkpoint(source):
        return model_config(source, **overrides)
    return read_config(source, overrides).replace(**kept_overrides(overrides))


def load_model(source: str, overrides: dict[str, Any] | None = None) -> VisionTransformer:
    """The model of a checkpoint, or of a named variant (``ViT-S/16``) with random weights, with ``overrides``."""
    overrides = overrides or {}
    return load(source, **overrides) if is_checkpoint(source) else create_model(source, **overrides)


def load_on_device(checkpoint: str, overrides: dict[str, Any] | None = None, device: str | torch.device | None = None,
                   precision: str = "fp32") -> tuple[VisionTransformer, torch.device, torch.dtype]:
    """The model of ``checkpoint`` (with ``overrides``) on ``device`` (default: the best available), with the
    device and the dtype ``precision`` computes in there (``auto``: bf16 where the hardware runs it natively)."""
    chosen = select_device(device)
    return load(checkpoint, **(overrides or {})).to(chosen), chosen, resolve_precision(precision, chosen)


def load_inference(checkpoint: str, overrides: dict[str, Any] | None = None, device: str | None = None,
                   precision: str = "fp32") -> tuple[VisionTransformer | ExportedModel, torch.device, torch.dtype]:
    """The model ``eval``/``predict`` run: a checkpoint on ``device`` in ``precision`` (``load_on_device``), an
    ``.onnx`` file run by ONNX Runtime as it was exported, or an OpenVINO ``.xml`` on the CPU in ``precision``;
    with its device and compute dtype (the runtimes compute in their own precision: fp32 as far as autocast
    goes)."""
    chosen, suffix = select_device(device), Path(checkpoint).suffix
    if suffix in EXPORTED and overrides:
        raise ConfigError(f"--set {', '.join(overrides)}: {EXPORTED[suffix]} model runs as it was exported")
    if suffix == ".onnx":
        if precision not in ("fp32", "auto"):
            raise ConfigError(f"--precision {precision}: an ONNX model runs in the precision it was exported in")
        return OnnxModel(checkpoint, chosen), torch.device("cpu"), torch.float32
    if suffix == ".xml":
        if precision == "fp16":
            raise ConfigError("--precision fp16: an OpenVINO model runs in fp32, bf16 or auto (bf16 where native)")
        dtype = resolve_precision(precision, torch.device("cpu"))
        return OpenVinoModel(checkpoint, dtype), torch.device("cpu"), torch.float32
    return load_on_device(checkpoint, overrides, chosen, precision)


def check_graph_inputs(model: object, checkpoint: str, max_patches: int | None) -> None:
    """An exported graph takes image tensors or NaFlex batches, as it was exported; a PyTorch model takes both."""
    if isinstance(model, VisionTransformer) or bool(max_patches) == model.naflex:
        return
    if max_patches:
        raise ConfigError(f"--max-patches: {checkpoint} was exported for image tensors; export it again with "
                          f"`vitkit convert ... --naflex`, or use the PyTorch checkpoint")
    raise ConfigError(f"{checkpoint} was exported for NaFlex batches; pass --max-patches N (N patches an image)")
