"""HF transformers' vision models of 2025 that do not share the older families' layout, read and written:
DINOv3 (``DINOv3ViTModel``, model_type ``dinov3_vit``) and AIMv2 (``Aimv2VisionModel``, ``aimv2_vision_model``).

DINOv3: rotary embeddings on the patch tokens' queries and keys, turned by the patch centres normalised to
[-1, 1] with periods from ``rope_theta``, the row taking the first half of the frequencies, rotate-half pairs
(vitkit's rope='axial', rope_grid='centered', rope_half); [class] then the register ("storage") tokens and no
absolute position table; LayerScale on both branches; the pooled output is the [class] token after the final
norm (pool='token'). ``pos_embed_shift``/``jitter``/``rescale`` move the coordinates at training only and are
not read. AIMv2: RMSNorm everywhere, the patch embeddings included; SwiGLU; a learned position table of the
patches. Its head pools with one learned query, without a query projection or an MLP: vitkit's attention pool
holds it with an identity query projection and a zero MLP of width 1, which leave the pooled vector as AIMv2's
head computes it. HF computes AIMv2 at its native size only; at other sizes vitkit resamples its table as timm
does (bicubic, antialiased). ``is_native`` (a sine-cosine table of other frequencies than vitkit's) is refused.

Both switch their biases more finely than vitkit (DINOv3: query, key, value, output projection, MLP; AIMv2:
the attention's four projections, the MLP): a bias one side leaves out and the other's layout has is a zero
one, exactly equivalent; a bias that is not zero has to be where the format has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import CheckpointError, FormatError
from ..models.config import Provenance, ViTConfig
from ..models.vit import VisionTransformer
from .files import check_fields, hub_weights_file, read_weights
from .hf import CONFIG_FILE, GELUS, HF_ACTIVATIONS, HF_FIELDS, read_preprocessing, write_hf_directory
from .inference import described_config
from .names import Names, rename, split_qkv

MODEL_TYPES = {"dinov3_vit": "DINOv3", "aimv2_vision_model": "AIMv2"}
SILU = ("silu", "swish")  # what HF names the SiLU of a gated MLP

_PARTS = {  # HF's name in each block -> vitkit's, q/k/v and SwiGLU's gate and value ("up") still apart
    "DINOv3": [("norm1", "norm1"), ("norm2", "norm2"), ("attention.q_proj", "attn.q"), ("attention.k_proj", "attn.k"),
               ("attention.v_proj", "attn.v"), ("attention.o_proj", "attn.proj"), ("mlp.gate_proj", "mlp.gate"),
               ("mlp.up_proj", "mlp.up"), ("mlp.down_proj", "mlp.fc2"), ("layer_scale1", "ls1"),
               ("layer_scale2", "ls2")],
    "AIMv2": [("rms_norm1", "norm1"), ("rms_norm2", "norm2"), ("attention.q_proj", "attn.q"),
              ("attention.k_proj", "attn.k"), ("attention.v_proj", "attn.v"), ("attention.out_proj", "attn.proj"),
              ("ffn.gate_proj", "mlp.gate"), ("ffn.up_proj", "mlp.up"), ("ffn.down_proj", "mlp.fc2")],
}
NAMES = {
    "DINOv3": Names([
        ("embeddings.cls_token", "cls_token"),
        ("embeddings.register_tokens", "reg_token"),
        ("embeddings.mask_token", "mask_token"),
        ("embeddings.patch_embeddings.{rest}", "patch_embed.proj.{rest}"),
        ("norm.{rest}", "norm.{rest}"),
        # "layer.{i}." is what every transformers version writes (5.x holds it as "model.layer.{i}." in memory)
        *[(layer + theirs + (".lambda1" if ours.startswith("ls") else ".{rest}"),
           "blocks.{i}." + ours + (".gamma" if ours.startswith("ls") else ".{rest}"))
          for layer in ("layer.{i}.", "model.layer.{i}.") for theirs, ours in _PARTS["DINOv3"]],
    ]),
    "AIMv2": Names([
        ("embeddings.patch_embed.{rest}", "patch_embed.proj.{rest}"),
        ("embeddings.rms_norm.{rest}", "patch_embed.norm.{rest}"),
        ("embeddings.position_embedding.weight", "pos_embed.weight"),
        ("rms_norm.{rest}", "norm.{rest}"),
        ("head.cls_token", "attn_pool.probe"),
        ("head.k_proj.{rest}", "attn_pool.k.{rest}"),
        ("head.v_proj.{rest}", "attn_pool.v.{rest}"),
        ("head.output_proj.{rest}", "attn_pool.proj.{rest}"),
        *[("encoder.layers.{i}." + theirs + ".{rest}", "blocks.{i}." + ours + ".{rest}")
          for theirs, ours in _PARTS["AIMv2"]],
    ]),
}
_BIAS_FLAGS = dict(query_bias="flag", key_bias="flag", value_bias="flag", proj_bias="flag", mlp_bias="flag")
FIELDS = {  # what each number of the config.json must be (a kind of files.FIELD_KINDS)
    "DINOv3": {**HF_FIELDS, **_BIAS_FLAGS, "rope_theta": "positive", "num_register_tokens": "whole",
               "layerscale_value": "number", "drop_path_rate": "fraction", "attention_dropout": "fraction",
               "use_gated_mlp": "flag"},
    "AIMv2": {**HF_FIELDS, "rms_norm_eps": "positive", "attention_dropout": "fraction", "mlp_bias": "flag",
              "use_head": "flag", "is_native": "flag"},
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def read_hf_recent(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                   ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A DINOv3 or AIMv2 directory whose ``config.json`` the caller has parsed into ``hf``."""
    family, path = MODEL_TYPES[hf["model_type"]], directory / CONFIG_FILE
    check_fields(hf, FIELDS[family], path, required=REQUIRED)
    fields, biases = (_dinov3_fields if family == "DINOv3" else _aimv2_fields)(hf, path)
    weights = hub_weights_file(directory, "an HF")
    state = rename(read_weights(weights), NAMES[family], str(weights))
    fields.update(qkv_bias=biases["q"] or biases["k"] or biases["v"], proj_bias=biases["proj"] or biases["mlp"])
    fields["k_bias"] = biases["k"] or not fields["qkv_bias"]
    state = _packed(state, fields, biases)
    state = _dinov3_layout(state) if family == "DINOv3" else _aimv2_layout(state, fields, biases["k"])
    provenance = Provenance(format=f"hf-{family.lower()}", source=str(directory),
                            **read_preprocessing(directory, fields["in_chans"]))
    return described_config(fields, overrides, provenance, path), state


