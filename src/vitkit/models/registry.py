"""Named variants as the paper writes them: ``ViT-B/16`` is the Base model with 16x16 patches; and the
families that later papers built on the same skeleton: ``DeiT-B/16-distilled``, ``DINOv2-S/14-reg4``,
``DINOv3-H+/16``, ``PE-core-L/14``..."""

from __future__ import annotations

import difflib
import re
from typing import Any

from ..declare import check_keys
from ..errors import ConfigError
from .config import FIELDS, SOURCE, Provenance, ViTConfig
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

# Sizes that only the families use: DeiT-III's Medium, SigLIP's shape-optimised 400M, DINOv2's giant (whose
# SwiGLU MLP has a hidden width of 4096 for its gate and its value each).
FAMILY_SIZES: dict[str, tuple[int, int, int, int]] = {
    "M": (12, 512, 2048, 8),
    "So400m": (27, 1152, 4304, 16),
    "g": (40, 1536, 4096, 24),
}
# Sizes of one family each, kept out of FAMILY_SIZES (whose widths also tell a checkpoint's head count): DINOv3's
# S+ and H+ (H+ has 20 heads of 64 where ViT-H has 16 of 80) and Perception Encoder's T (Ti by PE's name).
OWN_SIZES: dict[str, tuple[int, int, int, int]] = {
    "S+": (12, 384, 1536, 6),
    "H+": (32, 1280, 5120, 20),
    "T": (12, 192, 768, 3),
    "167M": (16, 768, 3072, 12),  # Gemma 4's towers, named by timm's parameter counts
    "570M": (27, 1152, 4304, 16),
    "88M": (12, 768, 3072, 12),  # timm's Qwen3 ViTs, named by their parameter counts
    "306M": (24, 1024, 4096, 16),
    "416M": (27, 1152, 4304, 16),
}
# Sizes whose MLP is a SwiGLU with a gate and a value of the MLP width each. DINOv3 rounds that width up to a
# multiple of 8 (timm's align_to), which 4 D already is for S+ and H+.
SWIGLU_SIZES = ("g", "S+", "H+")

