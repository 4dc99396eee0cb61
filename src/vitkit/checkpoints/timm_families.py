"""timm's ViTs of 2023-25: DINOv3, EVA and EVA-02, Perception Encoder (PE-core), RoPE-ViT and timm's own RoPE ViTs
(all on timm's ``Eva``), and AIMv2 (on timm's ``VisionTransformer``).

Their rotary embeddings are computed, not saved (timm keeps them in buffers left out of the state dict), so the
weights alone do not say how positions turn the queries and keys. A timm hub directory names its architecture in
``config.json``: that name picks the family and the arguments of timm's definition (frequencies, coordinates,
reference grid, pooling, norms), and ``model_args`` overrides them as it did for timm. A bare state dict is read
by the family its keys give away, each a closed set of timm's definitions with one setting (DINOv3: CLS and
storage tokens without a position table; PE: a pre-norm and an attention pool; ...); anything else of this
layout is refused naming the family.

Layouts: timm's ``gamma_1``/``gamma_2`` are vitkit's LayerScale; separate ``q_proj``/``k_proj``/``v_proj`` and
SwiGLU's ``fc1_g``/``fc1_x`` are packed into vitkit's ``qkv`` and ``fc1`` (gate first); ``q_bias``/``v_bias``
beside a bias-free key are vitkit's ``k_bias=False``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from ..atomic import atomic_directory, atomic_file
from ..errors import CheckpointError, FormatError
from ..models.config import Provenance, ViTConfig
from .files import check_fields
from .inference import infer_config
from .names import Names, rename
from .timm_naflex import NAFLEX_ARCHITECTURES, NAFLEX_DEFAULTS, read_timm_naflex

# The arguments of timm's Eva, in timm's words, where its definitions use other values than these.
EVA_DEFAULTS: dict[str, Any] = dict(
    global_pool="avg", use_fc_norm=None, use_post_transformer_norm=None, use_pre_transformer_norm=False,
    use_rot_pos_emb=False, rope_type="cat", rope_temperature=10000.0, rope_grid_offset=0.0, rope_grid_indexing="ij",
    rope_rotate_half=False, ref_feat_shape=None, attn_pool_num_heads=None, attn_pool_mlp_ratio=None,
    no_embed_class=False, use_post_norm=False, num_kv_heads=None, norm_eps=1e-6, norm="layer",
)
_DINOV3 = dict(use_rot_pos_emb=True, rope_type="dinov3", rope_temperature=100.0, rope_rotate_half=True,
               use_fc_norm=False, norm_eps=1e-5)
_PE = dict(use_rot_pos_emb=True, global_pool="map", use_pre_transformer_norm=True, rope_grid_offset=1.0,
           rope_grid_indexing="xy", attn_pool_num_heads=8, attn_pool_mlp_ratio=4.0, norm_eps=1e-5)
_ROPE_VIT = dict(use_rot_pos_emb=True, global_pool="token", rope_grid_indexing="xy", rope_temperature=100.0)
_ROPE_MIXED = dict(_ROPE_VIT, rope_type="mixed", rope_temperature=10.0)

# family -> (architectures as timm names them with their arguments, head count by width where it is not the
# paper's). The first pattern that matches an architecture wins.
FAMILIES: dict[str, tuple[list[tuple[str, dict[str, Any]]], dict[int, int]]] = {
    "DINOv3": ([(r"vit_\w+_patch16_dinov3(_qkvb)?", _DINOV3),
                (r"vit_\w+_patch16_lingbot", dict(_DINOV3, global_pool="token"))],
               {192: 3, 384: 6, 1280: 20, 4096: 32}),
    "EVA-02": ([(r"eva02_\w+_clip_\w+", dict(use_rot_pos_emb=True, ref_feat_shape=16, global_pool="token")),
                (r"eva02_\w+_patch14_\d+", dict(use_rot_pos_emb=True, ref_feat_shape=16))], {}),
    "Perception Encoder": ([(r"vit_pe_core_(tiny|small)_patch16_384", dict(_PE, ref_feat_shape=24)),
                            (r"vit_pe_core_base_patch16_224", dict(_PE, ref_feat_shape=14)),
                            (r"vit_pe_core_large_patch14_336", dict(_PE, ref_feat_shape=24)),
                            (r"vit_pe_core_gigantic_patch14_448", dict(_PE, ref_feat_shape=32, rope_grid_offset=0.0))],
                           {1536: 16}),
    "RoPE-ViT": ([(r"vit_\w+_patch16_rope_mixed_224", _ROPE_MIXED),
                  (r"vit_\w+_patch16_rope_mixed_ape_224", dict(_ROPE_MIXED, no_embed_class=True)),
                  (r"vit_\w+_patch16_rope_224", _ROPE_VIT),
                  (r"vit_\w+_patch16_rope_ape_224", dict(_ROPE_VIT, no_embed_class=True))], {}),
    "timm RoPE ViT": ([(r"vit_\w+_patch16_rope_reg\d_gap_256", dict(use_rot_pos_emb=True, ref_feat_shape=16))],
                      {512: 8, 640: 10}),
    "EVA": ([(r"eva_giant_patch14_\w+", {})], {1408: 16}),
    "AIMv2": ([(r"aimv2_\w+", dict(norm="rms", norm_eps=1e-5, use_fc_norm=False))], {1024: 8, 1536: 12, 2048: 16, 3072: 24}),
}
# Architectures of these families' files that vitkit does not compute, and why; refused naming them.
REFUSED = {r"vit_pe_(lang|spatial)_\w+": "Perception Encoder's language and spatial towers",
           r"eva02_enormous_\w+": "EVA-02-E's post-norm blocks", r"vit_\w+_mrope\w*": "multimodal RoPE (MRoPE)"}

NAMES = Names([
    ("pos_embed", "pos_embed.weight"),
    ("attn_pool.latent", "attn_pool.probe"),
    ("blocks.{i}.gamma_1", "blocks.{i}.ls1.gamma"),
    ("blocks.{i}.gamma_2", "blocks.{i}.ls2.gamma"),
    ("{rest}", "{rest}"),
])


# What the numbers of a hub directory's model_args must be (kinds of files.FIELD_KINDS).
MODEL_ARG_KINDS = dict(rope_temperature="positive", rope_grid_offset="number", attn_pool_num_heads="count",
                       attn_pool_mlp_ratio="positive", num_reg_tokens="whole")


def family_of_architecture(architecture: str) -> tuple[str, dict[str, Any]] | None:
    """The family of a timm architecture name (a pretrained tag after '.' aside) and the arguments of its
    definition; None for architectures of other files; refused when it belongs to one vitkit does not compute."""
    name = architecture.split(".")[0]
    for pattern, what in REFUSED.items():
        if re.fullmatch(pattern, name):
            raise CheckpointError(f"timm architecture {architecture!r}: vitkit does not compute {what}")
    for family, (patterns, _) in FAMILIES.items():
        for pattern, args in patterns:
            if re.fullmatch(pattern, name):
                return family, args
    for pattern, args in NAFLEX_ARCHITECTURES.items():
        if re.fullmatch(pattern, name):
            return "NaFlexViT", args
    if name.startswith("naflexvit_"):
        raise CheckpointError(f"timm architecture {architecture!r}: vitkit reads the NaFlexViTs "
                              f"{sorted(NAFLEX_ARCHITECTURES)}, not factorised tables")
    return None


def family_of_keys(state: dict[str, torch.Tensor], source: str, overrides: dict[str, Any]
                   ) -> tuple[str, dict[str, Any]] | None:
    """The family whose timm layout a bare state dict has, with that family's arguments; None for plain ViTs.
    A layout that several of timm's definitions share with different settings is refused naming them, unless
    ``overrides`` tell the setting that differs."""
    keys = set(state)
    if "embeds.proj.weight" in keys:
        plain = not ({"reg_token", "cls_token", "embeds.reg_token", "embeds.cls_token"} & keys
                     or any(key.endswith(".ls1.gamma") for key in keys))
        if plain and "attn_pool.latent" in keys:  # only SigLIP 2's NaFlexViTs have no prefix and no LayerScale
            return "NaFlexViT", NAFLEX_ARCHITECTURES[r"naflexvit_(base|so400m)_patch16_siglip"]
        told = {"gap": "avg", "map": "map", "token": "token"}.get(overrides.get("pool"))
        if told:  # the told pooling, with its fc_norm (timm's: after an average pool), as timm's definitions set it
            return "NaFlexViT", {"global_pool": told}
        raise CheckpointError(f"{source}: a bare timm NaFlexViT state dict, whose pooling and table resampling "
                              f"(some keep the aspect ratio) its keys do not show; load its timm hub directory, or "
                              f"pass pool=... to read it as timm's naflexvit_base_patch16_gap or _map")
    eva_layout = any(re.search(r"\.gamma_1$|\.attn\.(q_bias|q_proj\.weight)$|\.mlp\.fc1_g\.", key) for key in keys)
    bias_free_norms = "norm.weight" in keys and "norm.bias" not in keys
    table, prefix = "pos_embed" in keys, ("cls_token" in keys, "reg_token" in keys)
    if "blocks.0.mlp.fc1_g.weight" in keys and bias_free_norms:
        return "AIMv2", FAMILIES["AIMv2"][0][0][1]
    if "norm_pre.weight" in keys and "attn_pool.latent" in keys and "rope" not in overrides:
        raise CheckpointError(f"{source}: a timm state dict with a pre-norm and an attention pool, as both timm's "
                              f"ViT (pre_norm, global_pool='map') and Perception Encoder (rotary embeddings, not saved "
                              f"in the weights, an 8-head pool over every token) have; load PE from its timm hub "
                              f"directory, or pass rope='none' to read a plain ViT")
    if "rope.freqs" in keys:  # the position table of the "ape" variants has no prefix rows
        return "RoPE-ViT", dict(_ROPE_MIXED, no_embed_class=table)
    if not eva_layout:
        return None
    if not table and prefix == (True, True):
        if "pool" not in overrides:
            raise CheckpointError(f"{source}: a DINOv3-layout state dict, which timm's definitions pool by the mean "
                                  f"of the patches (vit_*_dinov3) or by [class] (DINOv3's own, LingBot); load its "
                                  f"timm hub directory, or pass pool='gap' or pool='token'")
        return "DINOv3", _DINOV3
    if not table and prefix == (False, True):
        return "timm RoPE ViT", dict(use_rot_pos_emb=True, ref_feat_shape=16)
    if prefix == (True, False) and "blocks.0.attn.qkv.bias" in keys:
        return "RoPE-ViT", dict(_ROPE_VIT, no_embed_class=table)
    swiglu = "blocks.0.mlp.fc1_g.weight" in keys or (
        "blocks.0.mlp.fc1.weight" in keys and "blocks.0.mlp.fc2.weight" in keys
        and state["blocks.0.mlp.fc1.weight"].shape[0] == 2 * state["blocks.0.mlp.fc2.weight"].shape[-1])
    pool = "avg" if "fc_norm.weight" in keys else "token"  # EVA-02's CLIP towers pool [class], without fc_norm
    if table and prefix == (True, False) and swiglu:
        return "EVA-02", dict(use_rot_pos_emb=True, ref_feat_shape=16, global_pool=pool)
    raise CheckpointError(f"{source}: a state dict of timm's Eva layout (EVA, EVA-02, DINOv3, PE, RoPE-ViT) whose keys match "
                          "none of the definitions vitkit tells apart by their keys (whether and how it used rotary "
                          "embeddings is not saved in the weights); load its timm hub directory, whose config.json "
                          "names the architecture")


def eva_fields(args: dict[str, Any], source: Any) -> dict[str, Any]:
    """vitkit's config fields for timm Eva arguments ``args`` (the family's, then the hub's model_args)."""
    a = {**EVA_DEFAULTS, **args}
    refused = [reason for reason, bad in [
        ("post-norm blocks (use_post_norm)", a["use_post_norm"]), ("grouped-query attention", a["num_kv_heads"]),
        (f"rope_type={a['rope_type']!r}", a["rope_type"] not in ("cat", "dinov3", "mixed")),
        (f"global_pool={a['global_pool']!r}", a["global_pool"] not in ("avg", "token", "map")),
    ] if bad]
    if refused:
        raise CheckpointError(f"{source}: vitkit does not compute {', '.join(refused)}")
    fc_norm = a["use_fc_norm"] if a["use_fc_norm"] is not None else a["global_pool"] == "avg"
    final_norm = a["use_post_transformer_norm"] if a["use_post_transformer_norm"] is not None else not fc_norm
    if fc_norm == final_norm:
        raise CheckpointError(f"{source}: use_fc_norm={fc_norm}, use_post_transformer_norm={final_norm}; vitkit "
                              f"normalises either every token or the pooled one")
    fields = dict(pool={"avg": "gap", "token": "token", "map": "map"}[a["global_pool"]], fc_norm=fc_norm,
                  pre_norm=a["use_pre_transformer_norm"], ln_eps=a["norm_eps"], norm=a["norm"],
                  no_embed_class=a["no_embed_class"], pool_heads=a["attn_pool_num_heads"],
                  pool_prefix=a["global_pool"] == "map")  # Eva's attention pool takes every token
    if a["use_rot_pos_emb"]:
        fields.update(rope="mixed" if a["rope_type"] == "mixed" else "axial", rope_theta=float(a["rope_temperature"]),
                      rope_grid="centered" if a["rope_type"] == "dinov3" else "index",
                      rope_xy=a["rope_grid_indexing"] == "xy", rope_half=bool(a["rope_rotate_half"]))
        if a["rope_type"] != "mixed":
            fields["rope_offset"] = float(a["rope_grid_offset"])
        reference = a["ref_feat_shape"]
        if isinstance(reference, list | tuple):
            if len(set(reference)) != 1:
                raise CheckpointError(f"{source}: ref_feat_shape={reference}; vitkit's rotary grid is square")
            reference = reference[0]
        if a["rope_type"] == "cat" and reference not in (None, "native"):
            fields["rope_ref_grid"] = reference
    return fields