def _common_fields(hf: dict[str, Any], path: Path, head_multiple: int, why: str) -> dict[str, Any]:
    """The fields every HF vision config gives (its family's defaults for the sizes aside), with the head count
    checked: it must divide the width into heads whose width is a multiple of ``head_multiple`` (``why``)."""
    dim, heads = hf["hidden_size"], hf["num_attention_heads"]
    if dim % heads or (dim // heads) % head_multiple:
        raise CheckpointError(f"{path}: num_attention_heads={heads} with hidden_size={dim}; expected a head count "
                              f"that divides hidden_size into heads of a width divisible by {head_multiple}{why}")
    return dict(dim=dim, depth=hf["num_hidden_layers"], num_heads=heads, mlp_dim=hf["intermediate_size"],
                in_chans=hf.get("num_channels", 3), attn_dropout=hf.get("attention_dropout", 0.0), num_classes=0)


def _dinov3_fields(hf: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    """vitkit's fields for a DINOv3 config, and which biases it has (q, k, v, proj, mlp)."""
    gated, act = hf.get("use_gated_mlp", False), hf.get("hidden_act", "gelu")
    if act not in (SILU if gated else GELUS):
        raise CheckpointError(f"{path}: hidden_act={act!r} with use_gated_mlp={gated}; expected "
                              f"{sorted(SILU if gated else GELUS)} (vitkit's MLP is SwiGLU or a GELU's)")
    fields = dict(_common_fields(hf, path, 4, " (DINOv3's rotary embedding turns pairs of channels on two axes)"),
                  image_size=hf.get("image_size", 224), patch_size=hf.get("patch_size", 16),
                  reg_tokens=hf.get("num_register_tokens", 0), layer_scale=float(hf.get("layerscale_value", 1.0)),
                  ln_eps=hf.get("layer_norm_eps", 1e-5), drop_path=hf.get("drop_path_rate", 0.0),
                  mlp="swiglu" if gated else "gelu", gelu=GELUS.get(act, "exact"), pos_embed="none", pool="token",
                  rope="axial", rope_grid="centered", rope_half=True, rope_theta=float(hf.get("rope_theta", 100.0)))
    biases = {part: hf.get(key, default) for part, key, default in (
        ("q", "query_bias", True), ("k", "key_bias", False), ("v", "value_bias", True), ("proj", "proj_bias", True),
        ("mlp", "mlp_bias", True))}
    return fields, biases


def _aimv2_fields(hf: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    """vitkit's fields for an AIMv2 vision config, and which biases it has (q, k, v, proj, mlp)."""
    if hf.get("is_native", False):
        raise CheckpointError(f"{path}: is_native=true; AIMv2's native-resolution model adds a sine-cosine table "
                              f"whose frequencies vitkit's sincos-2d does not compute (vitkit reads is_native=false)")
    if hf.get("hidden_act", "silu") not in SILU:
        raise CheckpointError(f"{path}: hidden_act={hf.get('hidden_act')!r}; expected one of {list(SILU)} (AIMv2's "
                              f"SwiGLU)")
    head = hf.get("use_head", True)
    fields = dict(_common_fields(hf, path, 1, ""), image_size=hf.get("image_size", 224),
                  patch_size=hf.get("patch_size", 14), norm="rms", ln_eps=hf.get("rms_norm_eps", 1e-5),
                  patch_norm=True, mlp="swiglu", class_token=False, pool="map" if head else "gap",
                  pool_mlp_dim=0 if head else None, pos_interp="bicubic", pos_interp_antialias=True)
    qkv = hf.get("qkv_bias", False)
    return fields, dict(q=qkv, k=qkv, v=qkv, proj=qkv, mlp=hf.get("mlp_bias", False))


def _take(state: dict[str, torch.Tensor], target: str, parts: list[str | int]) -> None:
    """``state[target]``: the concatenation of ``parts``, each a key of ``state`` (taken out) or a width (a zero
    part: a bias the format leaves out). Nothing is done when a key is missing, so that loading names it."""
    if any(isinstance(part, str) and part not in state for part in parts):
        return
    dtype = _dtype(state)
    state[target] = torch.cat([state.pop(part) if isinstance(part, str) else torch.zeros(part, dtype=dtype)
                               for part in parts])


def _dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The checkpoint's floating-point type, for the tensors made up beside its own."""
    return next((value.dtype for value in state.values() if value.is_floating_point()), torch.float32)


def _packed(state: dict[str, torch.Tensor], fields: dict[str, Any], biases: dict[str, bool]
            ) -> dict[str, torch.Tensor]:
    """HF's separate q/k/v projections and SwiGLU's gate and value layers packed as vitkit's ``qkv`` and ``fc1``
    (gate first), with zero parts for the biases HF leaves out where vitkit's layout has one."""
    state = dict(state)
    dim, hidden, gated = fields["dim"], fields["mlp_dim"], fields["mlp"] == "swiglu"
    for i in range(fields["depth"]):
        attn, mlp = f"blocks.{i}.attn.", f"blocks.{i}.mlp."
        bias = {part: f"{attn}{part}.bias" if biases[part] else dim for part in "qkv"}
        _take(state, attn + "qkv.weight", [f"{attn}{part}.weight" for part in "qkv"])
        if fields["qkv_bias"] and fields["k_bias"]:
            _take(state, attn + "qkv.bias", [bias[part] for part in "qkv"])
        elif fields["qkv_bias"]:
            _take(state, attn + "q_bias", [bias["q"]])
            _take(state, attn + "v_bias", [bias["v"]])
        _take(state, mlp + "fc1.weight", [mlp + "gate.weight", mlp + "up.weight"] if gated else [mlp + "up.weight"])
        if fields["proj_bias"]:
            _take(state, attn + "proj.bias", [attn + "proj.bias" if biases["proj"] else dim])
            gate, value = (mlp + "gate.bias", mlp + "up.bias") if biases["mlp"] else (hidden, hidden)
            _take(state, mlp + "fc1.bias", [gate, value] if gated else [value])
            _take(state, mlp + "fc2.bias", [mlp + "fc2.bias" if biases["mlp"] else dim])
    return state


def _dinov3_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DINOv3's weights less the mask token (it replaces masked patches at pre-training only) and the empty
    register tensor of a model without registers."""
    return {key: value for key, value in state.items()
            if key != "mask_token" and not (key == "reg_token" and not value.numel())}


def _aimv2_layout(state: dict[str, torch.Tensor], fields: dict[str, Any], kv_bias: bool) -> dict[str, torch.Tensor]:
    """AIMv2's (N, D) position table as vitkit's (1, N, D); its head as vitkit's attention pool without an MLP
    (``pool_mlp_dim=0``): keys and values packed (with zero biases where the blocks have none), an identity query
    projection (the query is a learned constant either way)."""
    state = dict(state)
    if "pos_embed.weight" in state:
        state["pos_embed.weight"] = state["pos_embed.weight"].unsqueeze(0)
    if fields["pool"] != "map":
        return state
    dim, dtype = fields["dim"], _dtype(state)
    _take(state, "attn_pool.kv.weight", ["attn_pool.k.weight", "attn_pool.v.weight"])
    _take(state, "attn_pool.kv.bias", ["attn_pool.k.bias", "attn_pool.v.bias"] if kv_bias else [2 * dim])
    state.update({"attn_pool.q.weight": torch.eye(dim, dtype=dtype), "attn_pool.q.bias": torch.zeros(dim, dtype=dtype)})
    return state


# ---------------------------------------------------------------------------------------------- writing
# The family options each HF model holds (those of config.FAMILY_DEFAULTS; the values are checked apart).
ALLOWED = {"DINOv3": {"rope", "reg_tokens", "no_embed_class", "layer_scale", "k_bias", "proj_bias", "mlp",
                      "patch_bias"},
           "AIMv2": {"norm", "patch_norm", "mlp", "k_bias", "proj_bias", "patch_bias", "no_embed_class", "pool_heads",
                     "pool_mlp_dim"}}


def hf_recent_family_of(config: ViTConfig) -> str | None:
    """The family of 2025 whose HF model holds ``config``'s options: DINOv3 for rotary embeddings, AIMv2 for
    RMSNorm (or a norm on the patch embeddings); None for the others."""
    if config.rope != "none":
        return "DINOv3"
    if config.norm == "rms" or config.patch_norm:
        return "AIMv2"
    return None


def write_hf_recent(model: VisionTransformer, directory: str | Path) -> Path:
    """Export as HF's ``DINOv3ViTModel`` or ``Aimv2VisionModel`` (see :func:`hf_recent_family_of`); what that
    model cannot hold is refused, naming it."""
    config, family = model.config, hf_recent_family_of(model.config)
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    unsupported, hf, state = (_dinov3_hf if family == "DINOv3" else _aimv2_hf)(config, state)
    generic = [f"{name}={value!r}" for name, value in config.family_options().items() if name not in ALLOWED[family]]
    unsupported = generic + [reason for reason, bad in [
        ("fc_norm", config.fc_norm), ("hybrid backbone", config.backbone is not None),
        ("a head", config.num_classes), ("representation_size", config.representation_size), *unsupported,
    ] if bad]
    if unsupported:
        architecture = "DINOv3ViTModel" if family == "DINOv3" else "Aimv2VisionModel"
        raise FormatError(f"cannot write {directory}: HF's {architecture} cannot hold {', '.join(unsupported)}")
    height, width = config.image_size
    hf.update(hidden_size=config.dim, num_hidden_layers=config.depth, num_attention_heads=config.num_heads,
              intermediate_size=config.mlp_dim, attention_dropout=config.attn_dropout, patch_size=config.patch_size,
              num_channels=config.in_chans, image_size=height if height == width else [height, width])
    state = {NAMES[family].to_theirs(name): tensor for name, tensor in _unpacked(state, config).items()}
    return write_hf_directory(directory, config, hf, state)


def _dinov3_hf(config: ViTConfig, state: dict[str, torch.Tensor]
               ) -> tuple[list[tuple[str, bool]], dict[str, Any], dict[str, torch.Tensor]]:
    """What DINOv3's format cannot hold of ``config`` (reason, whether it applies), its config.json fields, and
    the weights with what HF has and vitkit may not: the mask token, a patch bias, LayerScale (zero, zero, ones)."""
    swiglu = config.mlp == "swiglu"
    unsupported = [
        (f"rope={config.rope!r}", config.rope != "axial"),
        (f"rope_grid={config.rope_grid!r}", config.rope_grid != "centered"),
        ("rope_half=False", not config.rope_half), ("rope_xy=True", config.rope_xy),
        (f"rope_offset={config.rope_offset!r}", config.rope_offset != 0),
        (f"rope_ref_grid={config.rope_ref_grid!r}", config.rope_ref_grid is not None),
        (f"pos_embed={config.pos_embed!r}", config.pos_embed != "none"),
        ("class_token=False", not config.class_token), (f"pool={config.pool!r}", config.pool != "token"),
    ]
    hf = dict(architectures=["DINOv3ViTModel"], model_type="dinov3_vit", layer_norm_eps=config.ln_eps,
              hidden_act="silu" if swiglu else HF_ACTIVATIONS[config.gelu], use_gated_mlp=swiglu,
              rope_theta=config.rope_theta, num_register_tokens=config.reg_tokens,
              layerscale_value=config.layer_scale if config.layer_scale is not None else 1.0,
              query_bias=config.qkv_bias, key_bias=config.qkv_bias and config.k_bias, value_bias=config.qkv_bias,
              proj_bias=config.proj_bias, mlp_bias=config.proj_bias, drop_path_rate=config.drop_path,
              pos_embed_shift=None, pos_embed_jitter=None, pos_embed_rescale=None)  # vitkit does not move them
    like, dim = state["patch_embed.proj.weight"], config.dim  # each tensor its own: safetensors shares none
    state = {"mask_token": like.new_zeros(1, 1, dim), "patch_embed.proj.bias": like.new_zeros(dim),
             "reg_token": like.new_zeros(1, 0, dim), **state}  # HF holds an empty tensor without registers
    if config.layer_scale is None:
        state.update({f"blocks.{i}.ls{j}.gamma": like.new_ones(dim) for i in range(config.depth) for j in (1, 2)})
    return unsupported, hf, state


def _aimv2_hf(config: ViTConfig, state: dict[str, torch.Tensor]
              ) -> tuple[list[tuple[str, bool]], dict[str, Any], dict[str, torch.Tensor]]:
    """What AIMv2's format cannot hold of ``config`` (reason, whether it applies), its config.json fields, and the
    weights as AIMv2 lays them out: zero biases where HF has one and vitkit not, an (N, D) position table, and the
    attention pool as AIMv2's head, its query projection folded into the query (a constant)."""
    height, width = config.image_size
    pool = {key.removeprefix("attn_pool."): state.pop(key) for key in list(state) if key.startswith("attn_pool.")}
    head = config.pool == "map"
    qkv_bias = config.qkv_bias or config.proj_bias  # HF's switch of q, k, v and the output projection
    unsupported = [
        (f"norm={config.norm!r}", config.norm != "rms"), ("patch_norm=False", not config.patch_norm),
        (f"mlp={config.mlp!r}", config.mlp != "swiglu"), ("a [class] token", config.class_token),
        (f"pos_embed={config.pos_embed!r}", config.pos_embed != "learned"), ("non-square images", height != width),
        (f"pool_heads={config.pool_heads!r}", config.pool_heads not in (None, config.num_heads)),
        (f"an attention pool with an MLP (pool_mlp_dim={config.pool_mlp_dim!r}; AIMv2's head has none)",
         head and config.pool_mlp_dim != 0),
        ("a key/value bias in the attention pool without biases in the blocks",
         head and not qkv_bias and bool(pool["kv.bias"].any())),
    ]
    hf = dict(architectures=["Aimv2VisionModel"], model_type="aimv2_vision_model", rms_norm_eps=config.ln_eps,
              hidden_act="silu", qkv_bias=qkv_bias, mlp_bias=config.proj_bias, use_head=head, is_native=False)
    like, dim = state["patch_embed.proj.weight"], config.dim  # each tensor its own: safetensors shares none
    for i in range(config.depth) if qkv_bias else ():
        attn = f"blocks.{i}.attn."
        if not config.qkv_bias:
            state[attn + "qkv.bias"] = like.new_zeros(3 * dim)
        elif not config.k_bias:
            state[attn + "qkv.bias"] = torch.cat([state.pop(attn + "q_bias"), like.new_zeros(dim),
                                                 state.pop(attn + "v_bias")])
        state.setdefault(attn + "proj.bias", like.new_zeros(dim))
    state.setdefault("patch_embed.proj.bias", like.new_zeros(dim))
    if "pos_embed.weight" in state:
        state["pos_embed.weight"] = state["pos_embed.weight"][0]
    if head:
        keys, values = pool["kv.weight"].chunk(2)
        state.update({"attn_pool.probe": F.linear(pool["probe"], pool["q.weight"], pool["q.bias"]),
                      "attn_pool.k.weight": keys, "attn_pool.v.weight": values,
                      "attn_pool.proj.weight": pool["proj.weight"], "attn_pool.proj.bias": pool["proj.bias"]})
        if qkv_bias:
            state["attn_pool.k.bias"], state["attn_pool.v.bias"] = pool["kv.bias"].chunk(2)
    return unsupported, hf, state


def _unpacked(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """The inverse of :func:`_packed`: q, k and v apart (a key bias vitkit holds at zero left out), SwiGLU's
    gate and value apart."""
    state = split_qkv(state)
    for key in [key for key in state if key.endswith(("attn.q_bias", "attn.v_bias"))]:
        state[key.removesuffix("_bias") + ".bias"] = state.pop(key)
    names = ("gate", "up") if config.mlp == "swiglu" else ("up",)
    for key in [key for key in state if key.startswith("blocks.") and ".mlp.fc1." in key]:
        for name, part in zip(names, state.pop(key).chunk(len(names))):
            state[key.replace(".fc1.", f".{name}.")] = part.contiguous()
    return state