# Each family is the paper's model with some config options on, the defaults of timm's definitions
# (image size, classes: DINOv2 and SigLIP towers come without a head), its input normalisation and its
# evaluation crop: timm 1.0.31's pretrained_cfg of the default weights for DeiT, DeiT-III (0.9) and DINOv2;
# for CLIP and SigLIP the whole image, as their authors' preprocessing and HF's processors take it (timm
# names 0.9 for OpenAI's CLIP and for SigLIP, its generic default). The paper's ViT: Google's, 1.0.
# Beyond config fields: ``image_size`` is the family's native size (rounded down to a multiple of the patch),
# ``mlp_ratio`` sets the MLP width to int(D x ratio), ``rope_ref_grid="native"`` is the grid of the native size,
# and ``sizes`` names the only sizes the family has, each with its own options. The learned tables of the families
# of 2022-25 are resampled as timm runs other sizes (bicubic, antialiased), FlexiViT's as timm loads its weights.
FAMILIES: dict[str, dict[str, Any]] = {
    "DeiT": dict(normalization="imagenet", crop_pct=0.9),
    "DeiT3": dict(no_embed_class=True, layer_scale=1e-6, normalization="imagenet", crop_pct=0.9),
    "DINOv2": dict(layer_scale=1e-5, image_size=518, num_classes=0, normalization="imagenet", crop_pct=1.0),
    "CLIP": dict(pre_norm=True, patch_bias=False, ln_eps=1e-5, normalization="clip", crop_pct=1.0),
    "SigLIP": dict(class_token=False, pool="map", num_classes=0, normalization="google", crop_pct=1.0),
    # timm's vit_*_patch16_dinov3: [class] and 4 registers, RoPE on centred coordinates, no position table, no qkv
    # bias, patch-token mean under the final norm (timm's default pool; DINOv3 itself reads [class]).
    "DINOv3": dict(reg_tokens=4, layer_scale=1e-5, rope="axial", rope_grid="centered", rope_theta=100.0,
                   rope_half=True, pos_embed="none", qkv_bias=False, ln_eps=1e-5, pool="gap", image_size=256,
                   num_classes=0, normalization="imagenet", crop_pct=1.0,
                   sizes={"S": {}, "S+": {}, "B": {}, "L": {}, "H+": {}}),
    # timm's eva02_*_patch14_224 (the MIM towers): RoPE on a 16-cell reference grid beside the learned table,
    # q and v biases only, SwiGLU of 8/3 D with a LayerNorm inside for B and L, fc_norm after the patch mean.
    "EVA02": dict(mlp="swiglu", mlp_ratio=8 / 3, k_bias=False, rope="axial", rope_ref_grid=16, pool="gap",
                  fc_norm=True, pos_interp_antialias=True, num_classes=0, normalization="clip", crop_pct=0.9,
                  sizes={"Ti": {}, "S": {}, "B": dict(mlp_norm=True), "L": dict(mlp_norm=True)}),
    # timm's vit_pe_core_*: a norm before the blocks, no patch bias, RoPE from (column, row) + 1 on the native
    # grid, an 8-head attention pool over every token; the head is the CLIP projection (512 or 1024 wide).
    "PE-core": dict(pre_norm=True, patch_bias=False, rope="axial", rope_offset=1.0, rope_xy=True,
                    rope_ref_grid="native", pool="map", pool_heads=8, pool_prefix=True, ln_eps=1e-5,
                    pos_interp_antialias=True,
                    normalization="google", crop_pct=1.0,
                    sizes={"T": dict(image_size=384, num_classes=512), "S": dict(image_size=384, num_classes=512),
                           "B": dict(num_classes=1024), "L": dict(image_size=336, num_classes=1024)}),
    # SigLIP 2 at 224 (timm's vit_base_patch16_siglip_224.v2_webli): SigLIP's tower with the tanh GELU that
    # SigLIP 2 was trained with (timm's NaFlex definition and HF's config say so; timm's 224 one runs exact).
    "SigLIP2": dict(class_token=False, pool="map", gelu="tanh", pos_interp_antialias=True, num_classes=0,
                    normalization="google", crop_pct=1.0, sizes={"B": {}}),
    # timm's aimv2_*: RMSNorm everywhere (the patches too), SwiGLU of 2.75 D, no biases but the patch
    # projection's, the patch mean under the final norm.
    "AIMv2": dict(norm="rms", ln_eps=1e-5, patch_norm=True, mlp="swiglu", mlp_ratio=2.75, qkv_bias=False,
                  proj_bias=False, class_token=False, pool="gap", pos_interp_antialias=True, num_classes=0,
                  normalization="clip", crop_pct=1.0, sizes={"L": dict(num_heads=8)}),
    # timm's flexivit_*: 240 px, a position table without the [class] row, resized bilinear without antialias.
    "FlexiViT": dict(no_embed_class=True, image_size=240, pos_interp="bilinear", normalization="google",
                     crop_pct=0.95, sizes={"S": {}, "B": {}, "L": {}}),
    # Encoders of 2026. timm's vit_*_patch14_reg1_tipsv2: DINOv2 with one register and LayerScale, 448 px, taking
    # the [0, 1] pixels as they are.
    "TIPSv2": dict(reg_tokens=1, no_embed_class=True, layer_scale=1.0, image_size=448, pos_interp_antialias=True,
                   num_classes=0, normalization="unit", crop_pct=1.0, sizes={"B": {}, "L": {}, "So400m": {}, "g": {}}),
    # timm's vit_*_patch16_radio_v3/v4 (NVIDIA's C-RADIO): [class] then the other class tokens and registers (7 or
    # 9 in all), a table of the 512 px grid without prefix rows, resized bilinearly without antialias (corners
    # aligned for v3-B and v3-H) as timm loads it, no final norm; LayerScale in v3-B and v3-L; g's MLP is plain.
    "C-RADIOv3": dict(reg_tokens=7, no_embed_class=True, final_norm=False, image_size=512, pos_interp="bilinear",
                      num_classes=0, normalization="clip", crop_pct=1.0,
                      sizes={"B": dict(layer_scale=1e-5, pos_interp_align_corners=True), "L": dict(layer_scale=1e-5),
                             "H": dict(pos_interp_align_corners=True), "g": dict(mlp="gelu", mlp_ratio=4)}),
    "C-RADIOv4": dict(reg_tokens=9, no_embed_class=True, final_norm=False, image_size=512, pos_interp="bilinear",
                      num_classes=0, normalization="clip", crop_pct=1.0, sizes={"So400m": {}, "H": {}}),
}
# Gemma 4's vision encoder (timm's gemma4_vit_*_enc, transformers' Gemma4VisionModel; ``checkpoints.gemma4`` reads
# them with these options): [0, 1] pixels scaled inside, a learned table per axis, RMSNorm on q, k and (unscaled) v,
# logits unscaled, 2-D RoPE (theta 100, each axis on its own half of the head), four norms per block, GeGLU-tanh, no
# biases, soft tokens (3 x 3 cells, times sqrt(D)); the E2B/E4B tower clamps its dense layers, the 26B/31B one
# standardises its soft tokens.
GEMMA4: dict[str, Any] = dict(
    norm="rms", ln_eps=1e-6, scale_pixels=True, patch_bias=False, class_token=False, pos_embed="learned-axes",
    pos_axis_cells=10240, qkv_bias=False, proj_bias=False, qk_norm=True, v_norm=True, attn_scale=1.0, rope="axial",
    rope_theta=100.0, rope_xy=True, rope_half=True, rope_split=True, sandwich_norm=True, mlp="geglu", gelu="tanh",
    pool="soft", soft_pool=3, final_norm=False, num_classes=0)
