"""What a checkpoint's weights and files say about its model: the config read off vitkit-named weights
(shapes, layout, grid) with the caller's overrides, the input normalisation a file's statistics name,
the families vitkit refuses to read, and, for the writers, the options a format must be able to hold."""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import ViTConfig, backbone_stride, is_real, pair
from ..models.registry import FAMILY_SIZES, SIZES
from ..normalization import NORMALIZATION, normalization_family

# Overrides that change the shape of weights: the file is read as it is, then the model is operated on.
SURGERY = ("patch_size", "image_size", "num_classes")


def known_normalization(mean: Any, std: Any, source: Any, channels: int, names: tuple[str, str] = ("mean", "std")
                        ) -> str:
    """The family of a file's input statistics for a model of ``channels`` channels (a number, or one per
    channel; Google's when the file gives none, and, with a warning, when they match no family); ``names``
    are the file's keys for them, for the messages."""
    if mean is None and std is None:
        return "google"
    given = []
    for name, value in zip(names, (mean, std)):
        values = [value] if is_real(value) else value
        if not (isinstance(values, list | tuple) and len(values) in (1, channels) and all(map(is_real, values))):
            raise CheckpointError(f"{source}: {name}={value!r}; expected a finite number, or one per channel of "
                                  f"the model ({channels})")
        given.append(list(values) * (channels // len(values)))
    family = normalization_family(*given)
    if family is None:
        warnings.warn(f"{source}: {names[0]}={mean}, {names[1]}={std} match no known normalisation "
                      f"{sorted(NORMALIZATION)}; evaluating with Google's [-1, 1]", stacklevel=2)
    return family or "google"


# Families vitkit does not read, and the keys that give them away: such a checkpoint is refused rather than
# loaded with those weights ignored.
UNSUPPORTED_FAMILIES = (
    ("EVA / EVA-02 as BAAI saves it (rotary tables in the weights)", re.compile(r"(^|\.)(freqs_cos|freqs_sin)$")),
    ("BEiT / relative position bias tables", re.compile(r"relative_position_bias_table|rel_pos_bias")),
    ("Swin (windowed attention)", re.compile(r"^layers\.\d+\.blocks\.\d+\.attn\.")),
)


def refuse_unsupported(state: dict[str, Any], source: str) -> None:
    """Refuse a state dict of a family vitkit cannot compute exactly, naming the family and the keys."""
    for family, pattern in UNSUPPORTED_FAMILIES:
        keys = [key for key in state if pattern.search(key)]
        if keys:
            raise CheckpointError(f"{source}: a checkpoint of the {family} family, which vitkit does not read; "
                                  f"these keys give it away: " + ", ".join(sorted(keys)[:6])
                                  + (" ..." if len(keys) > 6 else ""))


def count_indices(state: dict[str, Any], prefix: str) -> int:
    """How many ``prefix{n}.`` entries there are (e.g. blocks), checking they run 0..n-1."""
    found = {int(m.group(1)) for key in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", key))}
    return len(found) if found == set(range(len(found))) else -1


def standard_heads(dim: int, overrides: dict[str, Any], source: str) -> int:
    """The head count the weights cannot tell (packed qkv): the override, or the paper's for its widths."""
    if "num_heads" in overrides:
        return int(overrides["num_heads"])
    by_width = {width: heads for _, width, _, heads in [*SIZES.values(), *FAMILY_SIZES.values()]}
    if dim in by_width:
        return by_width[dim]
    raise CheckpointError(f"{source}: the head count of a packed qkv matrix of width {dim} cannot be read "
                          f"from the weights; pass the override num_heads=...")


def infer_config(state: dict[str, torch.Tensor], overrides: dict[str, Any], source: str,
                 **settings: Any) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The config that vitkit-named ``state`` implies (shapes, layout, grid); ``settings`` give what the
    format knows beyond the weights (numerics, head count, pooling). A position table without rows for
    the prefix tokens (big_vision, timm's ``no_embed_class``) sets ``no_embed_class``: told by the format
    or the override, else read off the table's length (square without prefix rows; with registers, timm's
    layout, also when both readings are square)."""
    def need(key: str) -> torch.Tensor:
        if key not in state:
            raise CheckpointError(f"{source}: missing {key!r}, which every ViT has; found {sorted(state)[:8]} ...")
        return state[key]

    proj = need("patch_embed.proj.weight")
    fc1, fc2 = need("blocks.0.mlp.fc1.weight"), need("blocks.0.mlp.fc2.weight")
    dim, patch = proj.shape[0], proj.shape[-1]
    swiglu = fc1.shape[0] == 2 * fc2.shape[-1]  # fc1 yields a gate and a value
    config: dict[str, Any] = dict(dim=dim, patch_size=patch, in_chans=proj.shape[1],
                                  depth=count_indices(state, "blocks."), mlp="swiglu" if swiglu else "gelu",
                                  mlp_dim=fc2.shape[-1] if swiglu else fc1.shape[0],
                                  qkv_bias="blocks.0.attn.qkv.bias" in state,
                                  class_token="cls_token" in state, fc_norm="fc_norm.weight" in state,
                                  dist_token="dist_token" in state,
                                  reg_tokens=state["reg_token"].shape[1] if "reg_token" in state else 0,
                                  pre_norm="norm_pre.weight" in state, patch_bias="patch_embed.proj.bias" in state,
                                  qk_norm="blocks.0.attn.q_norm.weight" in state,
                                  num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0)
    if "blocks.0.ls1.gamma" in state:  # the init a trained gamma came from is not recorded; DINOv2's
        config["layer_scale"] = 1e-5
    if "pre_logits.0.weight" in state:
        config["representation_size"] = state["pre_logits.0.weight"].shape[0]
    stem = "patch_embed.backbone.stem.conv.weight"
    if stem in state:
        stages = count_indices(state, "patch_embed.backbone.stages.")
        config.update(in_chans=state[stem].shape[1], backbone_width=state[stem].shape[0],
                      backbone=tuple(count_indices(state, f"patch_embed.backbone.stages.{s}.")
                                     for s in range(stages)))
    if "attn_pool.probe" in state:
        config["pool"] = "map"
        pool_width = state["attn_pool.mlp.fc1.weight"].shape[0] if "attn_pool.mlp.fc1.weight" in state else 0
        if pool_width != config["mlp_dim"]:  # PE-G: the pool's MLP is 4 D, the blocks' narrower; AIMv2's has none
            config["pool_mlp_dim"] = pool_width
    else:
        config["pool"] = "gap" if config["fc_norm"] or not config["class_token"] else "token"
    config.update(settings)
    if "num_heads" not in config:
        config["num_heads"] = standard_heads(dim, overrides, source)

    if "pos_embed.weight" in state:
        table = state["pos_embed.weight"]
        if table.ndim == 2:
            table = table.unsqueeze(0)
        prefix, rows = int(config["class_token"]) + int(config["dist_token"]) + config["reg_tokens"], table.shape[1]
        without_prefix_rows = overrides.get("no_embed_class", config.get("no_embed_class"))
        if without_prefix_rows is None:  # a square table; with registers, timm's never has prefix rows
            without_prefix_rows = bool(prefix) and _is_square(rows) and (
                config["reg_tokens"] > 0 or not _is_square(rows - prefix))
        config["no_embed_class"] = bool(without_prefix_rows)
        tokens = rows if without_prefix_rows else rows - prefix
        state = {**state, "pos_embed.weight": table}
        config["image_size"] = _native_size(tokens, config, overrides, source)
    else:
        config["pos_embed"] = "none"
        config["image_size"] = overrides.get("image_size", config.get("image_size", 224))  # the format's, if told
    try:
        return ViTConfig(**{**config, **kept_overrides(overrides)}), state
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{source}: the weights describe an invalid model ({error})") from error


def options_in_use(config: ViTConfig) -> list[str]:
    """The family options ``config`` turns on, as ``field=value``, for the refusals of writers whose format
    lacks them all (``no_embed_class`` aside: see :func:`with_prefix_positions`)."""
    used = [f"{name}={value!r}" for name, value in config.family_options().items() if name != "no_embed_class"]
    return used + [f"{name}={value!r}" for name, value in (("pool", "map"), ("gelu", "quick"))
                   if getattr(config, name) == value]


def kept_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides that win over what the file says (those of SURGERY change weights, after loading)."""
    return {k: v for k, v in overrides.items() if k not in SURGERY}


def described_config(fields: dict[str, Any], overrides: dict[str, Any], provenance: Any, source: Any) -> ViTConfig:
    """The config a file's ``fields`` describe, with its ``provenance`` and the overrides that win over the file
    (``kept_overrides``); one the fields cannot make is a CheckpointError naming ``source``."""
    try:
        return ViTConfig(**{**fields, "provenance": provenance, **kept_overrides(overrides)})
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{source}: describes an invalid model ({error})") from error


def _is_square(count: int) -> bool:
    return count >= 0 and math.isqrt(count) ** 2 == count


def _native_size(tokens: int, config: dict[str, Any], overrides: dict[str, Any], source: str) -> tuple[int, int]:
    stride = config["patch_size"] * backbone_stride(config.get("backbone"))
    if _is_square(tokens):
        side = math.isqrt(tokens)
        return (side * stride, side * stride)
    if "image_size" in overrides:  # a non-square native grid can only come from the caller
        height, width = pair(overrides["image_size"])
        if (height // stride) * (width // stride) == tokens:
            return (height, width)
    raise CheckpointError(f"{source}: the position table has {tokens} patch positions, not a square grid; "
                          f"pass the native size as the override image_size=(height, width)")