def _packed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Separate q/k/v projections and SwiGLU's gate and value layers packed into vitkit's ``qkv`` and ``fc1``."""
    state = dict(state)
    for key in [k for k in state if k.endswith(".attn.q_proj.weight")]:
        block = key.removesuffix("q_proj.weight")
        state[block + "qkv.weight"] = torch.cat([state.pop(f"{block}{p}_proj.weight") for p in "qkv"])
        biases = [state.pop(f"{block}{p}_proj.bias", None) for p in "qkv"]
        if biases[1] is not None:
            state[block + "qkv.bias"] = torch.cat(biases)
        elif biases[0] is not None:
            state[block + "q_bias"], state[block + "v_bias"] = biases[0], biases[2]
    for key in [k for k in state if ".mlp.fc1_g." in k]:
        state[key.replace(".fc1_g.", ".fc1.")] = torch.cat([state.pop(key), state.pop(key.replace("_g.", "_x."))])
    return state


def read_timm_family(state: dict[str, torch.Tensor], family: str, args: dict[str, Any], overrides: dict[str, Any],
                     source: str, told_heads: int | None = None, told_size: Any = None
                     ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm state dict of ``family`` with the arguments ``args`` of its definition; ``told_size``, the image
    size a hub directory names, is the native size of a model without a position table."""
    if family == "NaFlexViT":
        return read_timm_naflex(state, args, overrides, source, told_heads)
    gated = sorted(key for key in state if ".attn.gate." in key)
    if gated:
        raise CheckpointError(f"{source}: gated attention ({', '.join(gated[:3])}) is not computed by vitkit")
    state = _packed(rename(state, NAMES, source))
    fields = eva_fields(args, source)
    dim = state["patch_embed.proj.weight"].shape[0] if "patch_embed.proj.weight" in state else 0
    heads = told_heads or FAMILIES[family][1].get(dim)
    if "rope.freqs" in state:  # learned mixed frequencies: (2, depth, heads, head_dim / 2)
        heads = state["rope.freqs"].shape[2]
    if heads:
        fields["num_heads"] = heads
    first = "blocks.0.attn."
    fields.update(qkv_bias=f"{first}qkv.bias" in state or f"{first}q_bias" in state,
                  k_bias=f"{first}q_bias" not in state, proj_bias=f"{first}proj.bias" in state,
                  mlp_norm="blocks.0.mlp.norm.weight" in state, attn_norm=f"{first}norm.weight" in state,
                  patch_norm="patch_embed.norm.weight" in state)
    numerics = dict(gelu="exact", pos_interp="bicubic", pos_interp_antialias=True)
    if told_size is not None:
        numerics["image_size"] = told_size
    provenance = Provenance(format="timm", source=source)
    config, state = infer_config(state, overrides, source, **numerics, **fields, provenance=provenance)
    if args.get("ref_feat_shape") == "native" and "rope_ref_grid" not in overrides:  # PE: the grid it was trained at
        config = config.replace(rope_ref_grid=config.grid_size[0])
    return config, state


