"""HF transformers' vision towers of the families on the ViT skeleton: ``deit`` (the distilled
``DeiTForImageClassificationWithTeacher`` and ``DeiTModel``), ``dinov2``, ``dinov2_with_registers``,
``clip_vision_model`` (``CLIPVisionModel``, also ``...WithProjection``), MetaCLIP 2's ``metaclip_2_vision_model``
(CLIP's tower under another name), ``siglip_vision_model``, ``siglip2_vision_model``, and the whole ``clip``,
``metaclip_2``, ``siglip`` and ``siglip2`` models, whose vision tower is read and whose text tower is left out with
a warning.

What HF computes differently from timm, and how the reader makes it the same:
- DINOv2 with registers adds the position table to [class] and the patches and then inserts the registers;
  the [class] row is folded into the [class] token, leaving a table of the patches (``no_embed_class``).
- CLIP's pooled output is the post-LayerNorm [class] token (vitkit's final norm, then token pooling); its
  ``visual_projection`` has no bias and becomes a head with a zero bias.
- SigLIP's attention-pool head is a ``torch.nn.MultiheadAttention`` whose packed input projection is split
  into the probe's query and the tokens' keys and values.
- DINOv2's ``mask_token`` only replaces masked patches at pre-training (``bool_masked_pos``) and is dropped.
- SigLIP 2 embeds patches by a Linear over each patch's pixels flattened as (row, column, channel): it is
  vitkit's patch kernel rearranged. Its table of ``num_patches`` positions is resampled to each image's grid
  bilinearly with antialias (vitkit's ``pos_interp``); at one image size with every patch valid this is
  vitkit's forward on the image (NaFlex batches of several sizes and padded patches are another path).
- ``DeiTModel``'s pooler (Linear + tanh on [class]) is vitkit's pre-logits layer, as for HF's ViT.
Numerics (LayerNorm eps, activation) come from ``config.json``, with each family's HF defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, FormatError
from ..models.config import Provenance, ViTConfig
from ..models.vit import VisionTransformer
from .files import check_fields, hub_weights_file, read_weights
from .hf import (CONFIG_FILE, GELUS, HF_ACTIVATIONS, HF_FIELDS, VIT_NAMES, hf_labels, read_labels,
                 read_preprocessing, write_hf_directory)
from .inference import infer_config
from .names import Names, clip_token_and_head, fuse_qkv, rename, split_qkv, with_prefix_positions, without_text_tower

# model_type -> (family, HF's default layer_norm_eps, default hidden_act, how its position tables are resampled:
# the mode and whether with antialias).
_BICUBIC, _SIGLIP2 = ("bicubic", False), ("bilinear", True)
MODEL_TYPES = {
    "deit": ("deit", 1e-12, "gelu", _BICUBIC),
    "dinov2": ("dinov2", 1e-6, "gelu", _BICUBIC),
    "dinov2_with_registers": ("dinov2", 1e-6, "gelu", ("bicubic", True)),
    "clip_vision_model": ("clip", 1e-5, "quick_gelu", _BICUBIC),
    "clip": ("clip", 1e-5, "quick_gelu", _BICUBIC),
    "siglip_vision_model": ("siglip", 1e-6, "gelu_pytorch_tanh", _BICUBIC),
    "siglip": ("siglip", 1e-6, "gelu_pytorch_tanh", _BICUBIC),
    "siglip2_vision_model": ("siglip2", 1e-6, "gelu_pytorch_tanh", _SIGLIP2),
    "siglip2": ("siglip2", 1e-6, "gelu_pytorch_tanh", _SIGLIP2),
    # MetaCLIP 2 (Meta, 2025): CLIP's tower, weights and numerics (QuickGELU unless hidden_act says otherwise).
    "metaclip_2_vision_model": ("clip", 1e-5, "quick_gelu", _BICUBIC),
    "metaclip_2": ("clip", 1e-5, "quick_gelu", _BICUBIC),
}
WHOLE = ("clip", "siglip", "siglip2", "metaclip_2")  # model types of image and text towers together
SIGLIPS = ("siglip", "siglip2")
TEXT_TOWER = ("text_model.", "text_projection.", "logit_scale", "logit_bias")

_DINO = "encoder.layer.{i}."
_TOWER = "encoder.layers.{i}."
_TOWER_NAMES = [  # the encoder of CLIP and SigLIP
    ("embeddings.patch_embedding.{rest}", "patch_embed.proj.{rest}"),
    ("embeddings.position_embedding.weight", "pos_embed.weight"),
    ("post_layernorm.{rest}", "norm.{rest}"),
    *[(_TOWER + theirs + ".{rest}", "blocks.{i}." + ours + ".{rest}") for theirs, ours in [
        ("layer_norm1", "norm1"), ("layer_norm2", "norm2"), ("self_attn.q_proj", "attn.q"),
        ("self_attn.k_proj", "attn.k"), ("self_attn.v_proj", "attn.v"), ("self_attn.out_proj", "attn.proj"),
        ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2"),
    ]],
]
NAMES = {
    "deit": Names([
        ("embeddings.distillation_token", "dist_token"),
        ("cls_classifier.{rest}", "head.{rest}"),
        ("distillation_classifier.{rest}", "head_dist.{rest}"),
        *VIT_NAMES,
    ]),
    "dinov2": Names([
        ("embeddings.cls_token", "cls_token"),
        ("embeddings.register_tokens", "reg_token"),
        ("embeddings.position_embeddings", "pos_embed.weight"),
        ("embeddings.patch_embeddings.projection.{rest}", "patch_embed.proj.{rest}"),
        ("layernorm.{rest}", "norm.{rest}"),
        *[(_DINO + theirs, "blocks.{i}." + ours) for theirs, ours in [
            ("norm1.{rest}", "norm1.{rest}"), ("norm2.{rest}", "norm2.{rest}"),
            ("attention.attention.query.{rest}", "attn.q.{rest}"), ("attention.q_proj.{rest}", "attn.q.{rest}"),
            ("attention.attention.key.{rest}", "attn.k.{rest}"), ("attention.k_proj.{rest}", "attn.k.{rest}"),
            ("attention.attention.value.{rest}", "attn.v.{rest}"), ("attention.v_proj.{rest}", "attn.v.{rest}"),
            ("attention.output.dense.{rest}", "attn.proj.{rest}"), ("attention.o_proj.{rest}", "attn.proj.{rest}"),
            ("layer_scale1.lambda1", "ls1.gamma"), ("layer_scale2.lambda1", "ls2.gamma"),
            ("mlp.fc1.{rest}", "mlp.fc1.{rest}"), ("mlp.fc2.{rest}", "mlp.fc2.{rest}"),
            ("mlp.weights_in.{rest}", "mlp.fc1.{rest}"), ("mlp.weights_out.{rest}", "mlp.fc2.{rest}"),
        ]],
    ]),
    "clip": Names([
        ("embeddings.class_embedding", "cls_token"),
        ("pre_layrnorm.{rest}", "norm_pre.{rest}"),
        ("visual_projection.weight", "head.weight"),
        *_TOWER_NAMES,
    ]),
    "siglip": Names([
        ("head.probe", "attn_pool.probe"),
        ("head.attention.in_proj_weight", "attn_pool.in_proj.weight"),
        ("head.attention.in_proj_bias", "attn_pool.in_proj.bias"),
        ("head.attention.out_proj.{rest}", "attn_pool.proj.{rest}"),
        ("head.layernorm.{rest}", "attn_pool.norm.{rest}"),
        ("head.mlp.{rest}", "attn_pool.mlp.{rest}"),
        *_TOWER_NAMES,
    ]),
}
NAMES["siglip2"] = NAMES["siglip"]  # the patch embedding is a Linear, of the same name


def read_hf_family(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                   ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF directory of a family on the ViT skeleton whose ``config.json`` the caller has parsed into ``hf``."""
    family, default_eps, default_act, (interp, antialias) = MODEL_TYPES[hf["model_type"]]
    nested = hf["model_type"] in WHOLE and "vision_config" in hf
    tower = hf["vision_config"] if nested else hf
    check_fields(tower, {**HF_FIELDS, "num_patches": "count"}, directory / CONFIG_FILE,
                 required=("num_attention_heads",), within="vision_config." if nested else "")
    act = tower.get("hidden_act", default_act)
    if act not in GELUS and not (family == "dinov2" and tower.get("use_swiglu_ffn")):
        raise CheckpointError(f"{directory / CONFIG_FILE}: hidden_act={act!r}; expected one of {sorted(GELUS)}")
    weights = hub_weights_file(directory, "an HF")
    state = _vision_tower(read_weights(weights), family, weights)
    state = fuse_qkv(rename(state, NAMES[family], str(weights)))
    state = _to_vitkit(state, (tower.get("num_channels", 3), tower.get("patch_size", 16)), weights)
    settings = dict(num_heads=tower["num_attention_heads"], ln_eps=tower.get("layer_norm_eps", default_eps),
                    gelu=GELUS.get(act, "exact"), pos_interp=interp, pos_interp_antialias=antialias,
                    no_embed_class="reg_token" in state,
                    provenance=Provenance(format=f"hf-{family}", source=str(directory),
                                          **read_preprocessing(directory, tower.get("num_channels", 3))))
    config, state = infer_config(state, overrides, str(weights), **settings)
    classes = read_labels(hf, config.num_classes, directory / CONFIG_FILE)  # DeiT's; the others have no head
    return config.replace(provenance=config.provenance.replace(classes=classes)), state


