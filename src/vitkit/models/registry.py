"""Named variants as the paper writes them: ``ViT-B/16`` is the Base model with 16x16 patches."""

from __future__ import annotations

import difflib
import re
from typing import Any

from .config import ViTConfig
from .vit import VisionTransformer

# size -> (layers, D, MLP, heads): paper table 1, plus Ti and S from DeiT/AugReg.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "Ti": (12, 192, 768, 3),
    "S": (12, 384, 1536, 6),
    "B": (12, 768, 3072, 12),
    "L": (24, 1024, 4096, 16),
    "H": (32, 1280, 5120, 16),
}

PAPER_VARIANTS = ("ViT-Ti/16", "ViT-S/16", "ViT-S/32", "ViT-B/8", "ViT-B/16", "ViT-B/32",
                  "ViT-L/16", "ViT-L/32", "ViT-H/14")

# Hybrids (section 3.2 and AugReg): (ResNet depth, ViT patch name) -> (blocks per stage, patch size on
# the feature map). R50 for /16 drops stage 4 and extends stage 3 to 9 blocks; "R+" is the stem alone.
HYBRIDS: dict[tuple[str, int], tuple[tuple[int, ...], int]] = {
    ("R", 16): ((), 8),
    ("R26", 32): ((2, 2, 2, 2), 1),
    ("R50", 16): ((3, 4, 9), 1),
    ("R50", 32): ((3, 4, 6, 3), 1),
}
HYBRID_VARIANTS = ("R+ViT-Ti/16", "R26+ViT-S/32", "R26+ViT-B/32", "R50+ViT-B/16", "R50+ViT-L/32")

_NAME = re.compile(r"^(?:(r\d*)\+)?vit-(ti|s|b|l|h)/(\d+)$", re.IGNORECASE)
_SIZE_BY_LOWER = {size.lower(): size for size in SIZES}


def list_models() -> list[str]:
    """The paper's named variants and hybrids; any other ``ViT-<size>/<patch>`` pair is accepted too."""
    return list(PAPER_VARIANTS + HYBRID_VARIANTS)


def model_config(name: str, **overrides: Any) -> ViTConfig:
    """The configuration of a named variant (224 px, 1000 classes unless overridden)."""
    match = _NAME.match(name.strip())
    if not match:
        close = difflib.get_close_matches(name, list_models(), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}: expected 'ViT-<size>/<patch>' with size in "
                         f"{'/'.join(SIZES)}, e.g. {', '.join(PAPER_VARIANTS[:3])}{hint}")
    resnet, size, patch = match.group(1), _SIZE_BY_LOWER[match.group(2).lower()], int(match.group(3))
    depth, dim, mlp_dim, heads = SIZES[size]
    canonical = f"ViT-{size}/{patch}"
    base = dict(patch_size=patch, depth=depth, dim=dim, mlp_dim=mlp_dim, num_heads=heads)
    if resnet:
        resnet = resnet.upper()
        if (resnet, patch) not in HYBRIDS:
            raise ValueError(f"unknown hybrid {name.strip()!r}: expected one of {', '.join(HYBRID_VARIANTS)} "
                             "(any ViT size with " + ", ".join(f"{r}+.../{p}" for r, p in HYBRIDS) + ")")
        canonical = f"{resnet}+{canonical}"
        base["backbone"], base["patch_size"] = HYBRIDS[resnet, patch]
    base["extra"] = {"name": canonical}
    if "image_size" not in overrides and 224 % patch and not resnet:
        base["image_size"] = 224 // patch * patch  # e.g. ViT-H/14 keeps 224; patch 32 at 224 too
    return ViTConfig(**{**base, **overrides})


def create_model(name: str | ViTConfig, **overrides: Any) -> VisionTransformer:
    """Build a freshly initialised model from a variant name (or a config) and field overrides."""
    config = name.replace(**overrides) if isinstance(name, ViTConfig) else model_config(name, **overrides)
    return VisionTransformer(config)