def read_timm_hub_family(state: dict[str, torch.Tensor], hub: dict[str, Any], family: str, args: dict[str, Any],
                         overrides: dict[str, Any], path: Path) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm hub directory of ``family``: its definition's arguments, then ``model_args``, then ``global_pool``."""
    model_args = hub.get("model_args", {})
    check_fields(model_args, MODEL_ARG_KINDS, path.parent / "config.json", within="model_args.")
    input_size = hub.get("pretrained_cfg", {}).get("input_size")
    size = model_args.get("img_size", input_size[1:] if isinstance(input_size, list) and len(input_size) == 3 else None)
    size = tuple(size) if isinstance(size, list) else size
    if family == "NaFlexViT":
        args = {**args, **{k: v for k, v in model_args.items() if k in NAFLEX_DEFAULTS or k == "in_chans"}}
        return read_timm_naflex(state, args, overrides, str(path), model_args.get("num_heads"), size)
    args = {**args, **{k: v for k, v in model_args.items() if k in EVA_DEFAULTS}}
    if "global_pool" in hub:
        args["global_pool"] = hub["global_pool"]
    return read_timm_family(state, family, args, overrides, str(path), model_args.get("num_heads"), size)


# ---------------------------------------------------------------------------------------------- writing
def is_timm_family(config: ViTConfig) -> bool:
    """Whether ``config`` needs timm's Eva (or, with RMSNorm, AIMv2's layout) rather than its VisionTransformer."""
    return config.rope != "none" or not config.k_bias or config.mlp_norm or config.attn_norm or config.norm == "rms"


