"""NVIDIA's C-RADIO in HF transformers (``RadioModel``, model_type ``radio``), saved in C-RADIO's own layout
(``radio_model.model.*``).

What the model computes and how vitkit holds it:
- The input conditioner normalises [0, 1] pixels inside the model by its ``norm_mean``/``norm_std`` buffers
  (CLIP's statistics): vitkit's model takes inputs normalised by them (the provenance's statistics, which
  evaluation and prediction apply), the same arithmetic one step earlier.
- Patches are flattened as (channel, row, column) into a bias-free Linear: vitkit's patch kernel without a bias.
- ``num_cls_tokens`` class tokens and ``num_registers`` registers before the patches, none with a position: the
  first is vitkit's [class] token, the others its registers; the summary is the class tokens of
  ``summary_idxs`` side by side (``summary_tokens``), what ``forward_head(features, pre_logits=True)`` returns;
  the spatial features are the patch tokens of ``forward_features``. No norm after the last block.
- The position table covers ``max_img_size`` pixels (128 x 128 patches for 2048): it keeps that grid
  (``pos_grid``) and is resized bilinearly, corners not aligned, to a square of the input grid's longer side, then
  cropped to the grid (``pos_interp_crop``); the native input size is the config's ``image_size``.
- LayerScale (``layer_scale{1,2}.lambda1``) where the weights hold it; a SwiGLU MLP's gate and value packed as
  vitkit's ``fc1``, gate first. A video patch embedder (``video_temporal_patch_size``) is left out with a warning:
  vitkit reads the image path.
Packed images (``image_grid_hw``) are vitkit's NaFlex batches: each image attends to itself alone.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import Provenance, ViTConfig, is_int
from .files import check_fields, hub_weights_file, read_weights
from .hf import CONFIG_FILE, GELUS, HF_FIELDS
from .inference import infer_config, known_normalization
from .names import Names, rename
from .timm_naflex import own_table_grid

MODEL_TYPES = ("radio",)
PREFIX = "radio_model.model."
NAMES = Names([
    ("patch_generator.embedder.weight", "patch_embed.proj.weight"),
    ("patch_generator.pos_embed", "pos_embed.weight"),
    ("patch_generator.cls_token.token", "prefix_tokens"),
    ("blocks.{i}.layer_scale1.lambda1", "blocks.{i}.ls1.gamma"),
    ("blocks.{i}.layer_scale2.lambda1", "blocks.{i}.ls2.gamma"),
    ("blocks.{i}.mlp.down_proj.{rest}", "blocks.{i}.mlp.fc2.{rest}"),
    ("blocks.{i}.{rest}", "blocks.{i}.{rest}"),
])
FIELDS = {**HF_FIELDS, "mlp_ratio": "positive", "layerscale_value": "number", "num_cls_tokens": "count",
          "num_registers": "whole", "max_img_size": "count", "use_swiglu_ffn": "flag", "drop_path_rate": "fraction"}


def read_radio(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
               ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A C-RADIO directory of transformers whose ``config.json`` the caller has parsed into ``hf``."""
    path = directory / CONFIG_FILE
    check_fields(hf, FIELDS, path, required=("num_attention_heads",))
    act = hf.get("hidden_act", "gelu")
    if not hf.get("use_swiglu_ffn", False) and act not in GELUS:
        raise CheckpointError(f"{path}: hidden_act={act!r}; expected one of {sorted(GELUS)} (or use_swiglu_ffn)")
    weights = hub_weights_file(directory, "an HF")
    state = read_weights(weights)
    summary, mean, std = (state.pop(f"radio_model.{key}", None) for key in (
        "summary_idxs", "input_conditioner.norm_mean", "input_conditioner.norm_std"))
    video = state.pop(PREFIX + "patch_generator.video_embedder.weight", None)
    if video is not None:
        warnings.warn(f"{weights}: C-RADIO's video patch embedder ({tuple(video.shape)}) is left out; vitkit reads "
                      f"its image path", stacklevel=3)
    outside = sorted(key for key in state if not key.startswith(PREFIX))
    if outside:
        raise CheckpointError(f"{weights}: {', '.join(outside[:6])}: not C-RADIO's vision encoder "
                              f"({PREFIX}*), which is all vitkit reads of it")
    state = _layout(rename({key.removeprefix(PREFIX): value for key, value in state.items()}, NAMES, str(weights)),
                    hf, weights)
    channels = hf.get("num_channels", 3)
    cls_tokens = hf.get("num_cls_tokens", 3)
    summary = summary.tolist() if summary is not None else hf.get("summary_idxs") or [0, 1]
    if not (isinstance(summary, list) and summary and all(is_int(i) and 0 <= i < cls_tokens for i in summary)):
        raise CheckpointError(f"{path}: summary_idxs={summary!r}; expected indices of the {cls_tokens} class tokens")
    statistics = (mean.flatten().tolist(), std.flatten().tolist()) if mean is not None and std is not None else (
        hf.get("norm_mean"), hf.get("norm_std"))
    normalization = known_normalization(*statistics, path, channels, ("norm_mean", "norm_std"))
    settings = dict(num_heads=hf["num_attention_heads"], ln_eps=hf.get("layer_norm_eps", 1e-6),
                    gelu=GELUS.get(act, "exact"), patch_bias=False, final_norm=False, no_embed_class=True,
                    pos_interp="bilinear", pos_interp_antialias=False, pos_interp_crop=True,
                    summary_tokens=None if summary == [0] else tuple(summary),
                    provenance=Provenance(format="hf-radio", source=str(directory), normalization=normalization,
                                          crop_pct=1.0))
    if "blocks.0.ls1.gamma" in state:
        settings["layer_scale"] = float(hf.get("layerscale_value", 1.0))
    config, state = infer_config(state, overrides, str(weights), **settings)
    return own_table_grid(config, hf.get("image_size", 224), str(path)), state


