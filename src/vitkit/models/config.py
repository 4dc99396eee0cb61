"""One configuration for every Vision Transformer variant.

Behaviour comes from these fields, never from subclasses, so a checkpoint is fully described by
``config.json`` plus its weights.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, abridged, parse_json
from ..normalization import NORMALIZATION, normalization

# "map": multi-head attention pooling with a learned probe (SigLIP's head).
POOLINGS = ("token", "gap", "map")
POS_EMBEDS = ("learned", "learned-2d", "sincos-2d", "relative", "none")
# "quick": x * sigmoid(1.702 x), the approximation OpenAI's CLIP was trained with.
GELUS = ("exact", "tanh", "quick")
# "swiglu": fc1 yields a gate and a value of mlp_dim each, SiLU(gate) * value goes into fc2 (DINOv2-g).
MLPS = ("gelu", "swiglu")
# "rms": RMSNorm, x / sqrt(mean(x^2) + eps) * weight, in place of every LayerNorm (AIMv2).
NORMS = ("layer", "rms")
# Rotary position embeddings on the queries and keys of the patch tokens: "axial", fixed frequencies per axis
# (EVA-02, Perception Encoder, RoPE-ViT, DINOv3); "mixed", learned frequencies per block and head (RoPE-ViT).
ROPES = ("none", "axial", "mixed")
# The patch coordinates RoPE turns: "index", the patch's row and column (+ rope_offset, rescaled to rope_ref_grid
# cells when set); "centered", patch centres normalised to [-1, 1] per axis, angles in turns (DINOv3).
ROPE_GRIDS = ("index", "centered")
MOST_MODULES = {"depth": 4096, "reg_tokens": 4096}  # far beyond any published ViT (48 blocks, 16 registers)
POS_INTERPS = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")
# The options of the families built on the skeleton (DeiT, DeiT-III, DINOv2, CLIP, SigLIP) and their off values.
FAMILY_DEFAULTS: dict[str, Any] = dict(dist_token=False, reg_tokens=0, no_embed_class=False, pre_norm=False,
                                       patch_bias=True, layer_scale=None, qk_norm=False, mlp="gelu", norm="layer",
                                       patch_norm=False, k_bias=True, proj_bias=True, mlp_norm=False,
                                       attn_norm=False, rope="none", pool_heads=None, pool_mlp_dim=None,
                                       pool_prefix=False)
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


CROP_PCT = "a number in (0, 1]"  # what a crop fraction must be, for the messages of every check of one


def is_crop_pct(value: Any) -> bool:
    """Whether ``value`` is a crop fraction: the share of the resized image that evaluation centre-crops."""
    return is_real(value) and 0 < value <= 1


def pair(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An image or grid size as (height, width)."""
    if is_int(value):
        return (value, value)
    if isinstance(value, tuple | list) and len(value) == 2 and all(is_int(side) for side in value):
        return (value[0], value[1])
    raise ConfigError(f"invalid ViTConfig: image_size={value!r}, expected an int or a (height, width) pair of ints")


