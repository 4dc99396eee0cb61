"""Writing a model in any supported format: what ``vitkit convert`` does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError, ConfigError, FormatError
from ..models.config import ViTConfig
from ..models.vit import VisionTransformer
from .adapters import merged, refuse_adapted
from .gemma4 import is_gemma4, refuse_hf_gemma4
from .google import write_npz
from .hf import write_hf
from .hf_families import hf_family_of, write_hf_family
from .hf_recent import hf_recent_family_of, write_hf_recent
from .timm import write_timm
from .loading import load
from .onnx import OnnxExport, write_onnx
from .openvino import OpenVinoExport, write_openvino
from .quantize import check_calibration_wanted

WRITERS: dict[str, Callable[[VisionTransformer, Path], Path]] = {
    "native": lambda model, path: model.save(path),
    "npz": write_npz,
    "hf": lambda model, path: hf_writer(model.config)(model, path),
    "timm": write_timm,
}
FORMATS = (*WRITERS, "onnx", "openvino")
# The formats whose models have no VPT prompts or AdaptFormer adapters, as their refusals name them.
PLAIN_FORMATS = {"npz": "a Google .npz", "hf": "an HF transformers directory", "timm": "a timm state dict"}
# The format a destination's extension names; any other destination is a folder: native, hf or timm.
EXTENSION_FORMATS = {".onnx": "onnx", ".xml": "openvino", ".npz": "npz", ".safetensors": "timm"}


def output_format(destination: str | Path, asked: str | None) -> str:
    """What ``convert`` writes: ``asked`` (``--to``), else the format the destination's extension names, else
    native (a folder); a format and an extension that disagree are refused."""
    suffix = Path(destination).suffix.lower()
    implied = EXTENSION_FORMATS.get(suffix)
    if asked is None:
        return implied or "native"
    if implied not in (None, asked):
        fitting = {value: key for key, value in EXTENSION_FORMATS.items()}.get(asked)
        instead = f"a destination ending in {fitting}" if fitting else "a folder"
        raise ConfigError(f"--to {asked} and {destination}: a {suffix} file holds {implied}; pass --to {implied}, "
                          f"or {instead} for {asked}")
    return asked


def hf_writer(config: ViTConfig) -> Callable[[VisionTransformer, Path], Path]:
    """The HF writer of ``config``'s family: DINOv3 or AIMv2, a family on the ViT layout, or HF's ViT."""
    if is_gemma4(config):
        return refuse_hf_gemma4
    if hf_recent_family_of(config):
        return write_hf_recent
    return write_hf_family if hf_family_of(config) else write_hf


def export(model: VisionTransformer, path: str | Path, to: str, quantize: str | None = None,
           device: torch.device | str = "cpu", naflex: bool = False,
           calibration: list[np.ndarray] | None = None) -> Path | OnnxExport | OpenVinoExport:
    """Write ``model`` to ``path`` as a vitkit directory, a Google ``.npz``, an HF directory, a timm state dict,
    ONNX (traced on ``device``, checked by ONNX Runtime; int8 static with ``calibration`` images, else dynamic)
    or OpenVINO IR (checked by OpenVINO; int8 static, calibrated); for the last two their report is returned.
    Their graphs take images of any size, or with ``naflex`` NaFlex batches of any number of patches. An adapted
    model's LoRA is merged into its weights first, in place (``adapters.merged``); its VPT prompts and AdaptFormer
    adapters, and a dense head, go to vitkit's format, ONNX and OpenVINO, and are refused by the others."""
    if naflex and to not in ("onnx", "openvino"):
        raise CheckpointError(f"naflex applies to ONNX and OpenVINO export, not to {to!r}: the other formats hold "
                              f"weights, which take NaFlex batches once loaded")
    if to in PLAIN_FORMATS:
        refuse_adapted(model.config, f"{path}: {PLAIN_FORMATS[to]}")
        if model.config.dense_head != "none":
            raise FormatError(f"{path}: {PLAIN_FORMATS[to]} has no place for a dense head "
                              f"(dense_head={model.config.dense_head!r}); write vitkit's format or ONNX/OpenVINO")
    model = merged(model)
    if to == "onnx":
        return write_onnx(model, path, quantize, device, naflex, calibration)
    if to == "openvino":
        return write_openvino(model, path, device, naflex=naflex, quantize=quantize, calibration=calibration)
    check_quantizable(to, path, quantize, calibration is not None)
    if to not in WRITERS:
        raise CheckpointError(f"unknown export format {to!r}; expected one of {sorted(FORMATS)}")
    try:
        return WRITERS[to](model, Path(path))
    except FormatError as error:
        if to == "native":
            raise
        raise FormatError(f"{error}; write it as 'native' (vitkit's own format holds every model) or, to run it "
                          f"elsewhere, as 'onnx'") from error


def check_quantizable(to: str, path: str | Path, quantize: str | None, calibrated: bool) -> None:
    """Refuse int8 (or calibration images) for a format that holds weights only in the model's own precision:
    checked before any calibration images are read."""
    if (quantize or calibrated) and to not in ("onnx", "openvino"):
        what = f"quantize={quantize!r} applies" if quantize else "calibration images apply"
        raise FormatError(f"{path}: {what} to ONNX and OpenVINO exports, not to {to!r}, whose files hold the "
                          f"weights in the model's own precision; write .onnx or .xml for int8")
    check_calibration_wanted(quantize, calibrated, str(path))


def convert(source: str | Path, destination: str | Path, to: str, quantize: str | None = None,
            device: torch.device | str = "cpu", *, adapter: str | Path | None = None,
            **overrides: Any) -> VisionTransformer:
    """Read ``source`` in whatever format it is, with the adapter folder ``adapter`` applied, and write it to
    ``destination`` in format ``to`` (an adapter's LoRA merged into the weights: ``export``)."""
    model = load(source, adapter=adapter, **overrides)
    export(model, destination, to, quantize, device)
    return model
