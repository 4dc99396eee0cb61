"""Google's TIPSv2 in HF transformers: ``Tipsv2VisionModel`` (model_type ``tipsv2_vision_model``) and the vision
tower of the whole ``Tipsv2Model`` (``tipsv2``, its text tower left out with a warning: ``vitkit.load_clip``
reads both).

TIPSv2 is DINOv2 with one register (TIPSv2's second class token) and LayerScale; transformers saves it in the
layout of Google's release, which is timm's but for ``register_tokens``, the MLP's ``c_fc``/``c_proj`` (SwiGLU's
packed ``w12``, gate first, and ``w3``) and a position table with a [class] row. As in DINOv2 with registers, that
row is added to [class] before the register is put in: it is folded into the [class] token, leaving a table of
the patches (``no_embed_class``). Other sizes resample the table bilinearly with antialias (HF's call; timm's
``vit_*_tipsv2`` resample bicubically). The mask token replaces masked patches at pre-training only and is not
read. TIPSv2 takes the [0, 1] pixels as they are (its processor does not normalise): the "unit" statistics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import Provenance, ViTConfig
from .files import check_fields, hub_weights_file, read_weights
from .hf import CONFIG_FILE, GELUS, HF_FIELDS, read_preprocessing
from .inference import infer_config
from .names import Names, rename, without_text_tower

MODEL_TYPES = ("tipsv2_vision_model", "tipsv2")
TEXT_PREFIX, TEMPERATURE = "text_encoder.", "temperature"  # the text tower, read by vitkit.text.readers
TEXT_TOWER = (TEXT_PREFIX, TEMPERATURE)
NAMES = Names([
    ("register_tokens", "reg_token"),
    ("pos_embed", "pos_embed.weight"),
    ("norm.{rest}", "norm.{rest}"),
    ("blocks.{i}.mlp.c_fc.{rest}", "blocks.{i}.mlp.fc1.{rest}"),
    ("blocks.{i}.mlp.c_proj.{rest}", "blocks.{i}.mlp.fc2.{rest}"),
    ("blocks.{i}.mlp.w12.{rest}", "blocks.{i}.mlp.fc1.{rest}"),
    ("blocks.{i}.mlp.w3.{rest}", "blocks.{i}.mlp.fc2.{rest}"),
    ("blocks.{i}.{rest}", "blocks.{i}.{rest}"),
    ("cls_token", "cls_token"),
    ("patch_embed.proj.{rest}", "patch_embed.proj.{rest}"),
])
FIELDS = {**HF_FIELDS, "mlp_ratio": "positive", "layerscale_value": "number", "num_register_tokens": "whole",
          "use_swiglu_ffn": "flag", "drop_path_rate": "fraction"}


def read_tipsv2(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A TIPSv2 directory (the vision model, or the whole model's vision tower) whose ``config.json`` the caller
    has parsed into ``hf``."""
    nested = hf["model_type"] == "tipsv2"
    tower = hf.get("vision_config", {}) if nested else hf
    path = directory / CONFIG_FILE
    check_fields(tower, FIELDS, path, required=("num_attention_heads",), within="vision_config." if nested else "")
    swiglu, act = tower.get("use_swiglu_ffn", False), tower.get("hidden_act", "gelu")
    if not swiglu and act not in GELUS:
        raise CheckpointError(f"{path}: hidden_act={act!r}; expected one of {sorted(GELUS)} (or use_swiglu_ffn)")
    weights = hub_weights_file(directory, "an HF")
    state = read_weights(weights)
    if nested:
        text = [key for key in state if key.startswith(TEXT_TOWER)]
        state = {key.removeprefix("vision_encoder."): value
                 for key, value in without_text_tower(state, text, "TIPSv2", weights).items()}
    state = rename({key: value for key, value in state.items() if key != "mask_token"}, NAMES, str(weights))
    table = state.get("pos_embed.weight")
    if table is not None and "cls_token" in state:  # HF's [class] takes a position row; the register takes none
        state["cls_token"] = state["cls_token"] + table[:, :1]
        state["pos_embed.weight"] = table[:, 1:]
    settings = dict(num_heads=tower["num_attention_heads"], ln_eps=tower.get("layer_norm_eps", 1e-6),
                    gelu=GELUS.get(act, "exact"), pos_interp="bilinear", pos_interp_antialias=True,
                    no_embed_class=True, layer_scale=float(tower.get("layerscale_value", 1.0)),
                    provenance=Provenance(format="hf-tipsv2", source=str(directory),
                                          **read_preprocessing(directory, tower.get("num_channels", 3), "unit")))
    return infer_config(state, overrides, str(weights), **settings)