def timm_architecture(config: ViTConfig, path: Any) -> tuple[str, dict[str, Any]]:
    """The timm architecture whose definition (with ``model_args``) builds ``config``'s model; what timm's Eva or
    AIMv2 cannot hold is refused, naming the fields."""
    c, aimv2 = config, config.norm == "rms"
    if c.rope == "axial" and c.rope_grid == "centered":
        architecture, eps = "vit_base_patch16_dinov3" + ("_qkvb" if c.qkv_bias else ""), 1e-5
    elif c.pre_norm and c.pool == "map":
        architecture, eps = "vit_pe_core_base_patch16_224", 1e-5
    elif aimv2:
        architecture, eps = "aimv2_large_patch14_224", 1e-5
    else:
        architecture, eps = "eva02_base_patch14_224", 1e-6
    refused = [reason for reason, bad in [
        (f"ln_eps={c.ln_eps} (this family's timm definition has {eps})", c.ln_eps != eps),
        (f"gelu={c.gelu!r}", c.gelu != "exact" and c.mlp == "gelu"), ("dist_token", c.dist_token),
        ("representation_size", c.representation_size), ("a hybrid backbone", c.backbone is not None),
        (f"pos_embed={c.pos_embed!r}", c.pos_embed not in ("learned", "none")),
        ("a position table resampled otherwise than bicubic with antialias (timm's way at other sizes)",
         c.pos_embed == "learned" and (c.pos_interp, c.pos_interp_antialias, c.pos_interp_align_corners)
         != ("bicubic", True, False)),
        ("pool_prefix differing from timm's (Eva pools every token by attention, the patches by mean)",
         not aimv2 and c.pool != "token" and c.pool_prefix != (c.pool == "map")),
        ("proj_bias=False or patch_norm without RMSNorm", not aimv2 and (not c.proj_bias or c.patch_norm)),
        ("pre_norm with a patch bias (timm's Eva drops the bias under a pre-norm)", c.pre_norm == c.patch_bias),
        ("rope in AIMv2's layout", aimv2 and c.rope != "none"), ("qk_norm", c.qk_norm and aimv2),
        ("a bias on q and v alone in AIMv2's layout", aimv2 and not c.k_bias),
        ("final_norm=False", not c.final_norm),
    ] if bad]
    if refused:
        raise FormatError(f"cannot write {path}: timm's {architecture.split('_patch')[0]} cannot hold "
                              f"{', '.join(refused)}")
    mlp_ratio = (c.mlp_dim + 0.5) / c.dim  # int(dim * ratio) is timm's width
    args: dict[str, Any] = dict(img_size=list(c.image_size), patch_size=c.patch_size, in_chans=c.in_chans,
                                num_classes=c.num_classes, embed_dim=c.dim, depth=c.depth, num_heads=c.num_heads,
                                mlp_ratio=mlp_ratio, qkv_bias=c.qkv_bias, class_token=c.class_token,
                                global_pool={"gap": "avg", "token": "token", "map": "map"}[c.pool],
                                no_embed_class=c.no_embed_class)
    if aimv2:
        args.update(reg_tokens=c.reg_tokens, fc_norm=c.fc_norm, proj_bias=c.proj_bias, init_values=c.layer_scale,
                    pos_embed="learn" if c.pos_embed == "learned" else "none", dynamic_img_size=True)
        return architecture, args
    args.update(num_reg_tokens=c.reg_tokens, init_values=c.layer_scale, qkv_fused=True, qk_norm=c.qk_norm,
                attn_type="rope" if c.qkv_bias and c.k_bias else "eva", swiglu_mlp=c.mlp == "swiglu",
                scale_mlp=c.mlp_norm, scale_attn_inner=c.attn_norm, use_abs_pos_emb=c.pos_embed == "learned",
                use_rot_pos_emb=c.rope != "none", use_pre_transformer_norm=c.pre_norm, use_fc_norm=c.fc_norm,
                use_post_transformer_norm=not c.fc_norm, dynamic_img_size=True, ref_feat_shape=None)
    if c.rope != "none":
        args.update(rope_type={"mixed": "mixed", "axial": "dinov3" if c.rope_grid == "centered" else "cat"}[c.rope],
                    rope_temperature=c.rope_theta, rope_grid_offset=c.rope_offset,
                    rope_grid_indexing="xy" if c.rope_xy else "ij", rope_rotate_half=c.rope_half,
                    ref_feat_shape=[c.rope_ref_grid] * 2 if c.rope_ref_grid else None)
    if c.pool == "map":
        args.update(attn_pool_num_heads=c.pool_heads or c.num_heads,
                    attn_pool_mlp_ratio=((c.pool_mlp_dim or c.mlp_dim) + 0.5) / c.dim)
    return architecture, args


