"""timm's ``VisionTransformer`` state dicts, hybrids (``patch_embed.backbone``) included.

timm's names are nearly vitkit's. What the weights cannot tell: the head count (taken from the paper's
table for its widths, else the ``num_heads`` override) and, for a model with a [class] token and no
``fc_norm``, whether it pooled the token or the patches (token unless ``pool='gap'`` is passed).
Numerics are timm's: exact GELU, LayerNorm eps 1e-6, and for hybrids StdConv (w-m)/sqrt(var+1e-8)
with GroupNorm eps 1e-5.
"""

from __future__ import annotations

from typing import Any

import torch

from ..models.config import ViTConfig
from .common import Names, infer_config, rename

TIMM_NUMERICS = dict(gelu="exact", ln_eps=1e-6, pos_interp="bicubic", pos_interp_antialias=True,
                     std_conv="sqrt(var+eps)", std_conv_eps=1e-8, gn_eps=1e-5)

NAMES = Names([
    ("pos_embed", "pos_embed.weight"),
    ("patch_embed.backbone.conv.{rest}", "patch_embed.backbone.stem.conv.{rest}"),  # stem-only hybrid
    ("patch_embed.backbone.norm.{rest}", "patch_embed.backbone.stem.norm.{rest}"),
    ("patch_embed.backbone.stages.{i}.blocks.{j}.{rest}", "patch_embed.backbone.stages.{i}.{j}.{rest}"),
    ("{rest}", "{rest}"),
])


def is_timm(state: dict[str, torch.Tensor]) -> bool:
    return "patch_embed.proj.weight" in state and "pos_embed" in state


def from_timm(state: dict[str, torch.Tensor], overrides: dict[str, Any],
              source: str) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    state = rename(state, NAMES, source)
    if "patch_embed.backbone.stem.conv.weight" not in state:
        numerics = {k: TIMM_NUMERICS[k] for k in ("gelu", "ln_eps", "pos_interp", "pos_interp_antialias")}
    else:
        numerics = TIMM_NUMERICS
    return infer_config(state, overrides, source, **numerics, extra={"format": "timm", "source": source})