def check_keys(cls: type, data: dict[str, Any], what: str) -> None:
    """Refuse keys that are not fields of dataclass ``cls``, naming them, the fields close to each
    (``dpeth``: depth) and the expected ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        close = {key: difflib.get_close_matches(key, known, n=2) for key in unknown}
        hints = "".join(f"; {key}: did you mean {' or '.join(near)}?" for key, near in close.items() if near)
        raise ConfigError(f"unknown {what} keys {unknown}{hints}; expected a subset of {sorted(known)}")


@dataclass
class Provenance:
    """Where a checkpoint's weights come from and how its inputs are prepared; saved in ``config.json``
    beside the architecture, so that evaluation, prediction and export treat the weights as they were
    trained."""

    name: str | None = None  # the named variant, e.g. "ViT-B/16"
    format: str | None = None  # the file format the weights were first read from (None: made by vitkit)
    source: str | None = None  # that file, directory or hub id
    normalization: str = "google"  # input statistics, a family of vitkit.normalization
    classes: tuple[str, ...] | None = None  # class names, one per output of the head
    crop_pct: float = 1.0  # evaluation: resize the shorter side to size / crop_pct, then centre-crop

    def __post_init__(self) -> None:
        if isinstance(self.classes, list):
            self.classes = tuple(self.classes)
        for name in ("name", "format", "source"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"invalid provenance: {name}={value!r}, expected a string or null")
        if not (isinstance(self.normalization, str) and self.normalization in NORMALIZATION):
            raise ConfigError(f"invalid provenance: normalization={self.normalization!r}, expected one of "
                              f"{list(NORMALIZATION)}")
        if self.classes is not None and not (isinstance(self.classes, tuple)
                                             and all(isinstance(c, str) for c in self.classes)):
            raise ConfigError(f"invalid provenance: classes={self.classes!r}, expected a list of strings or null")
        if not is_crop_pct(self.crop_pct):
            raise ConfigError(f"invalid provenance: crop_pct={self.crop_pct!r}, expected {CROP_PCT}")

    def replace(self, **changes: Any) -> "Provenance":
        """A copy with ``changes`` (the fields of a dataclass, checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Any) -> "Provenance":
        """The provenance that ``data`` (a config.json's ``provenance`` object) describes; unknown keys are refused."""
        check_keys(cls, data, "provenance")
        return cls(**data)