def timm_family_state(model: torch.nn.Module, eva: bool) -> dict[str, torch.Tensor]:
    """``model``'s weights in timm's names: LayerScale as gamma_1/gamma_2 (Eva), SwiGLU's packed fc1 split into
    its gate and value layers where timm keeps them apart (AIMv2, and Eva's SwiGLU with a norm inside)."""
    c = model.config
    separate = c.mlp == "swiglu" and (not eva or c.mlp_norm)
    state = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        if separate and name.startswith("blocks.") and ".mlp.fc1." in name:
            gate, value = tensor.chunk(2)
            state[name.replace(".fc1.", ".fc1_g.")] = gate.contiguous()
            state[name.replace(".fc1.", ".fc1_x.")] = value.contiguous()
        elif eva:
            state[NAMES.to_theirs(name)] = tensor
        else:
            state[{"pos_embed.weight": "pos_embed", "attn_pool.probe": "attn_pool.latent"}.get(name, name)] = tensor
    return state


def write_timm_family(model: torch.nn.Module, path: Path) -> Path:
    """``model`` for timm: a ``.safetensors`` state dict in its family's layout, or (any other path) a timm hub
    directory, whose ``config.json`` names the architecture and the ``model_args`` that build the model
    (``timm.create_model("local-dir:PATH")``), written atomically."""
    architecture, args = timm_architecture(model.config, path)
    return write_timm_state(path, model.config, architecture, args, timm_family_state(model, eva=model.config.norm != "rms"))


def write_timm_state(path: Path, config: ViTConfig, architecture: str, args: dict[str, Any],
                     state: dict[str, torch.Tensor], first_conv: str = "patch_embed.proj") -> Path:
    """``state`` (timm's names) as a ``.safetensors`` state dict, or (any other path) as a timm hub directory whose
    ``config.json`` names ``architecture`` and the ``model_args`` ``args`` that build it, written atomically."""
    if path.suffix == ".safetensors":
        with atomic_file(path, "wb") as handle:
            handle.write(save(state, metadata={"format": "pt"}))
        return path
    c = config
    mean, std = c.input_statistics
    hub = dict(architecture=architecture, num_classes=c.num_classes, num_features=c.dim,
               global_pool=args["global_pool"], model_args=args,
               pretrained_cfg=dict(input_size=[c.in_chans, *c.image_size], mean=list(mean), std=list(std),
                                   crop_pct=c.provenance.crop_pct, crop_mode="center", interpolation="bicubic",
                                   num_classes=c.num_classes, first_conv=first_conv, classifier="head"))
    with atomic_directory(path) as staging:
        (staging / "config.json").write_text(json.dumps(hub, indent=2))
        (staging / "model.safetensors").write_bytes(save(state, metadata={"format": "pt"}))
    return path
