"""Readers of the text towers beside the image towers vitkit reads: HF transformers' ``CLIPModel``,
``MetaClip2Model``, ``SiglipModel``, ``Siglip2Model`` and ``Tipsv2Model`` directories, and open_clip hub
directories (``open_clip_config.json`` + weights: CLIP, and the SigLIP, SigLIP 2, PE-core and MetaCLIP 2 configs,
whose text towers are open_clip's own ``TextTransformer`` under the settings of ``text_cfg``).

Each gives the tower's :class:`TextConfig`, its weights under :class:`TextTransformer`'s names, the stored
``logit_scale`` (the log of the scale, as both libraries keep it) and SigLIP's ``logit_bias`` (None for CLIP).
Widths, depth, vocabulary and context length come from the weights' shapes; the head count, activation, LayerNorm
eps and pooling rule from the config, with each family's defaults where the config leaves them out.

TIPSv2 differs: its text tower (weights in the layout of Google's release, open_clip's names under
``text_encoder.``) has fixed sinusoidal positions, so its context length is the config's
``max_position_embeddings``; it averages the states of the text's tokens (the pad token's positions left out) and
has no projection; its logits are the cosine divided by a ``temperature``, whose stored log scale is therefore
-log(temperature), taken from the weights where they hold it and otherwise from ``temperature_init_value`` (the
published checkpoints store it in the config alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoints.files import check_fields, hub_weights_file, read_weights
from ..checkpoints.hf import CONFIG_FILE, GELUS
from ..checkpoints.names import Names, fuse_qkv, rename
from ..checkpoints.open_clip import HUB_CONFIG, HUB_WEIGHTS
from ..checkpoints.tipsv2 import TEMPERATURE, TEXT_PREFIX, TEXT_TOWER
from ..errors import CheckpointError, abridged
from .model import TextConfig

# model_type -> HF's text defaults: heads, hidden_act, layer_norm_eps, and where the tower's projection is.
HF_TEXT = {
    "clip": dict(num_attention_heads=8, hidden_act="quick_gelu", layer_norm_eps=1e-5, eos_token_id=49407),
    "metaclip_2": dict(num_attention_heads=8, hidden_act="quick_gelu", layer_norm_eps=1e-5, eos_token_id=49407),
    "siglip": dict(num_attention_heads=12, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
    "siglip2": dict(num_attention_heads=12, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
}

CAUSAL = ("clip", "metaclip_2")  # the HF families whose text tower attends causally and pools the end token

_LAYER = "text_model.encoder.layers.{i}."
HF_NAMES = Names([
    ("text_model.embeddings.token_embedding.weight", "token_embed.weight"),
    ("text_model.embeddings.position_embedding.weight", "pos_embed"),
    ("text_model.final_layer_norm.{rest}", "norm.{rest}"),
    ("text_projection.weight", "proj.weight"),  # CLIP: bias-free
    ("text_model.head.{rest}", "proj.{rest}"),  # SigLIP: a linear head with bias
    *[(_LAYER + theirs + ".{rest}", "blocks.{i}." + ours + ".{rest}") for theirs, ours in [
        ("layer_norm1", "norm1"), ("layer_norm2", "norm2"), ("self_attn.q_proj", "attn.q"),
        ("self_attn.k_proj", "attn.k"), ("self_attn.v_proj", "attn.v"), ("self_attn.out_proj", "attn.proj"),
        ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2"),
    ]],
])

_BLOCK = "transformer.resblocks.{i}."
OPEN_CLIP_NAMES = Names([
    ("token_embedding.weight", "token_embed.weight"),
    ("positional_embedding", "pos_embed"),
    ("ln_final.{rest}", "norm.{rest}"),
    ("text_projection", "proj.weight"),  # a (width, embed) matrix: x @ proj
    ("text_projection.{rest}", "proj.{rest}"),  # proj_bias: an nn.Linear
    *[(_BLOCK + theirs, "blocks.{i}." + ours) for theirs, ours in [
        ("ln_1.{rest}", "norm1.{rest}"), ("ln_2.{rest}", "norm2.{rest}"),
        ("attn.in_proj_weight", "attn.qkv.weight"), ("attn.in_proj_bias", "attn.qkv.bias"),
        ("attn.out_proj.{rest}", "attn.proj.{rest}"), ("ls_1.gamma", "ls1.gamma"), ("ls_2.gamma", "ls2.gamma"),
        ("mlp.c_fc.{rest}", "mlp.fc1.{rest}"), ("mlp.c_proj.{rest}", "mlp.fc2.{rest}"),
    ]],
])
# open_clip text_cfg fields that make a tower other than the one TextTransformer computes, with the values it does.
PLAIN_TEXT = dict(hf_model_name=None, embed_cls=False, final_ln_after_pool=False, proj_type="linear", qk_norm=False,
                  block_type=None, scaled_cosine_attn=False, scale_heads=False, scale_attn_inner=False,
                  scale_attn=False, scale_fc=False, use_pad_mask=False)
OPEN_CLIP_POOLS = {"argmax": "argmax", "eos": "eos", "last": "last"}
APPROXIMATE_GELUS = {"none": "exact", "tanh": "tanh"}  # text_cfg.act_kwargs.approximate -> TextConfig.gelu
# open_clip's HFTokenizer options vitkit follows: the cleaning of the text before the HF tokenizer.
HF_TOKENIZER_OPTIONS = {"clean": ("whitespace", "lower", "canonicalize"), "strip_sep_token": (False,)}


@dataclass
class TextTower:
    """A text tower as read: its config and weights, the stored log scale and bias, and what the tokenizer needs."""

    config: TextConfig
    state: dict[str, torch.Tensor]
    logit_scale: torch.Tensor
    logit_bias: torch.Tensor | None
    family: str  # clip, metaclip_2, siglip, siglip2, tipsv2 (HF) or open_clip
    tokenizer: dict[str, Any]  # how to tokenize: see tokenize.tokenizer_for


def read_hf_text(directory: Path, hf: dict[str, Any]) -> TextTower:
    """The text tower of an HF ``clip``, ``metaclip_2``, ``siglip`` or ``siglip2`` directory whose ``config.json`` is
    ``hf``."""
    family = hf["model_type"]
    text = hf.get("text_config", {})
    check_fields(text, {"num_attention_heads": "count", "layer_norm_eps": "positive", "eos_token_id": "whole"},
                 directory / CONFIG_FILE,
                 within="text_config.")
    settings = {**HF_TEXT[family], **{key: value for key, value in text.items() if key in HF_TEXT[family]}}
    act = settings["hidden_act"]
    if act not in GELUS:
        raise CheckpointError(f"{directory / CONFIG_FILE}: text_config.hidden_act={act!r}; expected one of "
                              f"{sorted(GELUS)}")
    weights = hub_weights_file(directory, "an HF")
    whole = read_weights(weights, keep=lambda key: key.startswith(("text_model.", "text_projection.", "logit_")))
    kept = {key: value for key, value in whole.items()
            if key.startswith(("text_model.", "text_projection.")) and not key.endswith("position_ids")}
    if not kept:
        raise CheckpointError(f"{weights}: no text tower (no text_model.* weights) in this {family} checkpoint")
    state = fuse_qkv(rename(kept, HF_NAMES, str(weights)))
    if family in CAUSAL:  # HF's CLIP: eos_token_id 2 marks configs older than the fix, which pool the largest id;
        eos = settings.get("eos_token_id")  # MetaCLIP 2 pools the first end token whatever its id (2 in XLM-V)
        pool = dict(pool="argmax") if eos == 2 and family == "clip" else dict(pool="eos", eos_token_id=eos)
        pool.update(causal=True)
    else:
        pool = dict(pool="last", causal=False)
    config = _shaped_config(state, weights, num_heads=settings["num_attention_heads"], gelu=GELUS[act],
                            ln_eps=settings["layer_norm_eps"], **pool)
    scale = whole.get("logit_scale")
    if scale is None:
        raise CheckpointError(f"{weights}: no logit_scale; expected a whole {family} model")
    return TextTower(config, state, scale.reshape(()).float(), _bias(whole.get("logit_bias")), family,
                     dict(kind="hf", family=family, directory=directory, context_length=config.context_length,
                          name=hf.get("_name_or_path")))


# TIPSv2's text_config defaults (transformers' Tipsv2TextConfig) and the kinds of the fields read.
TIPSV2_TEXT = dict(num_attention_heads=12, hidden_act="relu", layer_norm_eps=1e-5, max_position_embeddings=64,
                   pad_token_id=0, scale_sqrt_depth=True)
TIPSV2_FIELDS = dict(num_attention_heads="count", layer_norm_eps="positive", max_position_embeddings="count",
                     pad_token_id="whole", scale_sqrt_depth="flag")
TIPSV2_TEMPERATURE = 0.005065968260169029  # Tipsv2Config's temperature_init_value


def read_tipsv2_text(directory: Path, hf: dict[str, Any]) -> TextTower:
    """The text tower of an HF ``tipsv2`` directory (transformers' ``Tipsv2Model``) whose ``config.json`` is
    ``hf``."""
    path = directory / CONFIG_FILE
    text = hf.get("text_config", {})
    check_fields(text, TIPSV2_FIELDS, path, within="text_config.")
    check_fields(hf, {"temperature_init_value": "positive"}, path)
    settings = {**TIPSV2_TEXT, **{key: value for key, value in text.items() if key in TIPSV2_TEXT}}
    act = settings["hidden_act"]
    if act != "relu" and act not in GELUS:
        raise CheckpointError(f"{path}: text_config.hidden_act={abridged(act)}; expected one of "
                              f"{['relu', *sorted(GELUS)]}")
    weights = hub_weights_file(directory, "an HF")
    whole = read_weights(weights, keep=lambda key: key.startswith(TEXT_TOWER))
    kept = {key.removeprefix(TEXT_PREFIX): value for key, value in whole.items() if key.startswith(TEXT_PREFIX)}
    if not kept:
        raise CheckpointError(f"{weights}: no text tower (no {TEXT_PREFIX}* weights) in this tipsv2 checkpoint")
    state = fuse_qkv(rename(kept, OPEN_CLIP_NAMES, str(weights)))
    config = _shaped_config(state, weights, context_length=settings["max_position_embeddings"],
                            num_heads=settings["num_attention_heads"], ln_eps=settings["layer_norm_eps"],
                            mlp="relu" if act == "relu" else "gelu", gelu=GELUS.get(act, "exact"),
                            positions="sinusoidal", embed_scale=settings["scale_sqrt_depth"], causal=False,
                            pool="mean", pad_token_id=settings["pad_token_id"])
    stored = whole.get(TEMPERATURE)
    temperature = hf.get("temperature_init_value", TIPSV2_TEMPERATURE) if stored is None else stored.float().item()
    if not temperature > 0:
        raise CheckpointError(f"{weights}: temperature={temperature}; expected a positive number")
    return TextTower(config, state, torch.tensor(-math.log(temperature)), None, "tipsv2",
                     dict(kind="hf", family="tipsv2", directory=directory, context_length=config.context_length,
                          name=hf.get("_name_or_path"), pad_token_id=config.pad_token_id))


def read_open_clip_text(directory: Path, hub: dict[str, Any]) -> TextTower:
    """The text tower of an open_clip hub directory whose ``open_clip_config.json`` is ``hub`` (its image tower
    read by ``checkpoints.open_clip``), and its tokenizer: open_clip's CLIP BPE, or the folder's HF tokenizer
    where ``hf_tokenizer_name`` names one."""
    path = directory / HUB_CONFIG
    model = (hub or {}).get("model_cfg")
    text = model.get("text_cfg") if isinstance(model, dict) else None
    if not isinstance(text, dict):
        raise CheckpointError(f"{path}: no model_cfg.text_cfg; expected a JSON object of the text tower's settings")
    check_fields(text, {"width": "count", "heads": "count"}, path, within="model_cfg.text_cfg.")
    other = [f"text_cfg.{key}={abridged(text[key])}" for key, plain in PLAIN_TEXT.items()
             if text.get(key, plain) != plain]
    if text.get("pool_type", "argmax") not in OPEN_CLIP_POOLS:
        other.append(f"text_cfg.pool_type={abridged(text['pool_type'])}")
    options = dict(text.get("tokenizer_kwargs") or {})
    hf_tokenizer = text.get("hf_tokenizer_name")
    if hf_tokenizer:  # open_clip's HFTokenizer: the text cleaned as ``clean`` says, then the folder's tokenizer.json
        other += [f"text_cfg.tokenizer_kwargs.{key}={abridged(value)}" for key, value in options.items()
                  if key not in HF_TOKENIZER_OPTIONS or value not in HF_TOKENIZER_OPTIONS[key]]
        if text.get("tokenizer_mode"):
            other.append(f"text_cfg.tokenizer_mode={abridged(text['tokenizer_mode'])}")
    act = text.get("act_kwargs") or {}
    if set(act) - {"approximate"} or act.get("approximate", "none") not in APPROXIMATE_GELUS:
        other.append(f"text_cfg.act_kwargs={abridged(act)}")
    if other:
        raise CheckpointError(f"{path}: {', '.join(other)}: not the CLIP text tower vitkit reads")
    weights = hub_weights_file(directory, "an open_clip", HUB_WEIGHTS)
    whole = read_weights(weights, keep=lambda key: not key.startswith("visual."))
    prefix = "text." if any(key.startswith("text.") for key in whole) else ""  # open_clip's CustomTextCLIP
    kept = {key.removeprefix(prefix): value for key, value in whole.items()
            if key.startswith(prefix) and not key.startswith("visual.") and key not in ("logit_scale", "logit_bias")}
    if "token_embedding.weight" not in kept:
        raise CheckpointError(f"{weights}: no text tower (no {prefix}token_embedding.weight) in this open_clip model")
    state = fuse_qkv(rename(kept, OPEN_CLIP_NAMES, str(weights)))
    if state["proj.weight"].ndim == 2 and "proj.bias" not in state:  # open_clip's x @ proj
        state["proj.weight"] = state["proj.weight"].t().contiguous()
    pool = OPEN_CLIP_POOLS[text.get("pool_type", "argmax")]
    norm_eps = (text.get("norm_kwargs") or {}).get("eps", 1e-5)
    gelu = "quick" if model.get("quick_gelu") else APPROXIMATE_GELUS[act.get("approximate", "none")]
    config = _shaped_config(state, weights, num_heads=text.get("heads", 8), gelu=gelu, ln_eps=norm_eps,
                            causal=not text.get("no_causal_mask", False), pool=pool,
                            eos_token_id=text.get("eos_id", 2) if pool == "eos" else None,
                            layer_scale=text.get("ls_init_value"))
    scale = whole.get("logit_scale")
    if scale is None:
        raise CheckpointError(f"{weights}: no logit_scale; expected a whole open_clip model")
    if hf_tokenizer:
        tokenizer = dict(kind="hf", family="open_clip", directory=directory, context_length=config.context_length,
                         name=hf_tokenizer, clean=options.get("clean", "whitespace"))
    else:
        tokenizer = dict(kind="open_clip", context_length=config.context_length, options=options)
    return TextTower(config, state, scale.reshape(()).float(), _bias(whole.get("logit_bias")), "open_clip",
                     tokenizer)


def _shaped_config(state: dict[str, torch.Tensor], source: Path, **settings: Any) -> TextConfig:
    """A TextConfig whose sizes are those of the weights ``state`` (vitkit's names) and whose numerics are
    ``settings``; the context length is that of the position table unless ``settings`` give it (a tower of
    computed positions)."""
    try:
        vocab, dim = state["token_embed.weight"].shape
        depth = 1 + max(int(key.split(".")[1]) for key in state if key.startswith("blocks."))
        proj = state.get("proj.weight")
        if "context_length" not in settings:
            settings["context_length"] = state["pos_embed"].shape[0]
        return TextConfig(vocab_size=vocab, dim=dim, depth=depth,
                          mlp_dim=state["blocks.0.mlp.fc1.weight"].shape[0],
                          embed_dim=None if proj is None else proj.shape[0], proj_bias="proj.bias" in state,
                          **settings)
    except (KeyError, ValueError) as error:
        raise CheckpointError(f"{source}: not a text tower vitkit reads ({error})") from None


def _bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.reshape(()).float()
