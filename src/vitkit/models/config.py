"""One configuration for every Vision Transformer variant.

Behaviour comes from these fields, never from subclasses, so a checkpoint is fully described by
``config.json`` plus its weights.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

POOLINGS = ("token", "gap")
POS_EMBEDS = ("learned", "learned-2d", "sincos-2d", "relative", "none")
GELUS = ("exact", "tanh")
# Weight standardisation of the hybrid's convolutions: Google's (w - mean) / (std + eps), timm's
# (w - mean) / sqrt(var + eps).
STD_CONVS = ("std+eps", "sqrt(var+eps)")


def backbone_stride(backbone: tuple[int, ...] | None) -> int:
    """Downsampling of the hybrid's ResNet: 4 in the stem, then 2 in every stage after the first."""
    if backbone is None:
        return 1
    return 4 * 2 ** max(len(backbone) - 1, 0)


def pair(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An image or grid size as (height, width)."""
    if isinstance(value, int):
        return (value, value)
    height, width = value
    return (int(height), int(width))


def check_keys(cls: type, data: dict[str, Any], what: str) -> None:
    """Refuse keys that are not fields of dataclass ``cls``, naming them and the expected ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} keys {unknown}; expected a subset of {sorted(known)}")


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
    extra: dict[str, Any] = field(default_factory=dict)  # provenance (name, source format)

    def __post_init__(self) -> None:
        self.image_size = pair(self.image_size)
        if self.backbone is not None:
            self.backbone = tuple(int(blocks) for blocks in self.backbone)
        self._check()

    def _check(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"invalid ViTConfig: {message}")

        need(self.pool in POOLINGS, f"pool={self.pool!r}, expected one of {POOLINGS}")
        need(self.pos_embed in POS_EMBEDS, f"pos_embed={self.pos_embed!r}, expected one of {POS_EMBEDS}")
        need(self.gelu in GELUS, f"gelu={self.gelu!r}, expected one of {GELUS}")
        need(self.dim % self.num_heads == 0, f"dim={self.dim} is not divisible by num_heads={self.num_heads}")
        need(self.pool != "token" or self.class_token, "pool='token' needs class_token=True")
        need(self.patch_size > 0, f"patch_size={self.patch_size} must be positive")
        need(self.num_classes >= 0, f"num_classes={self.num_classes} must be >= 0")
        if self.backbone is not None:
            need(all(blocks > 0 for blocks in self.backbone), f"backbone={self.backbone} needs positive block counts")
            need(self.std_conv in STD_CONVS, f"std_conv={self.std_conv!r}, expected one of {STD_CONVS}")
            need(self.backbone_width % self.gn_groups == 0,
                 f"backbone_width={self.backbone_width} is not divisible by gn_groups={self.gn_groups}")
        stride = self.effective_patch_size
        for side in self.image_size:
            need(side % stride == 0, f"image_size={self.image_size} is not a multiple of "
                 + (f"patch_size={self.patch_size}" if self.backbone is None
                    else f"the hybrid's token stride {stride} (backbone stride x patch_size)"))
        if self.pos_embed in ("learned-2d", "sincos-2d"):
            need(self.dim % 4 == 0, f"pos_embed={self.pos_embed!r} needs dim divisible by 4, got {self.dim}")

    @property
    def effective_patch_size(self) -> int:
        """The side, in pixels, of the square each token stands for."""
        return self.patch_size * backbone_stride(self.backbone)

    @property
    def grid_size(self) -> tuple[int, int]:
        stride = self.effective_patch_size
        return (self.image_size[0] // stride, self.image_size[1] // stride)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def replace(self, **changes: Any) -> "ViTConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["image_size"] = list(self.image_size)
        if self.backbone is not None:
            data["backbone"] = list(self.backbone)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ViTConfig":
        check_keys(cls, data, "ViTConfig")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ViTConfig":
        return cls.from_dict(json.loads(text))
