"""InternViT-300M, the vision tower of InternVL, in HF transformers: ``InternVLVisionModel`` (model_type
``internvl_vision``) and the tower of a whole ``internvl`` model (the language model and projector left out).

The architecture, as vitkit's options: a [class] token with a row of the position table, pre-norm blocks of
LayerNorms with LayerScale (``lambda_1``, ``lambda_2``), separate q/k/v projections (packed as vitkit's ``qkv``),
an exact-GELU MLP, and no norm after the last block (``use_mean_pooling``; else a final LayerNorm). The table is
resized bicubic without antialias at other sizes, as transformers resizes it. The model's output is every token's
last state; ``forward_head(features, pre_logits=True)`` is the [class] token's, as timm's
``vit_intern300m_patch14_448`` pools. InternViT-6B (QK-norm) is refused by name before this reader is reached.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import Provenance, ViTConfig
from .files import check_fields
from .files import prefixed_weights
from .hf import GELUS
from .inference import infer_config
from .names import Names, fuse_qkv, rename

MODEL_TYPES = ("internvl_vision", "internvl")
TOWER_PREFIXES = ("model.vision_tower.", "vision_tower.")  # transformers 5's and earlier names in a whole model
FIELDS = dict(hidden_size="count", num_hidden_layers="count", num_attention_heads="count", intermediate_size="count",
              num_channels="count", layer_norm_eps="positive", layer_scale_init_value="number",
              attention_bias="flag", use_mean_pooling="flag", use_absolute_position_embeddings="flag")
NAMES = Names([
    ("embeddings.cls_token", "cls_token"),
    ("embeddings.position_embeddings", "pos_embed.weight"),
    ("embeddings.patch_embeddings.projection.{rest}", "patch_embed.proj.{rest}"),
    *[(f"encoder.layer.{{i}}.attention.{p}_proj.{{rest}}", f"blocks.{{i}}.attn.{p}.{{rest}}") for p in "qkv"],
    ("encoder.layer.{i}.attention.projection_layer.{rest}", "blocks.{i}.attn.proj.{rest}"),
    ("encoder.layer.{i}.layernorm_before.{rest}", "blocks.{i}.norm1.{rest}"),
    ("encoder.layer.{i}.layernorm_after.{rest}", "blocks.{i}.norm2.{rest}"),
    ("encoder.layer.{i}.lambda_1", "blocks.{i}.ls1.gamma"),
    ("encoder.layer.{i}.lambda_2", "blocks.{i}.ls2.gamma"),
    ("encoder.layer.{i}.mlp.{rest}", "blocks.{i}.mlp.{rest}"),
    ("layernorm.{rest}", "norm.{rest}"),
])


def tower_config(hf: dict[str, Any], whole: bool, family: str, path: Path) -> tuple[dict[str, Any], str]:
    """The vision tower's config of a whole ``family`` model (its ``vision_config``, refused when there is none) or
    of the tower alone, and the path to name its fields by."""
    if not whole:
        return hf, ""
    if not isinstance(hf.get("vision_config"), dict):
        raise CheckpointError(f"{path}: {family} model without a vision_config; vitkit reads its vision tower")
    return hf["vision_config"], "vision_config."


def tower_weights(directory: Path, prefixes: tuple[str, ...] | None, family: str, rest: str
                  ) -> dict[str, torch.Tensor]:
    """The vision tower's tensors of an HF directory: those under the first of ``prefixes`` that has any (a whole
    ``family`` model, whose ``rest`` is left out with a warning), or (``prefixes`` None) all of them."""
    for prefix in prefixes or ("",):
        state = prefixed_weights(directory, prefix)
        if state:
            if prefixes:
                warnings.warn(f"{directory}: a whole {family} model; its vision tower ({prefix}*) is read, {rest} "
                              f"left out", stacklevel=5)
            return state
    raise CheckpointError(f"{directory}: no tensors of a {family} vision tower"
                          + (f" (expected {' or '.join(p + '*' for p in prefixes)})" if prefixes else ""))


def read_internvl(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                  ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF directory of ``InternVLVisionModel`` or of a whole InternVL model, whose vision tower is read."""
    path = directory / "config.json"
    whole = hf["model_type"] == "internvl"
    tower, within = tower_config(hf, whole, "an InternVL", path)
    check_fields(tower, FIELDS, path, required=("num_attention_heads",), within=within)
    act, norm = tower.get("hidden_act", "gelu"), tower.get("norm_type", "layer_norm")
    if act not in GELUS or norm != "layer_norm" or not tower.get("use_absolute_position_embeddings", True):
        raise CheckpointError(f"{path}: {within}hidden_act={act!r}, norm_type={norm!r}, "
                              f"use_absolute_position_embeddings={tower.get('use_absolute_position_embeddings')!r}; "
                              f"vitkit reads InternViT-300M's tower (a GELU, LayerNorms, a position table)")
    state = tower_weights(directory, TOWER_PREFIXES if whole else None, "InternVL", "its language model and "
                          "projector are")
    state = fuse_qkv(rename({key: value for key, value in state.items() if key != "embeddings.mask_token"}, NAMES,
                            str(path)))
    provenance = Provenance(format="hf-internvl", source=str(directory), normalization="imagenet", crop_pct=1.0)
    return infer_config(state, overrides, str(path), num_heads=tower["num_attention_heads"],
                        ln_eps=tower.get("layer_norm_eps", 1e-6), gelu=GELUS[act],
                        layer_scale=float(tower.get("layer_scale_init_value", 0.1)),
                        final_norm=not tower.get("use_mean_pooling", True), pos_interp="bicubic",
                        pos_interp_antialias=False, provenance=provenance)