def _vision_tower(state: dict[str, torch.Tensor], family: str, source: Path) -> dict[str, torch.Tensor]:
    """The vision tower's weights without their model prefix; a text tower is left out with a warning, and
    heads vitkit's model does not have are refused."""
    text = [key for key in state if key.startswith(TEXT_TOWER)]
    prefixes = {"deit": "deit.", "clip": "vision_model.", "siglip": "vision_model.", "siglip2": "vision_model.",
                "dinov2": "dinov2."}
    tower = {key.removeprefix(prefixes[family]): value
             for key, value in without_text_tower(state, text, family.upper(), source).items()}
    refused = {
        "deit": ("classifier.",),  # DeiTForImageClassification: a head on [class] alone beside the dist token
        "dinov2": ("classifier.",),  # Dinov2ForImageClassification: a head on [class] and the patches' mean
        "clip": ("classifier.",),  # CLIP's and MetaCLIP 2's ForImageClassification: on the unnormalised patches' mean
    }.get(family, ())
    unsupported = sorted(key for key in tower if key.startswith(refused))
    if unsupported:
        raise CheckpointError(f"{source}: {', '.join(unsupported)}: this HF head has no counterpart in vitkit's "
                              f"{family} model (vitkit reads {family}'s base model and its standard head)")
    return {key: value for key, value in tower.items() if key != "embeddings.mask_token"}


