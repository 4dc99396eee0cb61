"""One configuration for every Vision Transformer variant.

Behaviour comes from these fields, never from subclasses, so a checkpoint is fully described by
``config.json`` plus its weights.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..declare import (Bool, Choice, FieldError, Float, Int, Invalid, Items, Maybe, Parsed, Text, check_fields,
                       check_keys, refuse, require, setting)
from ..errors import ConfigError, abridged, parse_json
from ..normalization import NORMALIZATION, normalization

# "map": multi-head attention pooling with a learned probe (SigLIP's head).
# "soft" (Gemma 4): the patches averaged over k x k cells of their grid, times sqrt(D): several tokens per image.
# "merge" (Qwen VL): the patch merger's tokens, one per k x k cell of patches: several tokens per image.
POOLINGS = ("token", "gap", "map", "soft", "merge")
# "learned-axes" (Gemma 4): a learned table per axis, looked up by the patch's column and row and summed.
POS_EMBEDS = ("learned", "learned-2d", "sincos-2d", "relative", "none", "learned-axes")
# "quick": x * sigmoid(1.702 x), the approximation OpenAI's CLIP was trained with.
GELUS = ("exact", "tanh", "quick")
# "swiglu": fc1 yields a gate and a value of mlp_dim each, SiLU(gate) * value goes into fc2 (DINOv2-g).
# "geglu": the same gate and value, GELU(gate) * value (Gemma 4, with the tanh GELU).
# "relu": fc1 -> ReLU -> fc2, not gated (TIPSv2's text tower).
MLPS = ("gelu", "swiglu", "geglu", "relu")
GATED_MLPS = ("swiglu", "geglu")  # fc1 yields a gate and a value
# "rms": RMSNorm, x / sqrt(mean(x^2) + eps) * weight, in place of every LayerNorm (AIMv2).
NORMS = ("layer", "rms")
# Rotary position embeddings on the queries and keys of the patch tokens: "axial", fixed frequencies per axis
# (EVA-02, Perception Encoder, RoPE-ViT, DINOv3); "mixed", learned frequencies per block and head (RoPE-ViT).
ROPES = ("none", "axial", "mixed")
# The patch coordinates RoPE turns: "index", the patch's row and column (+ rope_offset, rescaled to rope_ref_grid
# cells when set); "centered", patch centres normalised to [-1, 1] per axis, angles in turns (DINOv3).
ROPE_GRIDS = ("index", "centered")
MOST_MODULES = {"depth": 4096, "reg_tokens": 4096, "prompt_tokens": 4096}  # far beyond any published ViT (48 blocks, 16 registers)
# Dense heads (per-pixel outputs at the patch grid or finer, in place of the classifier): "linear", DINOv2's linear
# probe on the last block; "linear-ms", the same on the last four; "dpt", a DPT decoder over four blocks.
DENSE_HEADS = ("none", "linear", "linear-ms", "dpt")
# What a dense head predicts: class logits per pixel, or depth in metres (its outputs weigh bins of depth).
DENSE_OUTPUTS = ("classes", "depth")
POS_INTERPS = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")
# The options of the families built on the skeleton (DeiT, DeiT-III, DINOv2, CLIP, SigLIP) and their off values.
FAMILY_DEFAULTS: dict[str, Any] = dict(dist_token=False, reg_tokens=0, no_embed_class=False, pre_norm=False,
                                       patch_bias=True, layer_scale=None, qk_norm=False, mlp="gelu", norm="layer",
                                       patch_norm=False, k_bias=True, proj_bias=True, mlp_norm=False,
                                       attn_norm=False, rope="none", pool_heads=None, pool_mlp_dim=None,
                                       pool_prefix=False, final_norm=True, pos_interp_crop=False, pos_grid=None,
                                       summary_tokens=None,
                                       # Gemma 4's
                                       scale_pixels=False, sandwich_norm=False, v_norm=False, attn_scale=None,
                                       clamp_linears=False, rope_split=False, fc_norm_scale=True,
                                       # Qwen VL's
                                       merge_size=0, attn_window=0)
# Weight standardisation of the hybrid's convolutions: Google's (w - mean) / (std + eps), timm's
# (w - mean) / sqrt(var + eps).
STD_CONVS = ("std+eps", "sqrt(var+eps)")


def backbone_stride(backbone: tuple[int, ...] | None) -> int:
    """Downsampling of the hybrid's ResNet: 4 in the stem, then 2 in every stage after the first."""
    if backbone is None:
        return 1
    return 4 * 2 ** max(len(backbone) - 1, 0)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite int or float (not a bool, not NaN)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


