"""timm's ``VisionTransformer`` state dicts, hybrids (``patch_embed.backbone``) included.

timm's names are nearly vitkit's. What the weights cannot tell: the head count (taken from the paper's
table for its widths, else the ``num_heads`` override) and, for a model with a [class] token and no
``fc_norm``, whether it pooled the token or the patches (token unless ``pool='gap'`` is passed).
Numerics are timm's: exact GELU, LayerNorm eps 1e-6, and for hybrids StdConv (w-m)/sqrt(var+1e-8)
with GroupNorm eps 1e-5.

The families on timm's ``VisionTransformer`` (DeiT with its distillation token, DeiT-III, DINOv2 with or
without registers, CLIP, SigLIP, InternViT-300M) show themselves in the weights (``dist_token``, ``reg_token``,
``ls1.gamma``, ``norm_pre``, ``attn_pool.latent``, no ``norm`` after the last block...), except for numerics:
CLIP's LayerNorm eps 1e-5 and OpenAI's QuickGELU need the overrides ``ln_eps=1e-5``, ``gelu='quick'`` on a bare
state dict.

A timm hub directory (what ``hf-hub:timm/...`` downloads: ``config.json`` with ``architecture`` and
``pretrained_cfg`` beside the weights) tells the rest: ``global_pool``, ``model_args``, the input
``mean``/``std`` and ``crop_pct``, and, through the architecture's name, the numerics of its family.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from safetensors.torch import save

from ..atomic import atomic_file
from ..errors import CheckpointError, FormatError, abridged
from ..models.config import CROP_PCT, Provenance, ViTConfig, is_crop_pct
from ..models.vit import VisionTransformer
from .files import check_fields, hub_weights_file, read_weights
from .gemma4 import is_gemma4, is_gemma4_architecture, read_timm_gemma4_directory, write_timm_gemma4
from .qwen import is_qwen3, is_qwen3_architecture, read_timm_qwen3_directory, write_timm_qwen3
from .inference import infer_config, known_normalization, refuse_unsupported
from .names import Names, rename
from .timm_families import (family_of_architecture, is_timm_family, read_timm_hub_family, write_timm_family,
                            write_timm_state)
from .timm_naflex import naflex_radio

HUB_CONFIG = "config.json"
TIMM_DEFAULT_CROP_PCT = 0.875  # what timm evaluates with when a pretrained_cfg names no crop_pct

TIMM_NUMERICS = dict(gelu="exact", ln_eps=1e-6, pos_interp="bicubic", pos_interp_antialias=True,
                     std_conv="sqrt(var+eps)", std_conv_eps=1e-8, gn_eps=1e-5)

# Architectures whose numerics differ from timm's defaults: every CLIP tower has LayerNorm eps 1e-5 (and the
# QuickGELU ones OpenAI's activation); FlexiViT's weights are resized bilinear without antialias (patch
# kernel and position table, as timm loads them), and so are C-RADIO's (vit_*_radio_v3/v4: timm's loading path,
# corners aligned as each checkpoint's code aligns them, the table of the model's grid resized, not cropped:
# naflexvit_*_radio crops as C-RADIO does); these SigLIP towers use the tanh GELU (timm's own definitions).
_RADIO = dict(pos_interp="bilinear", pos_interp_antialias=False)  # C-RADIO, as timm loads it at another size
ARCHITECTURE_NUMERICS = (("_clip_quickgelu_", dict(ln_eps=1e-5, gelu="quick")), ("_clip_", dict(ln_eps=1e-5)),
                         ("flexivit", dict(pos_interp="bilinear", pos_interp_antialias=False)),
                         ("base_patch16_radio_v3", dict(_RADIO, pos_interp_align_corners=True)),
                         ("huge_patch16_radio_v3", dict(_RADIO, pos_interp_align_corners=True)),
                         ("_patch16_radio_v", _RADIO))
TANH_GELU_SIGLIPS = frozenset(
    f"vit_{name}" for name in ("base_patch32_siglip_256", "large_patch16_siglip_512", "so400m_patch16_siglip_256",
                               "so400m_patch16_siglip_384", "so400m_patch16_siglip_512",
                               "giantopt_patch16_siglip_256", "giantopt_patch16_siglip_384",
                               "base_patch32_siglip_gap_256", "large_patch16_siglip_gap_512",
                               "so400m_patch16_siglip_gap_256", "so400m_patch16_siglip_gap_384",
                               "so400m_patch16_siglip_gap_512", "giantopt_patch16_siglip_gap_256",
                               "giantopt_patch16_siglip_gap_384"))

NAMES = Names([
    ("pos_embed", "pos_embed.weight"),
    ("attn_pool.latent", "attn_pool.probe"),
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
    final_norm = "norm.weight" in state or "fc_norm.weight" in state  # timm's final_norm=False (InternViT) has none
    return infer_config(state, overrides, source, **numerics, final_norm=final_norm,
                        provenance=Provenance(format="timm", source=source))


def is_timm_config(config_json: dict[str, Any] | None) -> bool:
    """Whether a directory's parsed ``config.json`` is a timm hub config."""
    return config_json is not None and {"architecture", "pretrained_cfg"} <= config_json.keys()