def _to_vitkit(state: dict[str, torch.Tensor], patch_shape: tuple[int, int], source: Path
               ) -> dict[str, torch.Tensor]:
    """Shapes and layouts HF keeps differently (see the module's docstring); ``patch_shape`` is the config's
    (channels, patch side), the shape of SigLIP 2's flattened patches."""
    state = clip_token_and_head(state)
    linear = state.get("patch_embed.proj.weight")
    if linear is not None and linear.ndim == 2:  # SigLIP 2: (D, P * P * C), each patch flattened as (row, col, C)
        channels, patch = patch_shape
        if linear.shape[1] != patch * patch * channels:
            raise CheckpointError(f"{source}: embeddings.patch_embedding.weight of shape {tuple(linear.shape)}; "
                                  f"expected (hidden_size, {patch * patch * channels}) for patch_size={patch} "
                                  f"and num_channels={channels}")
        state["patch_embed.proj.weight"] = linear.reshape(-1, patch, patch, channels).permute(0, 3, 1, 2)
    if "reg_token" in state:  # HF's [class] took a position row; the registers and vitkit's prefix take none
        table = state["pos_embed.weight"]
        state["cls_token"] = state["cls_token"] + table[:, :1]
        state["pos_embed.weight"] = table[:, 1:]
    if "attn_pool.in_proj.weight" in state:
        for leaf in ("weight", "bias"):
            packed = state.pop(f"attn_pool.in_proj.{leaf}")
            dim = packed.shape[0] // 3
            state[f"attn_pool.q.{leaf}"], state[f"attn_pool.kv.{leaf}"] = packed[:dim], packed[dim:]
    return state