def _layout(state: dict[str, torch.Tensor], hf: dict[str, Any], source: Path) -> dict[str, torch.Tensor]:
    """C-RADIO's tensors in vitkit's shapes: the (D, C*P*P) embedder as a (D, C, P, P) kernel, the class tokens and
    registers as [class] and vitkit's registers, SwiGLU's gate and value packed."""
    proj = state["patch_embed.proj.weight"]
    channels, patch = hf.get("num_channels", 3), hf.get("patch_size", 16)
    if proj.ndim != 2 or proj.shape[1] != channels * patch * patch:
        raise CheckpointError(f"{source}: patch_generator.embedder.weight of shape {tuple(proj.shape)}; expected "
                              f"(hidden_size, {channels * patch * patch}) for patch_size={patch} and "
                              f"num_channels={channels}")
    state["patch_embed.proj.weight"] = proj.reshape(-1, channels, patch, patch)
    tokens = state.pop("prefix_tokens")
    expected = hf.get("num_cls_tokens", 3) + hf.get("num_registers", 7)
    if tokens.ndim != 2 or tokens.shape[0] != expected:
        raise CheckpointError(f"{source}: patch_generator.cls_token.token of shape {tuple(tokens.shape)}; expected "
                              f"num_cls_tokens + num_registers = {expected} rows")
    state["cls_token"] = tokens[None, :1]
    if expected > 1:
        state["reg_token"] = tokens[None, 1:]
    return packed_gate_value(state)


def packed_gate_value(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A SwiGLU MLP's separate ``gate_proj`` and ``up_proj`` layers (weights and any biases) packed as vitkit's
    ``fc1``, gate first."""
    for key in [key for key in state if key.endswith(".mlp.gate_proj.weight")]:
        block = key.removesuffix("gate_proj.weight")
        for leaf in ("weight", "bias"):
            if f"{block}gate_proj.{leaf}" in state:
                state[f"{block}fc1.{leaf}"] = torch.cat([state.pop(f"{block}gate_proj.{leaf}"),
                                                         state.pop(f"{block}up_proj.{leaf}")])
    return state