FAMILIES["Gemma4"] = dict(GEMMA4, image_size=768, normalization="unit", crop_pct=1.0,
                          sizes={"167M": dict(clamp_linears=True), "570M": dict(soft_standardize=True)})
# timm's Qwen3 ViT (qwen3_vit_*_enc: the Qwen3-VL / Qwen3.5 vision towers; ``checkpoints.qwen`` reads them with these
# options): no prefix tokens, a 48 x 48 table resampled bilinearly with corners aligned plus axial RoPE (rows then
# columns, rotate-half), GELU-tanh, no final norm, the 2 x 2 patch merger's tokens.
QWEN3: dict[str, Any] = dict(class_token=False, pos_embed="learned", pos_interp="bilinear", pos_interp_antialias=False,
                             pos_interp_align_corners=True, rope="axial", rope_half=True, gelu="tanh", qkv_bias=True,
                             final_norm=False, num_classes=0)
FAMILIES["Qwen3ViT"] = dict(QWEN3, pos_grid=(48, 48), merge_size=2, pool="merge", image_size=768,
                            normalization="google", crop_pct=1.0, sizes={"88M": {}, "306M": {}, "416M": {}})
SUFFIXES: dict[str, dict[str, Any]] = {
    "distilled": dict(dist_token=True),  # DeiT's distillation token and head
    "reg4": dict(reg_tokens=4, no_embed_class=True),  # DINOv2 with registers
}
FAMILY_VARIANTS = (
    "DeiT-Ti/16", "DeiT-S/16", "DeiT-B/16", "DeiT-Ti/16-distilled", "DeiT-S/16-distilled", "DeiT-B/16-distilled",
    "DeiT3-S/16", "DeiT3-M/16", "DeiT3-B/16", "DeiT3-L/16", "DeiT3-H/14",
    "DINOv2-S/14", "DINOv2-B/14", "DINOv2-L/14", "DINOv2-g/14",
    "DINOv2-S/14-reg4", "DINOv2-B/14-reg4", "DINOv2-L/14-reg4", "DINOv2-g/14-reg4",
    "CLIP-B/32", "CLIP-B/16", "CLIP-L/14", "CLIP-H/14", "SigLIP-B/16", "SigLIP-So400m/14",
)
RECENT_VARIANTS = (
    "DINOv3-S/16", "DINOv3-S+/16", "DINOv3-B/16", "DINOv3-L/16", "DINOv3-H+/16",
    "EVA02-Ti/14", "EVA02-S/14", "EVA02-B/14", "EVA02-L/14",
    "PE-core-T/16", "PE-core-S/16", "PE-core-B/16", "PE-core-L/14",
    "SigLIP2-B/16", "AIMv2-L/14", "FlexiViT-S/16", "FlexiViT-B/16", "FlexiViT-L/16",
    "TIPSv2-B/14", "TIPSv2-L/14", "TIPSv2-So400m/14", "TIPSv2-g/14",
    "C-RADIOv3-B/16", "C-RADIOv3-L/16", "C-RADIOv3-H/16", "C-RADIOv3-g/16", "C-RADIOv4-So400m/16", "C-RADIOv4-H/16",
)
GEMMA4_VARIANTS = ("Gemma4-167M/16", "Gemma4-570M/16")
QWEN_VARIANTS = ("Qwen3ViT-88M/16", "Qwen3ViT-306M/16", "Qwen3ViT-416M/16")

_NAME = re.compile(r"^(?:(r\d*)\+)?vit-(ti|s|b|l|h)/(\d+)$", re.IGNORECASE)
_SIZE_BY_LOWER = {size.lower(): size for size in SIZES}
_ALL_SIZES = {**SIZES, **FAMILY_SIZES, **OWN_SIZES}
_FAMILY_NAME = re.compile(rf"^({'|'.join(map(re.escape, FAMILIES))})-({'|'.join(map(re.escape, _ALL_SIZES))})/(\d+)"
                          rf"(?:-({'|'.join(SUFFIXES)}))?$", re.IGNORECASE)