CROP_FRACTION = Float(0, 1, low_open=True)  # the share of the resized image that evaluation centre-crops
CROP_PCT = CROP_FRACTION.expected  # what a crop fraction must be, for the messages of every check of one


def is_crop_pct(value: Any) -> bool:
    """Whether ``value`` is a crop fraction: the share of the resized image that evaluation centre-crops."""
    try:
        CROP_FRACTION.accept(value)
    except Invalid:
        return False
    return True


SIZE = "an int or a (height, width) pair of ints"


def pair(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An image or grid size as (height, width)."""
    if is_int(value):
        return (value, value)
    if isinstance(value, tuple | list) and len(value) == 2 and all(is_int(side) for side in value):
        return (value[0], value[1])
    raise ConfigError(f"image_size: expected {SIZE}, got {abridged(value)}")


def positive_pair(value: Any) -> tuple[int, int]:
    """``image_size`` as (height, width), each side >= 1."""
    size = pair(value)
    if min(size) < 1:
        raise Invalid(POSITIVE_SIZE)
    return size


POSITIVE_SIZE = f"{SIZE}, each >= 1"


@dataclass
class Provenance:
    """Where a checkpoint's weights come from and how its inputs are prepared; saved in ``config.json``
    beside the architecture, so that evaluation, prediction and export treat the weights as they were
    trained."""

    name: str | None = setting(None, Maybe(Text()), "the named variant, e.g. ViT-B/16")
    format: str | None = setting(None, Maybe(Text()), "the file format the weights were first read from (null: made "
                                 "by vitkit)")
    source: str | None = setting(None, Maybe(Text()), "that file, directory or hub id")
    normalization: str = setting("google", Choice(tuple(NORMALIZATION)), "input statistics, a family of "
                                 "vitkit.normalization")
    classes: tuple[str, ...] | None = setting(None, Maybe(Items(Text(), says="a list of strings")),
                                              "class names, one per output of the head")
    crop_pct: float = setting(1.0, CROP_FRACTION, "evaluation: resize the shorter side to size / "
                              "crop_pct, then centre-crop")

    def __post_init__(self) -> None:
        check_fields(self, "ViTConfig", "provenance")

    def replace(self, **changes: Any) -> "Provenance":
        """A copy with ``changes`` (the fields of a dataclass, checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Any) -> "Provenance":
        """The provenance that ``data`` (a config.json's ``provenance`` object) describes; unknown keys are refused."""
        if not isinstance(data, dict):
            raise refuse("ViTConfig", "provenance", "a JSON object", data)
        check_keys(data, FIELDS[cls], "ViTConfig", "provenance")
        return cls(**data)


@dataclass
class ViTConfig:
    """Hyper-parameters of a ViT (paper table 1 plus the options of its ablations), each declared with its kind
    and range (``vitkit.declare``); a bad value raises ``ConfigError`` of one shape:
    ``ViTConfig: depth: expected an int in [1, 4096], got 0`` (``config.json: ...`` when read from one)."""

    image_size: tuple[int, int] = setting((224, 224), Parsed(positive_pair, POSITIVE_SIZE), "input size, H or (H, W)")
    patch_size: int = setting(16, Int(1), "side of a square patch, in pixels (of the feature map for a hybrid)")
    in_chans: int = setting(3, Int(1), "input channels")
    num_classes: int = setting(1000, Int(0), "outputs of the head (0: none, the pooled features)")
    dim: int = setting(768, Int(1), "width D of every token")
    depth: int = setting(12, Int(1, MOST_MODULES["depth"]), "transformer blocks")
    num_heads: int = setting(12, Int(1), "attention heads")
    mlp_dim: int = setting(3072, Int(1), "hidden width of each block's MLP")
    qkv_bias: bool = setting(True, Bool(), "biases of the query, key and value projections")
    class_token: bool = setting(True, Bool(), "a learned [class] token before the patches")
    # Options of the families built on this skeleton, each off by default (DESIGN.md section 5).
    dist_token: bool = setting(False, Bool(), "DeiT: a distillation token after [class], its own head, both heads "
                               "averaged")
    reg_tokens: int = setting(0, Int(0, MOST_MODULES["reg_tokens"]), "register tokens after the [class] token "
                              "(DINOv2-reg), dropped at the output")
    no_embed_class: bool = setting(False, Bool(), "the position table covers the patches only; prefix tokens get "
                                   "none")
    pre_norm: bool = setting(False, Bool(), "a LayerNorm on the embedded tokens before the first block (CLIP)")
    patch_bias: bool = setting(True, Bool(), "bias of the patch projection (CLIP has none)")
    layer_scale: float | None = setting(None, Maybe(Float()), "LayerScale: residual branches scaled per channel, "
                                        "from this init")
    qk_norm: bool = setting(False, Bool(), "LayerNorm on each head's queries and keys")
    mlp: str = setting("gelu", Choice(MLPS), "the MLP's form")
    # Options of the families of 2023-25 (EVA-02, Perception Encoder, RoPE-ViT, DINOv3, AIMv2), off by default.
    norm: str = setting("layer", Choice(NORMS), "every norm a LayerNorm, or rms (AIMv2)")
    patch_norm: bool = setting(False, Bool(), "a norm on the patch embeddings, before the prefix tokens (AIMv2)")
    k_bias: bool = setting(True, Bool(), "with qkv_bias: false holds the keys' bias at zero (EVA, DINOv3 keep only "
                           "q and v biases)")
    proj_bias: bool = setting(True, Bool(), "biases of the attention output projection and of the MLP (AIMv2 has "
                              "none)")
    mlp_norm: bool = setting(False, Bool(), "sub-LN: a norm on the MLP's hidden activations before fc2 (EVA-02 B/L)")
    attn_norm: bool = setting(False, Bool(), "sub-LN: a norm on the attention heads' output before proj (EVA-02 "
                              "CLIP)")
    rope: str = setting("none", Choice(ROPES), "rotary position embeddings of the patch tokens")
    rope_grid: str = setting("index", Choice(ROPE_GRIDS), "the patch coordinates RoPE turns")
    rope_theta: float = setting(10000.0, Float(1, low_open=True), "frequencies theta^(-j / (head_dim / 4)), "
                                "j < head_dim / 4, per axis")
    rope_ref_grid: int | None = setting(None, Maybe(Int(1)), "index coordinates rescaled so that the grid spans "
                                        "this many cells (EVA)")
    rope_offset: float = setting(0.0, Float(-1e6), "added to every index coordinate (PE: 1)")
    rope_xy: bool = setting(False, Bool(), "the column (x) coordinate takes the first half of the frequencies, else "
                            "the row")
    rope_half: bool = setting(False, Bool(), "rotate the two halves of each head against each other, else "
                              "neighbouring pairs")
    pool_heads: int | None = setting(None, Maybe(Int(1)), "heads of the attention pool (pool='map'); null: "
                                     "num_heads (PE: 8)")
    pool_mlp_dim: int | None = setting(None, Maybe(Int(0)), "width of the attention pool's MLP; null: mlp_dim "
                                       "(PE-G: 4 D); 0: none (AIMv2)")
    pool_prefix: bool = setting(False, Bool(), "pooling (gap, map) takes the prefix tokens too, not the patches "
                                "alone (PE)")
    # Options of Gemma 4's vision encoder, off by default.
    scale_pixels: bool = setting(False, Bool(), "the model takes [0, 1] pixels and maps them to [-1, 1] itself, "
                                 "2 (x - 0.5), before the patch projection (Gemma 4)")
    sandwich_norm: bool = setting(False, Bool(), "a norm on each branch's output too, before its residual add "
                                  "(Gemma 4's four norms per block)")
    v_norm: bool = setting(False, Bool(), "a norm without a learned scale on each head's values (Gemma 4)")
    attn_scale: float | None = setting(None, Maybe(Float(0, low_open=True)), "the scale of the attention logits; "
                                       "null: 1 / sqrt(head width) (Gemma 4: 1)")
    clamp_linears: bool = setting(False, Bool(), "the blocks' dense layers clamp their inputs and outputs to bounds "
                                  "held with the weights (Gemma 4's E2B/E4B tower)")
    rope_split: bool = setting(False, Bool(), "with rope_half: each axis turns a half of the head of its own, "
                               "rotate-half within it (Gemma 4)")
    pos_axis_cells: int = setting(10240, Int(1), "cells of each axis's table with pos_embed='learned-axes' "
                                  "(Gemma 4: 10240): the largest grid side")
    soft_pool: int = setting(3, Int(1), "the side k of the k x k cells that pool='soft' averages")
    soft_standardize: bool = setting(False, Bool(), "pool='soft': (tokens - bias) * scale after the pool, both "
                                     "held with the weights (Gemma 4's 26B/31B tower)")
    fc_norm_scale: bool = setting(True, Bool(), "a learned scale in the norm after pooling (timm's Gemma 4 "
                                  "classifier: none)")
    # Options of the Qwen VL vision towers, off by default.
    merge_size: int = setting(0, Int(0), "Qwen VL's patch merger after the blocks: each k x k cell of patch tokens, "
                              "normed, concatenated row by row and put through Linear, GELU, Linear (0: none); pooling "
                              "reads its tokens")
    merge_dim: int = setting(0, Int(0), "the width of the patch merger's output (its last Linear); 0: no last Linear, "
                             "the k^2 D of the cells")
    attn_window: int = setting(0, Int(0), "window attention: blocks not in global_blocks attend within squares of this "
                               "many patches a side, from the grid's top left (Qwen2.5-VL: 8); 0: none")
    global_blocks: tuple[int, ...] | None = setting(None, Maybe(Items(Int(0), says="a list of block indices")),
                                                    "with attn_window: the blocks that attend over the whole image "
                                                    "(Qwen2.5-VL's fullatt_block_indexes)")
    # Options of parameter-efficient fine-tuning, off by default: what they add is trained, the rest stays frozen.
    prompt_tokens: int = setting(0, Int(0, MOST_MODULES["prompt_tokens"]), "VPT: learned prompt tokens after the "
                                 "prefix tokens, dropped at the output (no position embedding)")
    prompt_deep: bool = setting(False, Bool(), "VPT-deep: fresh prompts before every block (else at the input only)")
    adapter_dim: int = setting(0, Int(0), "AdaptFormer: a bottleneck MLP of this width beside each block's MLP "
                               "(0: none)")
    adapter_scale: float = setting(0.1, Float(), "AdaptFormer: the factor of the bottleneck MLP's output")
    pool: str = setting("token", Choice(POOLINGS), "what the head reads: the [class] token, the mean of the "
                        "patches, or an attention pool")
    fc_norm: bool = setting(False, Bool(), "LayerNorm after pooling instead of on every token (timm's fc_norm)")
    final_norm: bool = setting(True, Bool(), "a norm after the last block (on every token, or after pooling with "
                               "fc_norm); false: none, as InternViT")
    pos_embed: str = setting("learned", Choice(POS_EMBEDS), "position embeddings")
    # Dense prediction (segmentation, depth): a head on the patch tokens in place of pooling and the classifier.
    dense_head: str = setting("none", Choice(DENSE_HEADS), "a per-pixel head on the patch tokens instead of the "
                              "classifier (none: classify the image)")
    dense_output: str = setting("classes", Choice(DENSE_OUTPUTS), "what the dense head's num_classes outputs are: "
                                "class logits, or weights of depth bins spaced evenly in [depth_min, depth_max]")
    depth_min: float = setting(1e-3, Float(0), "metres: the first depth bin")
    depth_max: float = setting(10.0, Float(0, low_open=True), "metres: the last depth bin")
    # How a learned table is resampled to another grid; each checkpoint family has its own: Google
    # bilinear with corners aligned (scipy's linear zoom), HF bicubic, timm bicubic with antialias,
    # torchvision bicubic with corners aligned.
    pos_interp: str = setting("bicubic", Choice(POS_INTERPS), "how a learned table is resampled to another grid")
    pos_interp_antialias: bool = setting(False, Bool(), "antialias when resampling the table")
    pos_interp_align_corners: bool = setting(False, Bool(), "align corners when resampling the table")
    # C-RADIO: a table kept on its own grid, resampled to a square of the input grid's longer side and cropped to
    # it; a summary of several class tokens.
    pos_interp_crop: bool = setting(False, Bool(), "resample the table to a square of the grid's longer side, then "
                                    "keep its top-left rows x cols (C-RADIO's cropped position embedding)")
    pos_grid: tuple[int, int] | None = setting(None, Maybe(Items(Int(1), 2, says="[rows, cols], each >= 1")),
                                               "rows and columns of the learned table when not those of image_size "
                                               "(C-RADIO: 128 x 128 for up to 2048 px); null: image_size's grid")
    summary_tokens: tuple[int, ...] | None = setting(None, Maybe(Items(Int(0), says="a list of prefix token "
                                                                                    "indices")),
                                                     "pool='token' reads these prefix tokens, concatenated (C-RADIO's "
                                                     "summary of its class tokens); null: [class] alone")
    representation_size: int | None = setting(None, Maybe(Int(1)), "pre-logits Linear + tanh of pre-training")
    dropout: float = setting(0.0, Float(0, 1, high_open=True), "dropout rate")
    attn_dropout: float = setting(0.0, Float(0, 1, high_open=True), "dropout rate of the attention weights")
    drop_path: float = setting(0.0, Float(0, 1, high_open=True), "stochastic depth rate")
    ln_eps: float = setting(1e-6, Float(0, low_open=True), "epsilon of every norm")
    gelu: str = setting("exact", Choice(GELUS), "GELU's form")
    # Hybrid (section 3.2): a BiT ResNet whose feature map is cut into patch_size patches. ``backbone``
    # lists the blocks per stage, e.g. (3, 4, 9); () is the stem alone; None means plain pixel patches.
    backbone: tuple[int, ...] | None = setting(None, Maybe(Items(Int(1), says="a list of positive block counts")),
                                               "blocks per stage of the hybrid's ResNet; null: pixel patches")
    backbone_width: int = setting(64, Int(1), "channels of the stem; stage i ends with 4 * width * 2**i")
    std_conv: str = setting("std+eps", Choice(STD_CONVS), "weight standardisation of the hybrid's convolutions")
    std_conv_eps: float = setting(1e-5, Float(0, low_open=True), "epsilon of the weight standardisation")
    gn_groups: int = setting(32, Int(1), "GroupNorm groups of the hybrid")
    gn_eps: float = setting(1e-6, Float(0, low_open=True), "epsilon of the hybrid's GroupNorms")
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        if isinstance(self.provenance, dict):
            self.provenance = Provenance.from_dict(self.provenance)
        require(isinstance(self.provenance, Provenance), SOURCE, "provenance", "a Provenance or a JSON object",
                self.provenance)
        check_fields(self, SOURCE)
        self._check_rules()

    def _check_rules(self) -> None:
        """The rules between fields; each refusal names the field to change."""
        classes = self.provenance.classes
        require(classes is None or len(classes) == self.num_classes, SOURCE, "provenance.classes",
                f"{self.num_classes} names, one per class (num_classes)", classes)
        require(self.dim % self.num_heads == 0, SOURCE, "dim", f"a multiple of num_heads={self.num_heads}", self.dim)
        require(self.pool != "token" or self.class_token, SOURCE, "pool", "'gap' or 'map' with class_token=False",
                self.pool)
        require(self.pool != "soft" or not (self.learned_prefix_tokens or self.representation_size or self.fc_norm
                                            or self.num_classes and self.dense_head == "none"), SOURCE, "pool",
                "'soft' only without prefix tokens, a classifier, representation_size or fc_norm (its output is "
                "several tokens per image; pool='gap' puts one vector under a head)", self.pool)
        require(self.pool != "merge" or (self.merge_size and not (self.representation_size or self.fc_norm or
                                                                   self.num_classes and self.dense_head == "none")),
                SOURCE, "pool", "'merge' only with a merge_size, without a classifier, representation_size or fc_norm "
                "(its output is several tokens per image)", self.pool)
        require(not (self.merge_size or self.attn_window) or not self.num_prefix_tokens, SOURCE, "merge_size",
                "0 with prefix tokens, as attn_window (the merger and the windows take patches alone)",
                self.merge_size or self.attn_window)
        require(self.global_blocks is None or (self.attn_window and all(i < self.depth for i in self.global_blocks)),
                SOURCE, "global_blocks", f"null without attn_window, else indices of the {self.depth} blocks",
                self.global_blocks)
        require(not self.rope_split or self.rope_half, SOURCE, "rope_split", "false unless rope_half=True", True)
        require(self.rope == "none" or self.head_dim % 4 == 0, SOURCE, "num_heads", f"a count that leaves a head "
                f"width (dim={self.dim} / num_heads) divisible by 4 for rope={self.rope!r}", self.num_heads)
        require(self.pool_heads is None or self.dim % self.pool_heads == 0, SOURCE, "pool_heads",
                f"a divisor of dim={self.dim}", self.pool_heads)
        require(not self.dist_token or (self.class_token and self.pool == "token" and not self.fc_norm
                                        and not (self.representation_size and self.num_classes)), SOURCE,
                "dist_token", "false unless class_token=True, pool='token', fc_norm=False, and no "
                "representation_size beside a head", self.dist_token)
        require(self.dense_head == "none" or self.num_classes > 0, SOURCE, "num_classes",
                f"at least 1 with dense_head={self.dense_head!r} (its outputs per pixel)", self.num_classes)
        require(self.dense_head == "none" or not self.representation_size, SOURCE, "representation_size",
                "null with a dense_head (nothing is pooled)", self.representation_size)
        require(self.dense_head != "none" or self.dense_output == "classes", SOURCE, "dense_output",
                "'classes' unless a dense_head is set", self.dense_output)
        require(self.dense_output != "depth" or self.depth_min < self.depth_max, SOURCE, "depth_max",
                f"more than depth_min={self.depth_min}", self.depth_max)
        if self.backbone is not None:
            require(self.backbone_width % self.gn_groups == 0, SOURCE, "backbone_width",
                    f"a multiple of gn_groups={self.gn_groups}", self.backbone_width)
        stride = self.effective_patch_size
        require(all(side % stride == 0 for side in self.image_size), SOURCE, "image_size",
                f"sides that are multiples of patch_size={self.patch_size}" if self.backbone is None
                else f"sides that are multiples of the hybrid's token stride {stride} (backbone stride x patch_size)",
                self.image_size)
        require(self.pos_grid is None or self.pos_embed == "learned", SOURCE, "pos_grid",
                "null unless pos_embed='learned'", self.pos_grid)
        summary = self.summary_tokens
        require(summary is None or (summary and self.pool == "token" and not self.dist_token and not self.fc_norm
                                    and not self.representation_size
                                    and max(summary) < self.learned_prefix_tokens), SOURCE, "summary_tokens",
                f"null, or indices of the {self.learned_prefix_tokens} prefix tokens with pool='token' and no "
                f"dist_token, fc_norm or representation_size", summary)
        if self.pos_embed in ("learned-2d", "sincos-2d"):
            require(self.dim % 4 == 0, SOURCE, "dim", f"a multiple of 4 with pos_embed={self.pos_embed!r}", self.dim)

    def family_options(self) -> dict[str, Any]:
        """The family options this config turns on (fields of FAMILY_DEFAULTS away from their off value)."""
        return {name: getattr(self, name) for name, off in FAMILY_DEFAULTS.items() if getattr(self, name) != off}

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens the blocks see before the patches: [class], distillation, registers and VPT's prompts, in that
        order."""
        return self.learned_prefix_tokens + self.prompt_tokens

    @property
    def learned_prefix_tokens(self) -> int:
        """The prefix tokens of the architecture ([class], distillation, registers), before any prompts."""
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def pos_prefix_tokens(self) -> int:
        """Prefix tokens with a row of their own in the position table (prompts have none)."""
        return 0 if self.no_embed_class else self.learned_prefix_tokens

    @property
    def effective_patch_size(self) -> int:
        """The side, in pixels, of the square each token stands for."""
        return self.patch_size * backbone_stride(self.backbone)

    @property
    def grid_size(self) -> tuple[int, int]:
        """(rows, cols) of the patch grid at ``image_size``: H / P x W / P (a hybrid's P is its backbone's stride)."""
        stride = self.effective_patch_size
        return (self.image_size[0] // stride, self.image_size[1] // stride)

    @property
    def token_dim(self) -> int:
        """The width of the tokens pooling reads: D, or the patch merger's output width (Qwen VL)."""
        return (self.merge_dim or self.merge_size ** 2 * self.dim) if self.merge_size else self.dim

    @property
    def pooled_dim(self) -> int:
        """The width of the pooled representation before any pre-logits layer: D (the merger's width), or D per
        summary token."""
        return self.token_dim * len(self.summary_tokens or (0,))

    @property
    def head_dim(self) -> int:
        """The width D / heads of one attention head."""
        return self.dim // self.num_heads

    @property
    def input_statistics(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The (mean, std) the inputs are normalised with, one per channel: the provenance's family for the
        model's channels (what evaluation applies and what the ONNX and HF exports record)."""
        return normalization(self.provenance.normalization, self.in_chans)

    def replace(self, **changes: Any) -> "ViTConfig":
        """A copy with ``changes``; a new ``num_classes`` is a new head, so the old head's class names go
        unless names for the new one come in the same call."""
        check_keys(changes, FIELDS[ViTConfig], SOURCE)
        provenance = changes.get("provenance", self.provenance)
        if (changes.get("num_classes", self.num_classes) != self.num_classes and isinstance(provenance, Provenance)
                and provenance.classes is not None and provenance.classes == self.provenance.classes):
            changes["provenance"] = provenance.replace(classes=None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON types (tuples as lists), as ``config.json`` holds it."""
        data = dataclasses.asdict(self)
        data["image_size"] = list(self.image_size)
        for name in ("backbone", "pos_grid", "summary_tokens", "global_blocks"):
            if getattr(self, name) is not None:
                data[name] = list(getattr(self, name))
        if self.provenance.classes is not None:
            data["provenance"]["classes"] = list(self.provenance.classes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config.json") -> "ViTConfig":
        """The config that ``data`` (read from ``source``, named in errors and warnings) describes."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object of ViTConfig fields, got {abridged(data)}")
        data = {**data}
        if "extra" in data and "provenance" not in data:  # written when provenance was an untyped dict
            data["provenance"] = data.pop("extra")
        try:
            check_keys(data, FIELDS[cls], source)
            data["provenance"] = _without_stale_classes(data.get("provenance", {}), data.get("num_classes", 1000),
                                                        source)
            return cls(**data)
        except FieldError as error:
            raise error.at(source) from None

    def to_json(self) -> str:
        """The config as indented JSON with sorted keys: the text of a checkpoint's ``config.json``."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "config.json") -> "ViTConfig":
        """The config that JSON ``text`` (read from ``source``, named in errors and warnings) describes."""
        return cls.from_dict(parse_json(text), source)


def _without_stale_classes(provenance: Any, num_classes: Any, source: str) -> Any:
    """A saved provenance without class names that do not match the head: versions before ``replace``
    dropped them kept an earlier head's names beside a new head's weights. The weights are sound (their
    shapes are checked on loading); only the names are stale, so they go, with a warning."""
    if not (isinstance(provenance, dict) and isinstance(provenance.get("classes"), list) and is_int(num_classes)
            and len(provenance["classes"]) != num_classes):
        return provenance
    warnings.warn(f"{source}: {len(provenance['classes'])} class names in provenance.classes for "
                  f"num_classes={num_classes}; they belonged to an earlier head and are dropped", stacklevel=3)
    return {**provenance, "classes": None}


SOURCE = "ViTConfig"  # what a config built in Python is called in its errors
FIELDS = {cls: [item.name for item in dataclasses.fields(cls)] for cls in (Provenance, ViTConfig)}
