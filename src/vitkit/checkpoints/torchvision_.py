"""torchvision's ``VisionTransformer`` state dicts (packed ``in_proj_weight``; exact GELU, eps 1e-6).

The packed attention matrix hides the head count: it comes from the paper's table for its widths,
else from the ``num_heads`` override.
"""

from __future__ import annotations

from typing import Any

import torch

from ..models.config import Provenance, ViTConfig
from .inference import infer_config
from .names import Names, rename

_LAYER = "encoder.layers.encoder_layer_{i}."
NAMES = Names([
    ("class_token", "cls_token"),
    ("conv_proj.{rest}", "patch_embed.proj.{rest}"),
    ("encoder.pos_embedding", "pos_embed.weight"),
    ("encoder.ln.{rest}", "norm.{rest}"),
    ("heads.head.{rest}", "head.{rest}"),
    ("heads.pre_logits.{rest}", "pre_logits.0.{rest}"),
    (_LAYER + "ln_1.{rest}", "blocks.{i}.norm1.{rest}"),
    (_LAYER + "ln_2.{rest}", "blocks.{i}.norm2.{rest}"),
    (_LAYER + "self_attention.in_proj_weight", "blocks.{i}.attn.qkv.weight"),
    (_LAYER + "self_attention.in_proj_bias", "blocks.{i}.attn.qkv.bias"),
    (_LAYER + "self_attention.out_proj.{rest}", "blocks.{i}.attn.proj.{rest}"),
    (_LAYER + "mlp.0.{rest}", "blocks.{i}.mlp.fc1.{rest}"),
    (_LAYER + "mlp.3.{rest}", "blocks.{i}.mlp.fc2.{rest}"),
    (_LAYER + "mlp.linear_1.{rest}", "blocks.{i}.mlp.fc1.{rest}"),  # torchvision < 0.13
    (_LAYER + "mlp.linear_2.{rest}", "blocks.{i}.mlp.fc2.{rest}"),
])


def is_torchvision(state: dict[str, torch.Tensor]) -> bool:
    return "conv_proj.weight" in state and "encoder.pos_embedding" in state


def from_torchvision(state: dict[str, torch.Tensor], overrides: dict[str, Any],
                     source: str) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    return infer_config(rename(state, NAMES, source), overrides, source, gelu="exact", ln_eps=1e-6,
                        pos_interp="bicubic", pos_interp_align_corners=True,
                        provenance=Provenance(format="torchvision", source=source, normalization="imagenet"))