def read_timm_directory(directory: Path, hub: dict[str, Any], overrides: dict[str, Any]
                        ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm hub directory whose ``config.json`` the caller has parsed into ``hub``."""
    weights = hub_weights_file(directory, "a timm")
    config, state = read_timm_hub_state(read_weights(weights), hub, overrides, weights, directory / HUB_CONFIG)
    return config.replace(provenance=config.provenance.replace(source=str(directory))), state


def read_timm_hub_state(state: dict[str, torch.Tensor], hub: dict[str, Any], overrides: dict[str, Any],
                        weights: Path, config_file: Path) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The timm model ``state`` (read from ``weights``) under the settings ``hub`` of a timm hub config (what
    ``config_file`` holds: ``architecture``, ``pretrained_cfg``, ``model_args``, ``global_pool``...)."""
    for key in ("pretrained_cfg", "model_args"):
        if not isinstance(hub.get(key, {}), dict):
            raise CheckpointError(f"{config_file}: {key}={abridged(hub[key])}; expected a JSON object")
    check_fields(hub.get("model_args", {}), {"num_heads": "count"}, config_file, within="model_args.")
    architecture = str(hub["architecture"])
    if is_gemma4_architecture(architecture):  # its own pooling (soft tokens) and layout
        return read_timm_gemma4_directory(state, hub, overrides, weights)
    if is_qwen3_architecture(architecture):  # its table, rope and merger are the architecture's
        return read_timm_qwen3_directory(state, hub, overrides, weights)
    pool = hub.get("global_pool", "token")
    if pool not in ("token", "avg", "map"):
        raise CheckpointError(f"{config_file}: global_pool={pool!r}; vitkit pools the [class] token "
                              f"('token'), the mean of the patches ('avg') or by attention ('map')")
    family = family_of_architecture(architecture)
    if family is not None:  # read by what the architecture's definition says, not by its keys
        config, state = read_timm_hub_family(state, hub, *family, overrides, weights)
    else:
        told = architecture_numerics(architecture)
        if pool == "avg":
            told["pool"] = "gap"
        if "num_heads" in hub.get("model_args", {}):
            told["num_heads"] = hub["model_args"]["num_heads"]
        refuse_unsupported(state, str(weights))  # bare state dicts are checked by vitkit.load, before their layout
        config, state = from_timm(state, {**told, **overrides}, str(weights))
    pretrained = hub["pretrained_cfg"]
    family = known_normalization(pretrained.get("mean"), pretrained.get("std"), config_file,
                                 config.in_chans, ("pretrained_cfg.mean", "pretrained_cfg.std"))
    provenance = config.provenance.replace(normalization=family, crop_pct=hub_crop_pct(pretrained, config_file),
                                           name=config.provenance.name or architecture)
    return config.replace(provenance=provenance), state


def hub_crop_pct(pretrained: dict[str, Any], path: Path) -> float:
    """The fraction timm centre-crops at evaluation. Its other crop modes ('squash' resizes both sides to
    size / crop_pct, 'border' pads) are not vitkit's geometry: read with a warning that says so."""
    crop_pct = pretrained.get("crop_pct", TIMM_DEFAULT_CROP_PCT)
    if not is_crop_pct(crop_pct):
        raise CheckpointError(f"{path}: pretrained_cfg.crop_pct={crop_pct!r}; expected {CROP_PCT}")
    mode = pretrained.get("crop_mode", "center")
    if mode != "center":
        warnings.warn(f"{path}: pretrained_cfg.crop_mode={mode!r}; vitkit evaluates with a centre crop of "
                      f"{crop_pct:g} (or, with --resize stretch, the whole image resized to the model's size)",
                      stacklevel=3)
    return float(crop_pct)


def architecture_numerics(architecture: str) -> dict[str, Any]:
    """The LayerNorm eps, GELU and resize that timm's definition of ``architecture`` uses, where not its
    defaults."""
    numerics = next((dict(told) for part, told in ARCHITECTURE_NUMERICS if part in architecture), {})
    if architecture.split(".")[0] in TANH_GELU_SIGLIPS:
        numerics["gelu"] = "tanh"
    return numerics


def write_timm(model: VisionTransformer, path: str | Path) -> Path:
    """Export as a timm ``VisionTransformer`` state dict (``.safetensors``), atomically. timm holds every
    family option; like any bare state dict it does not record numerics, so CLIP's ``ln_eps=1e-5`` and
    ``gelu='quick'``, or ``mlp='relu'`` (timm's ``act_layer='relu'``), are passed again when it is read (and to
    timm's constructor). The families on timm's Eva
    (rotary embeddings...) and AIMv2, and C-RADIO's cropped table (timm's NaFlexViT), are written in their layout,
    or as a hub directory naming the architecture."""
    config, path = model.config, Path(path)
    if is_gemma4(config):  # timm's Gemma 4 encoder or classifier
        return write_timm_gemma4(model, path)
    if is_qwen3(config):  # timm's Qwen3 ViT encoder or classifier
        return write_timm_qwen3(model, path)
    if config.merge_size or config.attn_window:  # Qwen2.5-VL's tower: no architecture of timm's holds it
        raise FormatError(f"cannot write {path}: timm's Qwen ViT is Qwen3's (LayerNorm, a learned table, no windows); "
                          f"it cannot hold this tower's " + ", ".join(reason for reason, bad in [
                              ("window attention", config.attn_window), ("RMSNorm", config.norm == "rms"),
                              (f"mlp={config.mlp!r}", config.mlp != "gelu"),
                              (f"pos_embed={config.pos_embed!r}", config.pos_embed != "learned"),
                              ("prefix tokens", config.num_prefix_tokens)] if bad))
    if is_timm_family(config):  # rotary embeddings, q/v-only biases, sub-LN, RMSNorm: timm's Eva or AIMv2
        return write_timm_family(model, path)
    if config.pos_interp_crop:  # C-RADIO's cropped table: timm's naflexvit_*_radio
        return write_timm_state(path, config, *naflex_radio(model, path), first_conv="embeds.proj")
    unsupported = [reason for reason, bad in [
        (f"pos_embed={config.pos_embed!r} (only 'learned' or 'none')", config.pos_embed not in ("learned", "none")),
        ("pre-logits layer (representation_size)", config.representation_size),
        ("hybrid backbone (vitkit writes plain ViTs to timm)", config.backbone is not None),
        ("patch_norm or proj_bias=False (only with AIMv2's RMSNorm)", config.patch_norm or not config.proj_bias),
        ("pool_heads or pool_mlp_dim", config.pool_heads is not None or config.pool_mlp_dim is not None),
        ("pool_prefix (its pools take the patches)", config.pool_prefix and config.num_prefix_tokens),
        ("a table on a grid of its own without C-RADIO's crop (pos_grid)", config.pos_grid is not None),
        ("a summary of several class tokens (summary_tokens)", config.summary_tokens is not None),
    ] if bad]
    if unsupported:
        raise FormatError(f"cannot write {path}: timm's VisionTransformer state dict has no "
                              f"{', '.join(unsupported)}")
    if path.suffix != ".safetensors":
        raise FormatError(f"cannot write {path}: timm state dicts are written as .safetensors")
    state = {NAMES.to_theirs(name): tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    with atomic_file(path, "wb") as handle:
        handle.write(save(state, metadata={"format": "pt"}))
    return path