_CANONICAL = {key.lower(): key for key in [*FAMILIES, *_ALL_SIZES, *SUFFIXES]}


def list_models() -> list[str]:
    """The paper's named variants and hybrids, then the families (DeiT to SigLIP, then those of 2022-25, then Gemma
    4's vision encoders); any other ``ViT-<size>/<patch>`` pair is accepted too, and any
    ``<family>-<size>/<patch>[-<suffix>]`` of a size the family has."""
    return list(PAPER_VARIANTS + HYBRID_VARIANTS + FAMILY_VARIANTS + RECENT_VARIANTS + GEMMA4_VARIANTS
                + QWEN_VARIANTS)


def family_config(match: re.Match, overrides: dict[str, Any]) -> ViTConfig:
    """The configuration of ``<family>-<size>/<patch>[-<suffix>]``: the ViT of that size plus the options."""
    family, size, suffix = (_CANONICAL[part.lower()] if part else None for part in match.group(1, 2, 4))
    patch = int(match.group(3))
    options = {**FAMILIES[family], **SUFFIXES.get(suffix, {})}
    sizes = options.pop("sizes", dict.fromkeys([*SIZES, *FAMILY_SIZES], {}))
    if size not in sizes:
        raise ConfigError(f"unknown model {match.group(0)!r}: {family} comes in sizes {', '.join(sizes)}")
    depth, dim, mlp_dim, heads = _ALL_SIZES[size]
    options.update(sizes[size])
    inputs = dict(normalization=options.pop("normalization"), crop_pct=options.pop("crop_pct"))
    if "mlp_ratio" in options:
        mlp_dim = int(dim * options.pop("mlp_ratio"))
    native = options.pop("image_size", 224) // patch * patch
    if options.get("rope_ref_grid") == "native":
        options["rope_ref_grid"] = native // patch
    name = f"{family}-{size}/{patch}" + (f"-{suffix}" if suffix else "")
    base = {**dict(patch_size=patch, depth=depth, dim=dim, mlp_dim=mlp_dim, num_heads=heads, image_size=native),
            **options}
    base["provenance"] = Provenance(name=name, **inputs)
    if size in SWIGLU_SIZES:
        base.setdefault("mlp", "swiglu")  # unless the family's size says otherwise (C-RADIO's g)
    return ViTConfig(**{**base, **overrides})


def model_config(name: str, **overrides: Any) -> ViTConfig:
    """The configuration of a named variant (224 px, 1000 classes unless overridden; a family's own
    defaults, as timm defines them); an override that is no ViTConfig field is refused with the close ones."""
    check_keys(overrides, FIELDS[ViTConfig], SOURCE)
    family = _FAMILY_NAME.match(name.strip())
    if family:
        return family_config(family, overrides)
    match = _NAME.match(name.strip())
    if not match:
        close = difflib.get_close_matches(name, list_models(), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown model {name!r}: expected 'ViT-<size>/<patch>' with size in "
                         f"{'/'.join(SIZES)}, e.g. {', '.join(PAPER_VARIANTS[:3])}, or "
                         f"'<family>-<size>/<patch>' with family in {'/'.join(FAMILIES)}{hint}")
    resnet, size, patch = match.group(1), _SIZE_BY_LOWER[match.group(2).lower()], int(match.group(3))
    depth, dim, mlp_dim, heads = SIZES[size]
    canonical = f"ViT-{size}/{patch}"
    base = dict(patch_size=patch, depth=depth, dim=dim, mlp_dim=mlp_dim, num_heads=heads)
    if resnet:
        resnet = resnet.upper()
        if (resnet, patch) not in HYBRIDS:
            raise ConfigError(f"unknown hybrid {name.strip()!r}: expected one of {', '.join(HYBRID_VARIANTS)} "
                             "(any ViT size with " + ", ".join(f"{r}+.../{p}" for r, p in HYBRIDS) + ")")
        canonical = f"{resnet}+{canonical}"
        base["backbone"], base["patch_size"] = HYBRIDS[resnet, patch]
    base["provenance"] = Provenance(name=canonical)
    if "image_size" not in overrides and 224 % patch and not resnet:
        base["image_size"] = 224 // patch * patch  # e.g. ViT-H/14 keeps 224; patch 32 at 224 too
    return ViTConfig(**{**base, **overrides})


def create_model(name: str | ViTConfig, **overrides: Any) -> VisionTransformer:
    """Build a freshly initialised model from a variant name (or a config) and field overrides."""
    config = name.replace(**overrides) if isinstance(name, ViTConfig) else model_config(name, **overrides)
    return VisionTransformer(config)
