"""open_clip checkpoints of ViT image towers, as open_clip saves them: a whole CLIP model's state dict
(``visual.*`` beside the text tower, which is left out with a warning), or the ``visual`` tower alone.

The tower is CLIP's (pre-norm ``ln_pre``, no patch bias, the [class] token pooled after ``ln_post``) with
``torch.nn.MultiheadAttention`` (whose packed ``in_proj`` is vitkit's ``qkv``), optional LayerScale
(``ls_1``/``ls_2``), and the bias-free ``proj`` as a head with a zero bias. What the weights cannot tell:
the head count (the paper's for its widths, else ``num_heads=...``) and the activation: OpenAI's weights and
open_clip's ``-quickgelu`` models need ``gelu='quick'``. LayerNorm eps is open_clip's 1e-5; position tables
resample bicubically with antialias, as open_clip's ``resize_pos_embed`` does.

A hub directory (what open_clip's ``push_to_hf_hub`` writes: ``open_clip_config.json`` beside
``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``) tells the head count, QuickGELU and the
input statistics. Its image tower may instead be a timm model (``vision_cfg.timm_model_name``: the SigLIP,
SigLIP 2 and PE-core configs), held under ``visual.trunk.``: read as timm's own checkpoint of that architecture,
pooled as ``timm_pool`` says, with the trunk's head (``timm_proj`` null), none (``"none"``) or open_clip's linear
projection (``"linear"``, ``visual.head.proj``) as the head. Other towers (attention pooling in the adapter, an MLP
projection, a ResNet...) are refused by field.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, abridged
from ..models.config import Provenance, ViTConfig
from .files import check_fields, find_weights_file, hub_weights_file, read_json_object, read_weights
from .inference import infer_config, known_normalization
from .names import Names, clip_token_and_head, rename, without_text_tower
from .timm import read_timm_hub_state

HUB_CONFIG = "open_clip_config.json"
HUB_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# vision_cfg fields that make a tower other than CLIP's ViT, with the values vitkit computes.
PLAIN_TOWER = dict(timm_model_name=None, attentional_pool=False, pool_type="tok", final_ln_after_pool=False,
                   no_ln_pre=False, pos_embed_type="learnable", qk_norm=False, block_type=None)

RGB = 3  # open_clip's towers have no channel setting: conv1 takes 3
# open_clip's TimmModel: timm_pool -> the trunk's global_pool; timm_proj -> the head vitkit reads (None: the trunk's
# own classifier sized to embed_dim; "none": no head; "linear": open_clip's projection after the trunk's pooling).
TIMM_POOLS = ("map", "avg", "token")
TIMM_PROJS = (None, "", "none", "linear")
TIMM_DEFAULTS = dict(timm_pool="avg", timm_proj="linear", timm_proj_bias=False)  # CLIPVisionCfg's

OPEN_CLIP_NUMERICS = dict(ln_eps=1e-5, gelu="exact", pos_interp="bicubic", pos_interp_antialias=True)

_BLOCK = "transformer.resblocks.{i}."
NAMES = Names([
    ("class_embedding", "cls_token"),
    ("positional_embedding", "pos_embed.weight"),
    ("conv1.weight", "patch_embed.proj.weight"),
    ("ln_pre.{rest}", "norm_pre.{rest}"),
    ("ln_post.{rest}", "norm.{rest}"),
    ("proj", "head.weight"),
    *[(_BLOCK + theirs, "blocks.{i}." + ours) for theirs, ours in [
        ("ln_1.{rest}", "norm1.{rest}"), ("ln_2.{rest}", "norm2.{rest}"),
        ("attn.in_proj_weight", "attn.qkv.weight"), ("attn.in_proj_bias", "attn.qkv.bias"),
        ("attn.out_proj.{rest}", "attn.proj.{rest}"), ("ls_1.gamma", "ls1.gamma"), ("ls_2.gamma", "ls2.gamma"),
        ("mlp.c_fc.{rest}", "mlp.fc1.{rest}"), ("mlp.c_proj.{rest}", "mlp.fc2.{rest}"),
    ]],
])


def is_open_clip(state: dict[str, torch.Tensor]) -> bool:
    """A whole open_clip model (``visual.conv1``) or its image tower alone."""
    return "visual.conv1.weight" in state or {"conv1.weight", "class_embedding"} <= set(state)


def from_open_clip(state: dict[str, torch.Tensor], overrides: dict[str, Any],
                   source: str) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    if "visual.conv1.weight" in state:
        text = [key for key in state if not key.startswith("visual.")]
        state = {key.removeprefix("visual."): value
                 for key, value in without_text_tower(state, text, "open_clip", source).items()}
    state = rename(state, NAMES, source)
    if "head.weight" in state:  # x @ proj: a (width, out) matrix
        state["head.weight"] = state["head.weight"].t().contiguous()
    return infer_config(clip_token_and_head(state), overrides, source, **OPEN_CLIP_NUMERICS,
                        provenance=Provenance(format="open_clip", source=source, normalization="clip"))


def is_open_clip_directory(path: Path) -> bool:
    return (path / HUB_CONFIG).exists() and find_weights_file(path, HUB_WEIGHTS) is not None


def read_open_clip_directory(directory: Path, overrides: dict[str, Any]) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A hub directory; its small config is checked whole before the weights, which may be gigabytes, are read."""
    path = directory / HUB_CONFIG
    hub = read_json_object(path)
    model = (hub or {}).get("model_cfg")
    if not isinstance(model, dict) or not isinstance(model.get("vision_cfg"), dict):
        raise CheckpointError(f"{path}: expected a JSON object with model_cfg.vision_cfg")
    vision = model["vision_cfg"]
    preprocess = hub.get("preprocess_cfg", {})
    if not isinstance(preprocess, dict):
        raise CheckpointError(f"{path}: preprocess_cfg={abridged(preprocess)}; expected a JSON object")
    family = known_normalization(preprocess.get("mean"), preprocess.get("std"), path, RGB,
                                 ("preprocess_cfg.mean", "preprocess_cfg.std"))
    resize = preprocess.get("resize_mode", "shortest")
    if resize != "shortest":  # open_clip's SigLIP configs 'squash': the whole image stretched to the model's size
        warnings.warn(f"{path}: preprocess_cfg.resize_mode={abridged(resize)}; vitkit prepares images with a centre "
                      f"crop of the shorter side resized, or with --resize stretch (resize='stretch') the whole "
                      f"image resized to the model's size, as open_clip's 'squash'", stacklevel=3)
    if vision.get("timm_model_name"):
        config, state = read_timm_tower(directory, model, preprocess, overrides)
        return config.replace(provenance=config.provenance.replace(source=str(directory), format="open_clip",
                                                                   normalization=family, crop_pct=1.0)), state
    check_fields(vision, {"width": "count", "head_width": "count"}, path, within="model_cfg.vision_cfg.")
    other = [f"vision_cfg.{key}={abridged(vision[key])}" for key, plain in PLAIN_TOWER.items()
             if vision.get(key, plain) != plain]
    if other:
        raise CheckpointError(f"{path}: {', '.join(other)}: not the CLIP ViT tower vitkit reads")
    told = {"num_heads": vision.get("width", 768) // vision.get("head_width", 64)}
    if model.get("quick_gelu"):
        told["gelu"] = "quick"
    weights = hub_weights_file(directory, "an open_clip", HUB_WEIGHTS)
    config, state = from_open_clip(read_weights(weights), {**told, **overrides}, str(weights))
    return config.replace(provenance=config.provenance.replace(source=str(directory), normalization=family)), state


def read_timm_tower(directory: Path, model: dict[str, Any], preprocess: dict[str, Any], overrides: dict[str, Any]
                    ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The timm image tower of an open_clip hub directory whose ``model_cfg`` is ``model``: the trunk's weights
    under the timm settings open_clip's ``TimmModel`` creates it with."""
    path = directory / HUB_CONFIG
    vision = {**TIMM_DEFAULTS, **model["vision_cfg"]}
    check_fields(vision, {"timm_model_name": "text", "image_size": "size"}, path, within="model_cfg.vision_cfg.")
    pool, proj = vision["timm_pool"], vision["timm_proj"]
    if pool not in TIMM_POOLS or proj not in TIMM_PROJS:
        raise CheckpointError(f"{path}: vision_cfg.timm_pool={abridged(pool)}, timm_proj={abridged(proj)}: vitkit "
                              f"reads a timm tower pooled by one of {TIMM_POOLS} with a projection of {TIMM_PROJS}")
    weights = hub_weights_file(directory, "an open_clip", HUB_WEIGHTS)
    whole = read_weights(weights)
    if not any(key.startswith("visual.trunk.") for key in whole):
        raise CheckpointError(f"{weights}: no visual.trunk.* weights; {path} names the timm tower "
                              f"{vision['timm_model_name']!r}")
    text = [key for key in whole if not key.startswith("visual.")]
    state = {}
    for key, value in without_text_tower(whole, text, "open_clip", weights).items():
        if key.startswith("visual.trunk."):
            state[key.removeprefix("visual.trunk.")] = value
        elif key.startswith("visual.head.proj.") and proj == "linear":
            state["head." + key.removeprefix("visual.head.proj.")] = value
        else:
            raise CheckpointError(f"{weights}: {key} is not part of the timm tower {path} describes")
    if proj == "linear":
        if "head.weight" not in state:
            raise CheckpointError(f"{weights}: no visual.head.proj.weight; {path} says timm_proj='linear'")
        if "head.bias" not in state:  # a bias-free projection
            state["head.bias"] = torch.zeros(state["head.weight"].shape[0], dtype=state["head.weight"].dtype)
    size = vision.get("image_size", 224)  # the size open_clip prepares images at, which its timm trunk must take
    hub = dict(architecture=vision["timm_model_name"], global_pool=pool,
               pretrained_cfg=dict(mean=preprocess.get("mean"), std=preprocess.get("std"), crop_pct=1.0,
                                   input_size=[RGB, *(size if isinstance(size, list) else [size, size])]))
    return read_timm_hub_state(state, hub, overrides, weights, path)
