"""A checkpoint made ready to run: its config read before any model is built (for the memory checks), the model
put on a device with the precision it computes in, an exported ONNX or OpenVINO graph run by its runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, ConfigError
from ..models import VisionTransformer, create_model, model_config
from ..models.config import ViTConfig
from ..runtime import resolve_precision, select_device
from .adapters import WEIGHTS_FILE, load_adapter, read_adapter
from .hub import is_remote
from .loading import load, overridden, read_config
from .onnx import ExportedModel, OnnxModel
from .openvino import OpenVinoModel

# The exported graphs a runtime runs, by extension, as the messages name them.
EXPORTED = {".onnx": "an ONNX", ".xml": "an OpenVINO"}


def is_checkpoint(source: str) -> bool:
    """Whether ``source`` names a checkpoint (a path that exists, or a remote name) rather than a named variant."""
    return Path(source).exists() or is_remote(source)


def source_config(source: str, overrides: dict[str, Any], *, adapter: str | None = None) -> ViTConfig:
    """The config of the model a checkpoint (or a variant's name) describes with ``overrides``, and the adapter
    folder ``adapter`` (its image size, channels, classes, prompts and adapters), before any weights are put into
    a model: what a size check needs to know (a vitkit directory's weights are not read)."""
    if is_checkpoint(source):
        return checkpoint_config(source, overrides, adapter=adapter)
    config = model_config(source, **overrides)
    return config if adapter is None else adapted_config(config, adapter)


def checkpoint_config(checkpoint: str, overrides: dict[str, Any], *, adapter: str | None = None) -> ViTConfig:
    """``source_config`` of a checkpoint: a path that does not exist is a ``CheckpointError`` naming it."""
    config = overridden(read_config(checkpoint, overrides), overrides, checkpoint)
    return config if adapter is None else adapted_config(config, adapter)


def adapted_config(config: ViTConfig, adapter: str) -> ViTConfig:
    """``config`` with the fields the adapter folder ``adapter`` changes in its base, as ``load_adapter`` changes
    them (none for a folder that peft wrote)."""
    carried = read_adapter(Path(adapter))[2]
    try:
        return ViTConfig.from_dict({**config.to_dict(), **carried}, str(Path(adapter) / WEIGHTS_FILE))
    except ConfigError as error:
        raise CheckpointError(str(error)) from None


def load_model(source: str, overrides: dict[str, Any] | None = None, *, adapter: str | None = None
               ) -> VisionTransformer:
    """The model of a checkpoint, or of a named variant (``ViT-S/16``) with random weights, with ``overrides`` and
    the adapter folder ``adapter`` applied."""
    overrides = overrides or {}
    if is_checkpoint(source):
        return load(source, adapter=adapter, **overrides)
    model = create_model(source, **overrides)
    return model if adapter is None else load_adapter(model, adapter)


def load_on_device(checkpoint: str, overrides: dict[str, Any] | None = None, device: str | torch.device | None = None,
                   precision: str = "fp32", *, adapter: str | None = None
                   ) -> tuple[VisionTransformer, torch.device, torch.dtype]:
    """The model of ``checkpoint`` (with ``overrides`` and the adapter folder ``adapter``) on ``device``
    (default: the best available), with the device and the dtype ``precision`` computes in there (``auto``: bf16
    where the hardware runs it natively)."""
    chosen = select_device(device)
    model = load(checkpoint, adapter=adapter, **(overrides or {}))
    return model.to(chosen), chosen, resolve_precision(precision, chosen)


def refuse_dense(config: ViTConfig, source: str, command: str) -> None:
    """Refuse, in one line, a model with a dense head in a command about whole images' classes or embeddings."""
    if config.dense_head != "none":
        raise ConfigError(f"{source}: a {config.dense_head} head predicts per pixel; {command} takes a model that "
                          f"classifies or embeds whole images (a dense model is measured by vitkit eval and drawn by "
                          f"vitkit predict --out DIR)")


def load_inference(checkpoint: str, overrides: dict[str, Any] | None = None, device: str | None = None,
                   precision: str = "fp32", *, adapter: str | None = None
                   ) -> tuple[VisionTransformer | ExportedModel, torch.device, torch.dtype]:
    """The model ``eval``/``predict`` run: a checkpoint (with the adapter folder ``adapter``) on ``device`` in
    ``precision`` (``load_on_device``), an ``.onnx`` file run by ONNX Runtime as it was exported, or an OpenVINO
    ``.xml`` on the CPU in ``precision``; with its device and compute dtype (the runtimes compute in their own
    precision: fp32 as far as autocast goes)."""
    chosen, suffix = select_device(device), Path(checkpoint).suffix
    if suffix in EXPORTED and overrides:
        raise ConfigError(f"--set {', '.join(overrides)}: {EXPORTED[suffix]} model runs as it was exported")
    if suffix in EXPORTED and adapter is not None:
        raise ConfigError(f"--adapter: {EXPORTED[suffix]} model runs as it was exported; apply the adapter before "
                          f"exporting: vitkit convert BASE out{suffix} --adapter DIR")
    if suffix == ".onnx":
        if precision not in ("fp32", "auto"):
            raise ConfigError(f"--precision {precision}: an ONNX model runs in the precision it was exported in")
        return OnnxModel(checkpoint, chosen), torch.device("cpu"), torch.float32
    if suffix == ".xml":
        if precision == "fp16":
            raise ConfigError("--precision fp16: an OpenVINO model runs in fp32, bf16 or auto (bf16 where native)")
        dtype = resolve_precision(precision, torch.device("cpu"))
        return OpenVinoModel(checkpoint, dtype), torch.device("cpu"), torch.float32
    return load_on_device(checkpoint, overrides, chosen, precision, adapter=adapter)


def check_graph_inputs(model: object, checkpoint: str, max_patches: int | None) -> None:
    """An exported graph takes image tensors or NaFlex batches, as it was exported; a PyTorch model takes both."""
    if isinstance(model, VisionTransformer) or bool(max_patches) == model.naflex:
        return
    if max_patches:
        raise ConfigError(f"--max-patches: {checkpoint} was exported for image tensors; export it again with "
                          f"`vitkit convert ... --naflex`, or use the PyTorch checkpoint")
    raise ConfigError(f"{checkpoint} was exported for NaFlex batches; pass --max-patches N (N patches an image)")