# ---------------------------------------------------------------------------------------------- writing
def hf_family_of(config: ViTConfig) -> str | None:
    """The HF family whose format holds ``config``'s options (None: HF's plain ViT, or nothing)."""
    if config.dist_token:
        return "deit"
    if config.pre_norm:
        return "clip"
    if config.pool == "map":  # SigLIP 2 where the table is resampled as SigLIP 2 does
        return "siglip2" if (config.pos_interp, config.pos_interp_antialias) == _SIGLIP2 else "siglip"
    if config.layer_scale is not None or config.reg_tokens:
        return "dinov2"
    return None


def write_hf_family(model: VisionTransformer, directory: str | Path) -> Path:
    """Export as the HF model of the config's family: ``DeiTForImageClassificationWithTeacher`` (or
    ``DeiTModel``), ``Dinov2Model`` / ``Dinov2WithRegistersModel``, ``CLIPVisionModel`` (with projection
    for a bias-free head), ``SiglipVisionModel``, ``Siglip2VisionModel`` (with a processor of its patches);
    what that model cannot hold is refused, naming it."""
    config, family = model.config, hf_family_of(model.config)
    state = model.state_dict()
    height, width = config.image_size
    options = config.family_options()
    allowed = {"deit": {"dist_token", "no_embed_class"}, "dinov2": {"layer_scale", "reg_tokens", "no_embed_class"},
               "clip": {"pre_norm", "patch_bias"}, "siglip": set(), "siglip2": set()}[family]
    head = state.get("head.bias")
    unsupported = [f"{name}={value!r}" for name, value in options.items() if name not in allowed] + [
        reason for reason, bad in [
            ("non-square images", height != width), ("fc_norm", config.fc_norm),
            (f"a position table resampled {config.pos_interp} (HF's {family} resamples "
             f"{'bilinear' if family == 'siglip2' else 'bicubic'})",
             config.pos_interp != ("bilinear" if family == "siglip2" else "bicubic")),
            (f"pos_embed={config.pos_embed!r}", config.pos_embed != "learned"),
            ("hybrid backbone", config.backbone is not None),
            ("representation_size", config.representation_size and (family != "deit" or config.num_classes)),
            ("a bias-free qkv", not config.qkv_bias), ("gelu='quick'", config.gelu == "quick" and family != "clip"),
            ("pool other than 'token'", family not in SIGLIPS and config.pool != "token"),
            ("a [class] token", family in SIGLIPS and config.class_token),
            ("position rows for the registers (no_embed_class=False)", config.reg_tokens and not config.no_embed_class),
            ("patch bias", family == "clip" and config.patch_bias),
            ("a head (HF's classifiers pool differently)", family in ("dinov2", *SIGLIPS) and config.num_classes),
            ("a head bias (CLIP's projection has none)", family == "clip" and head is not None and head.any()),
        ] if bad]
    if unsupported:
        raise FormatError(f"cannot write {directory}: HF's {family} model cannot hold {', '.join(unsupported)}")
    hf = dict(model_type=family, hidden_size=config.dim, num_hidden_layers=config.depth,
              num_attention_heads=config.num_heads, hidden_act=HF_ACTIVATIONS[config.gelu],
              layer_norm_eps=config.ln_eps, image_size=height, patch_size=config.patch_size,
              num_channels=config.in_chans, intermediate_size=config.mlp_dim)
    classify = config.num_classes > 0
    if family == "deit":
        hf.update(architectures=["DeiTForImageClassificationWithTeacher" if classify else "DeiTModel"],
                  qkv_bias=config.qkv_bias, pooler_act="tanh",
                  pooler_output_size=config.representation_size or config.dim, **hf_labels(config))
    elif family == "dinov2":
        ratio = config.mlp_dim / config.dim
        hf.update(mlp_ratio=int(ratio) if ratio.is_integer() else ratio, layerscale_value=config.layer_scale or 1.0,
                  use_swiglu_ffn=config.mlp == "swiglu", qkv_bias=config.qkv_bias,
                  architectures=["Dinov2WithRegistersModel" if config.reg_tokens else "Dinov2Model"])
        if config.reg_tokens:
            hf.update(model_type="dinov2_with_registers", num_register_tokens=config.reg_tokens)
        if int(config.dim * hf["mlp_ratio"]) != config.mlp_dim:
            raise FormatError(f"cannot write {directory}: HF's dinov2 model derives its MLP width from "
                                  f"mlp_ratio; mlp_dim={config.mlp_dim} with dim={config.dim} does not follow")
        if config.layer_scale is None:  # HF's DINOv2 always scales: by ones it is the plain block
            state = {**state, **{f"blocks.{i}.ls{j}.gamma": torch.ones(config.dim)
                                 for i in range(config.depth) for j in (1, 2)}}
    elif family == "clip":
        hf.update(model_type="clip_vision_model", projection_dim=config.num_classes or config.dim,
                  architectures=["CLIPVisionModelWithProjection" if classify else "CLIPVisionModel"])
        state = {key: value for key, value in state.items() if key != "head.bias"}
        state["cls_token"] = state["cls_token"].reshape(-1)
    else:
        hf.update(model_type=f"{family}_vision_model", vision_use_head=True,
                  architectures=["Siglip2VisionModel" if family == "siglip2" else "SiglipVisionModel"])
        state = {key: value for key, value in state.items() if not key.startswith(("attn_pool.q.", "attn_pool.kv."))}
        for leaf in ("weight", "bias"):
            state[f"attn_pool.in_proj.{leaf}"] = torch.cat([model.state_dict()[f"attn_pool.q.{leaf}"],
                                                            model.state_dict()[f"attn_pool.kv.{leaf}"]])
    if config.reg_tokens:  # HF adds a position row to [class]: a zero one keeps vitkit's sum
        table = state["pos_embed.weight"]
        state["pos_embed.weight"] = torch.cat([table.new_zeros(1, 1, table.shape[-1]), table], dim=1)
    else:
        state = with_prefix_positions(config, state)[1]
    if family in ("clip", *SIGLIPS):  # an nn.Embedding's (tokens, D) table
        state["pos_embed.weight"] = state["pos_embed.weight"][0]
    geometry = None
    if family == "siglip2":  # patches flattened as (row, column, channel) into a Linear; a processor that cuts them
        del hf["image_size"]
        hf["num_patches"] = config.grid_size[0] * config.grid_size[1]
        state["patch_embed.proj.weight"] = state["patch_embed.proj.weight"].permute(0, 2, 3, 1).reshape(config.dim, -1)
        geometry = {"image_processor_type": "Siglip2ImageProcessor", "do_resize": True,
                    "patch_size": config.patch_size, "max_num_patches": hf["num_patches"]}
    prefix = {"deit": "deit." if classify else "", "clip": "vision_model.", "siglip": "vision_model."}.get(family, "")
    written = {}
    for name, tensor in split_qkv(state).items():
        theirs = NAMES[family].to_theirs(name)
        top_level = theirs.startswith(("cls_classifier.", "distillation_classifier.", "visual_projection."))
        written[theirs if top_level else prefix + theirs] = tensor
    if family == "dinov2":  # used only on masked patches at pre-training; zero as HF initialises it
        written["embeddings.mask_token"] = torch.zeros(1, config.dim)
    return write_hf_directory(directory, config, hf, written, geometry)