@dataclass
class ViTConfig:
    """Hyper-parameters of a ViT (paper table 1 plus the options of its ablations)."""

    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    qkv_bias: bool = True
    class_token: bool = True
    # Options of the families built on this skeleton, each off by default (DESIGN.md section 5).
    dist_token: bool = False  # DeiT: a distillation token after [class], its own head, both heads averaged
    reg_tokens: int = 0  # register tokens after the [class] token (DINOv2-reg), dropped at the output
    no_embed_class: bool = False  # the position table covers the patches only; prefix tokens get none
    pre_norm: bool = False  # a LayerNorm on the embedded tokens before the first block (CLIP)
    patch_bias: bool = True  # bias of the patch projection (CLIP has none)
    layer_scale: float | None = None  # LayerScale: residual branches scaled per channel, from this init
    qk_norm: bool = False  # LayerNorm on each head's queries and keys
    mlp: str = "gelu"
    # Options of the families of 2023-25 (EVA-02, Perception Encoder, RoPE-ViT, DINOv3, AIMv2), off by default.
    norm: str = "layer"  # every norm a LayerNorm, or "rms" (AIMv2)
    patch_norm: bool = False  # a norm on the patch embeddings, before the prefix tokens (AIMv2)
    k_bias: bool = True  # with qkv_bias: False holds the keys' bias at zero (EVA, DINOv3 keep only q and v biases)
    proj_bias: bool = True  # biases of the attention output projection and of the MLP (AIMv2 has none)
    mlp_norm: bool = False  # sub-LN: a norm on the MLP's hidden activations before fc2 (EVA-02 B/L)
    attn_norm: bool = False  # sub-LN: a norm on the attention heads' output before proj (EVA-02 CLIP)
    rope: str = "none"
    rope_grid: str = "index"
    rope_theta: float = 10000.0  # frequencies theta^(-j / (head_dim / 4)), j < head_dim / 4, per axis
    rope_ref_grid: int | None = None  # index coordinates rescaled so that the grid spans this many cells (EVA)
    rope_offset: float = 0.0  # added to every index coordinate (PE: 1)
    rope_xy: bool = False  # the column (x) coordinate takes the first half of the frequencies, else the row
    rope_half: bool = False  # rotate the two halves of each head against each other, else neighbouring pairs
    pool_heads: int | None = None  # heads of the attention pool (pool='map'); None: num_heads (PE: 8)
    pool_mlp_dim: int | None = None  # width of the attention pool's MLP; None: mlp_dim (PE-G: 4 D); 0: none (AIMv2)
    pool_prefix: bool = False  # pooling ('gap', 'map') takes the prefix tokens too, not the patches alone (PE)
    pool: str = "token"
    fc_norm: bool = False  # LayerNorm after pooling instead of on every token (timm's fc_norm)
    pos_embed: str = "learned"
    # How a learned table is resampled to another grid; each checkpoint family has its own: Google
    # bilinear with corners aligned (scipy's linear zoom), HF bicubic, timm bicubic with antialias,
    # torchvision bicubic with corners aligned.
    pos_interp: str = "bicubic"
    pos_interp_antialias: bool = False
    pos_interp_align_corners: bool = False
    representation_size: int | None = None  # pre-logits Linear + tanh of pre-training
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    ln_eps: float = 1e-6
    gelu: str = "exact"
    # Hybrid (section 3.2): a BiT ResNet whose feature map is cut into patch_size patches. ``backbone``
    # lists the blocks per stage, e.g. (3, 4, 9); () is the stem alone; None means plain pixel patches.
    backbone: tuple[int, ...] | None = None
    backbone_width: int = 64  # channels of the stem; stage i ends with 4 * width * 2**i
    std_conv: str = "std+eps"
    std_conv_eps: float = 1e-5
    gn_groups: int = 32
    gn_eps: float = 1e-6
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        self.image_size = pair(self.image_size)
        if isinstance(self.backbone, list | tuple):
            self.backbone = tuple(self.backbone)
        if isinstance(self.provenance, dict):
            self.provenance = Provenance.from_dict(self.provenance)
        self._check()

    def _check(self) -> None:
        """Every field's type and range, then the rules between fields; a ConfigError names the field."""
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(f"invalid ViTConfig: {message}")

        def count(name: str, low: int) -> None:
            value = getattr(self, name)
            need(is_int(value) and value >= low, f"{name}={value!r}, expected an int >= {low}")
            need(value < 2**63, f"{name}={value!r}, expected a 64-bit int (what torch sizes take)")
            high = MOST_MODULES.get(name)
            need(high is None or value <= high, f"{name}={value!r}, expected at most {high} (each is a module built "
                                                f"before any weight is read)")

        def real(name: str, low: float, high: float | None = None) -> None:
            value = getattr(self, name)
            ok = is_real(value) and value >= low and (high is None or value < high)
            need(ok, f"{name}={value!r}, expected a finite number in [{low}, {high if high is not None else 'inf'})")

        def one_of(name: str, choices: tuple[str, ...]) -> None:
            need(getattr(self, name) in choices, f"{name}={getattr(self, name)!r}, expected one of {choices}")

        for name in ("patch_size", "in_chans", "dim", "depth", "num_heads", "mlp_dim", "backbone_width", "gn_groups"):
            count(name, 1)
        for name in ("num_classes", "reg_tokens"):
            count(name, 0)
        for name in ("qkv_bias", "class_token", "fc_norm", "pos_interp_antialias", "pos_interp_align_corners",
                     "dist_token", "no_embed_class", "pre_norm", "patch_bias", "qk_norm", "patch_norm", "k_bias",
                     "proj_bias", "mlp_norm", "attn_norm", "rope_xy", "rope_half", "pool_prefix"):
            need(isinstance(getattr(self, name), bool), f"{name}={getattr(self, name)!r}, expected true or false")
        for name in ("dropout", "attn_dropout", "drop_path"):
            real(name, 0.0, 1.0)
        for name in ("ln_eps", "std_conv_eps", "gn_eps"):
            real(name, 0.0)
            need(getattr(self, name) > 0, f"{name}={getattr(self, name)!r}, expected a positive number")
        need(self.layer_scale is None or is_real(self.layer_scale),
             f"layer_scale={self.layer_scale!r}, expected null or a finite number")
        for name, choices in (("pool", POOLINGS), ("pos_embed", POS_EMBEDS), ("gelu", GELUS), ("mlp", MLPS),
                              ("pos_interp", POS_INTERPS), ("std_conv", STD_CONVS), ("norm", NORMS),
                              ("rope", ROPES), ("rope_grid", ROPE_GRIDS)):
            one_of(name, choices)
        real("rope_offset", -1e6)
        real("rope_theta", 0.0)
        need(self.rope_theta > 1, f"rope_theta={self.rope_theta!r}, expected a number > 1")
        for name, low in (("rope_ref_grid", 1), ("pool_heads", 1), ("pool_mlp_dim", 0)):
            value = getattr(self, name)
            need(value is None or (is_int(value) and value >= low), f"{name}={value!r}, expected null or an int >= {low}")
        size = self.representation_size
        need(size is None or (is_int(size) and size >= 1),
             f"representation_size={size!r}, expected null or an int >= 1")
        need(self.backbone is None or (isinstance(self.backbone, tuple)
                                       and all(is_int(blocks) and blocks > 0 for blocks in self.backbone)),
             f"backbone={self.backbone!r}, expected null or a list of positive block counts")
        need(isinstance(self.provenance, Provenance),
             f"provenance={self.provenance!r}, expected a Provenance or a JSON object")
        classes = self.provenance.classes
        need(classes is None or len(classes) == self.num_classes,
             f"{len(classes or ())} class names in provenance for num_classes={self.num_classes}")

        need(self.dim % self.num_heads == 0, f"dim={self.dim} is not divisible by num_heads={self.num_heads}")
        need(self.pool != "token" or self.class_token, "pool='token' needs class_token=True")
        need(self.rope == "none" or self.head_dim % 4 == 0,
             f"rope={self.rope!r} needs a head width (dim / num_heads) divisible by 4, got {self.head_dim}")
        need(self.pool_heads is None or self.dim % self.pool_heads == 0,
             f"dim={self.dim} is not divisible by pool_heads={self.pool_heads}")
        need(not self.dist_token or (self.class_token and self.pool == "token" and not self.fc_norm
                                     and not (self.representation_size and self.num_classes)),
             "dist_token=True needs class_token=True, pool='token', fc_norm=False, and no representation_size "
             "beside a head")
        if self.backbone is not None:
            need(self.backbone_width % self.gn_groups == 0,
                 f"backbone_width={self.backbone_width} is not divisible by gn_groups={self.gn_groups}")
        stride = self.effective_patch_size
        need(min(self.image_size) > 0, f"image_size={self.image_size}, expected positive sides")
        for side in self.image_size:
            need(side % stride == 0, f"image_size={self.image_size} is not a multiple of "
                 + (f"patch_size={self.patch_size}" if self.backbone is None
                    else f"the hybrid's token stride {stride} (backbone stride x patch_size)"))
        if self.pos_embed in ("learned-2d", "sincos-2d"):
            need(self.dim % 4 == 0, f"pos_embed={self.pos_embed!r} needs dim divisible by 4, got {self.dim}")

    def family_options(self) -> dict[str, Any]:
        """The family options this config turns on (fields of FAMILY_DEFAULTS away from their off value)."""
        return {name: getattr(self, name) for name, off in FAMILY_DEFAULTS.items() if getattr(self, name) != off}

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: [class], distillation, registers, in that order."""
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    @property
    def pos_prefix_tokens(self) -> int:
        """Prefix tokens with a row of their own in the position table."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

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
        check_keys(ViTConfig, changes, "ViTConfig")
        provenance = changes.get("provenance", self.provenance)
        if (changes.get("num_classes", self.num_classes) != self.num_classes and isinstance(provenance, Provenance)
                and provenance.classes is not None and provenance.classes == self.provenance.classes):
            changes["provenance"] = provenance.replace(classes=None)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON types (tuples as lists), as ``config.json`` holds it."""
        data = dataclasses.asdict(self)
        data["image_size"] = list(self.image_size)
        if self.backbone is not None:
            data["backbone"] = list(self.backbone)
        if self.provenance.classes is not None:
            data["provenance"]["classes"] = list(self.provenance.classes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ViTConfig":
        """The config that ``data`` (read from ``source``, named in warnings) describes."""
        if not isinstance(data, dict):
            raise ConfigError(f"invalid ViTConfig: {abridged(data)}, expected a JSON object")
        data = {**data}
        if "extra" in data and "provenance" not in data:  # written when provenance was an untyped dict
            data["provenance"] = data.pop("extra")
        check_keys(cls, data, "ViTConfig")
        data["provenance"] = _without_stale_classes(data.get("provenance", {}), data.get("num_classes", 1000),
                                                    source)
        return cls(**data)

    def to_json(self) -> str:
        """The config as indented JSON with sorted keys: the text of a checkpoint's ``config.json``."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "config") -> "ViTConfig":
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

