"""Gemma 4's vision encoder, read from timm (``gemma4_vit_167m``, ``gemma4_vit_570m`` and their ``_enc`` variants:
hub directories and bare state dicts) and from HF transformers (``Gemma4VisionModel``, model_type
``gemma4_vision``, and the vision tower of a whole ``gemma4`` model); written back to timm.

The architecture, as vitkit's config options: [0, 1] pixels scaled to [-1, 1] inside (``scale_pixels``); a linear
patch projection without bias; a learned table per axis, looked up by the patch's column and row and summed
(``pos_embed='learned-axes'``); RMSNorm everywhere, on each head's queries and keys (``qk_norm``) and, without a
scale, its values (``v_norm``); 2-D RoPE with theta 100 on index coordinates, the column turning the first half of
each head and the row the second, rotate-half within each (``rope_xy``, ``rope_half``, ``rope_split``); attention
logits not scaled (``attn_scale=1``); four norms per block (``sandwich_norm``); a gated GELU-tanh MLP
(``mlp='geglu'``); no biases; in the E2B/E4B tower (167M) every dense layer of the blocks clamps its input and
output (``clamp_linears``). timm's ``_enc`` variants and HF's tower pool soft tokens: the patches averaged over k x k
cells, times sqrt(D), then in the 26B/31B tower (570M) standardised (``pool='soft'``, ``soft_standardize``); timm's
classifiers average the patches and normalise the mean (an RMSNorm without scale) under a head.

Patch layout: timm flattens each patch (C, ph, pw), HF's processor (ph, pw, C); the kernel is read by the source.
A bare state dict in HF's names could be either (timm's own loader takes such weights as (C, ph, pw), transformers
as (ph, pw, C)): it is refused, naming both.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from ..atomic import atomic_directory, atomic_file
from ..errors import CheckpointError, FormatError
from ..models.config import Provenance, ViTConfig
from ..models.naflex import PatchBatch
from ..models.registry import GEMMA4
from .files import check_fields, prefixed_weights
from .inference import described_config
from .names import Names, rename

# timm's definitions: the sizes of each tower and what sets it apart; "_enc" is the native encoder (soft tokens).
TIMM_ARCHITECTURES = {
    "167m": dict(embed_dim=768, depth=16, num_heads=12, head_dim=64, intermediate_size=3072, standardize=False,
                 use_clipped_linears=True),
    "570m": dict(embed_dim=1152, depth=27, num_heads=16, head_dim=72, intermediate_size=4304, standardize=True),
}
ARCHITECTURE = re.compile(r"gemma4_vit_(167m|570m)(_enc)?")
# The arguments of timm's Gemma4VitEncoder / Gemma4VitClassifier, in timm's words.
TIMM_DEFAULTS: dict[str, Any] = dict(
    img_size=768, patch_size=16, in_chans=3, num_classes=0, embed_dim=768, depth=16, num_heads=12, head_dim=64,
    num_kv_heads=None, intermediate_size=3072, norm_eps=1e-6, rope_theta=100.0, position_embedding_size=10240,
    pooling_kernel_size=3, standardize=False, use_clipped_linears=False, final_norm=True, encoder_pool="",
    act_layer=None,
)
MODEL_ARG_KINDS = dict(img_size="size", patch_size="count", in_chans="count", num_classes="whole", embed_dim="count",
                       depth="count", num_heads="count", head_dim="count", intermediate_size="count",
                       norm_eps="positive", rope_theta="positive", position_embedding_size="count",
                       pooling_kernel_size="count", standardize="flag", use_clipped_linears="flag", final_norm="flag")
HF_FIELDS = dict(hidden_size="count", intermediate_size="count", num_hidden_layers="count",
                 num_attention_heads="count", num_key_value_heads="count", head_dim="count", rms_norm_eps="positive",
                 pooling_kernel_size="count", patch_size="count", position_embedding_size="count",
                 use_clipped_linears="flag", standardize="flag")
HF_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
HF_TOWER = "model.vision_tower."  # a whole Gemma 4 model's vision tower

BOUNDS = ("input_min", "input_max", "output_min", "output_max")  # a clamped layer's, in ClampedLinear's order
# vitkit's packed layers and the separate ones each packs (under a common name, timm's and HF's alike).
PACKED = {"attn.qkv": ("attn.q", "attn.k", "attn.v"), "attn.proj": ("attn.o",), "mlp.fc1": ("mlp.gate", "mlp.up"),
          "mlp.fc2": ("mlp.down",)}
# timm's and HF's separate dense layers of a block and the common names they are packed from.
LINEARS = [(f"attn.{p}_proj", f"attn.{p}") for p in "qkvo"] + [(f"mlp.{p}_proj", f"mlp.{p}") for p in ("gate", "up",
                                                                                                      "down")]
TIMM_NAMES = Names([
    ("patch_embed.input_proj.weight", "patch_embed.proj.weight"),
    ("patch_embed.position_embedding_table", "pos_embed.weight"),
    ("blocks.{i}.norm1.weight", "blocks.{i}.norm1.weight"),
    ("blocks.{i}.norm2.weight", "blocks.{i}.post_norm1.weight"),
    ("blocks.{i}.norm3.weight", "blocks.{i}.norm2.weight"),
    ("blocks.{i}.norm4.weight", "blocks.{i}.post_norm2.weight"),
    ("blocks.{i}.attn.q_norm.weight", "blocks.{i}.attn.q_norm.weight"),
    ("blocks.{i}.attn.k_norm.weight", "blocks.{i}.attn.k_norm.weight"),
    *[(f"blocks.{{i}}.{theirs}.{{rest}}", f"blocks.{{i}}.{ours}.{{rest}}") for theirs, ours in LINEARS],
    ("std_bias", "soft_pool.std_bias"),
    ("std_scale", "soft_pool.std_scale"),
    ("head.{rest}", "head.{rest}"),
])
HF_NAMES = Names([
    ("patch_embedder.input_proj.weight", "patch_embed.proj.weight"),
    ("patch_embedder.position_embedding_table", "pos_embed.weight"),
    ("encoder.layers.{i}.input_layernorm.weight", "blocks.{i}.norm1.weight"),
    ("encoder.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.post_norm1.weight"),
    ("encoder.layers.{i}.pre_feedforward_layernorm.weight", "blocks.{i}.norm2.weight"),
    ("encoder.layers.{i}.post_feedforward_layernorm.weight", "blocks.{i}.post_norm2.weight"),
    ("encoder.layers.{i}.self_attn.q_norm.weight", "blocks.{i}.attn.q_norm.weight"),
    ("encoder.layers.{i}.self_attn.k_norm.weight", "blocks.{i}.attn.k_norm.weight"),
    *[(f"encoder.layers.{{i}}.{theirs.replace('attn.', 'self_attn.')}.{{rest}}", f"blocks.{{i}}.{ours}.{{rest}}")
      for theirs, ours in LINEARS],
    ("std_bias", "soft_pool.std_bias"),
    ("std_scale", "soft_pool.std_scale"),
])


def is_gemma4_architecture(architecture: str) -> bool:
    """Whether a timm architecture name (a pretrained tag after '.' aside) is one of Gemma 4's towers."""
    return ARCHITECTURE.fullmatch(architecture.split(".")[0]) is not None


def is_gemma4_state(state: dict[str, Any]) -> bool:
    """Whether a bare state dict holds Gemma 4's vision encoder, in timm's names or HF's."""
    return any(key.endswith(("patch_embed.position_embedding_table", "patch_embedder.position_embedding_table"))
               for key in state)


# ---------------------------------------------------------------------------------------------- reading
def gemma4_fields(args: dict[str, Any], pool: str, source: Any) -> dict[str, Any]:
    """vitkit's config fields for Gemma 4 with timm's arguments ``args``; ``pool`` is how its output is pooled:
    'soft' (the encoder's soft tokens), 'avg' (the encoder's patch mean) or 'classifier' (timm's classifier: the
    patch mean, an RMSNorm without scale, a head)."""
    a = {**TIMM_DEFAULTS, **args}
    dim, heads = a["embed_dim"], a["num_heads"]
    refused = [reason for reason, bad in [
        (f"grouped-query attention (num_kv_heads={a['num_kv_heads']})", a["num_kv_heads"] not in (None, heads)),
        (f"heads of {a['head_dim']} x {heads} that are not the width {dim}", a["head_dim"] * heads != dim),
        (f"act_layer={a['act_layer']!r}", a["act_layer"] not in (None, "gelu_tanh")),
        (f"encoder_pool={a['encoder_pool']!r} (soft tokens pooled again by the classifier)",
         pool == "classifier" and a["encoder_pool"] not in ("", "none")),
        (f"global_pool={pool!r} (no pooling; the patch tokens are forward_features)", pool not in
         ("soft", "avg", "classifier")),
    ] if bad]
    if refused:
        raise CheckpointError(f"{source}: a Gemma 4 vision encoder with {', '.join(refused)}, which vitkit does not "
                              f"compute")
    size = a["img_size"]
    fields = dict(GEMMA4, image_size=tuple(size) if isinstance(size, list) else size, patch_size=a["patch_size"],
                  in_chans=a["in_chans"], dim=dim, depth=a["depth"], num_heads=heads, mlp_dim=a["intermediate_size"],
                  ln_eps=float(a["norm_eps"]), pos_axis_cells=a["position_embedding_size"],
                  rope_theta=float(a["rope_theta"]), clamp_linears=a["use_clipped_linears"],
                  soft_pool=a["pooling_kernel_size"], soft_standardize=a["standardize"] and pool == "soft")
    if pool == "avg":
        fields.update(pool="gap")
    elif pool == "classifier":
        fields.update(pool="gap", num_classes=a["num_classes"], fc_norm=True, fc_norm_scale=False,
                      final_norm=a["final_norm"])
    return fields


def _kernel(weight: torch.Tensor, channels: int, layout: str, source: Any) -> torch.Tensor:
    """The (D, C * P * P) linear patch projection as vitkit's (D, C, P, P) kernel, from patches flattened as
    ``layout`` says: 'chw' (timm) or 'hwc' (HF)."""
    patch = round((weight.shape[-1] // channels) ** 0.5)
    if weight.ndim != 2 or patch * patch * channels != weight.shape[1]:
        raise CheckpointError(f"{source}: patch projection of shape {tuple(weight.shape)} is no kernel of square "
                              f"patches of {channels} channels")
    if layout == "chw":
        return weight.reshape(-1, channels, patch, patch)
    return weight.reshape(-1, patch, patch, channels).permute(0, 3, 1, 2)


def _to_vitkit(state: dict[str, torch.Tensor], names: Names, config: ViTConfig, layout: str, source: str
               ) -> dict[str, torch.Tensor]:
    """timm's or HF's weights in vitkit's layout for ``config``: q/k/v and the gate and value packed, their clamp
    bounds as each packed layer's (4, pieces) ``bounds``, the patch projection as a kernel; standardisation buffers
    that no soft pool uses (timm's classifier, or a pool asked for in its place) are left out."""
    state = rename(state, names, source)
    if config.pool != "soft" or not config.soft_standardize:
        state = {key: value for key, value in state.items() if not key.startswith("soft_pool.")}
    if "patch_embed.proj.weight" in state:
        state["patch_embed.proj.weight"] = _kernel(state["patch_embed.proj.weight"], config.in_chans, layout, source)
    for i in range(config.depth):
        for ours, parts in PACKED.items():
            layer, pieces = f"blocks.{i}.{ours}", [f"blocks.{i}.{part}." for part in parts]
            if all(f"{piece}linear.weight" in state for piece in pieces):
                state[f"{layer}.weight"] = torch.cat([state.pop(f"{piece}linear.weight") for piece in pieces])
            if config.clamp_linears and all(f"{piece}{b}" in state for piece in pieces for b in BOUNDS):
                state[f"{layer}.bounds"] = torch.stack([torch.stack([state.pop(f"{piece}{b}").reshape(())
                                                                     for piece in pieces]) for b in BOUNDS])
    return state


def read_timm_gemma4(state: dict[str, torch.Tensor], architecture: str, model_args: dict[str, Any],
                     global_pool: str | None, overrides: dict[str, Any], source: str
                     ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm state dict of ``architecture`` (one of Gemma 4's) built with ``model_args``."""
    size, encoder = ARCHITECTURE.fullmatch(architecture.split(".")[0]).groups()
    args = {**TIMM_ARCHITECTURES[size], **model_args}
    told = global_pool if global_pool is not None else "soft" if encoder else "avg"  # timm's default of each
    pool = "classifier" if told == "avg" and not encoder else told
    fields = gemma4_fields(args, pool, source)
    state = {key.removeprefix("encoder."): value for key, value in state.items()} if not encoder else state
    provenance = Provenance(format="timm", source=source, name=architecture, normalization="unit", crop_pct=1.0)
    config = described_config(fields, overrides, provenance, source)
    return config, _to_vitkit(state, TIMM_NAMES, config, "chw", source)


def read_bare_gemma4(state: dict[str, torch.Tensor], overrides: dict[str, Any], source: str
                     ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A bare state dict of Gemma 4's encoder in timm's names, read by timm's definition of its size (the soft
    tokens of the encoder, or the classifier whose weights have a head); in HF's names, refused: its patch layout
    cannot be told."""
    if "patch_embed.input_proj.weight" not in state and "encoder.patch_embed.input_proj.weight" not in state:
        raise CheckpointError(f"{source}: a bare Gemma 4 vision encoder in HF's names, whose patch layout its source "
                              f"tells (timm's loader flattens patches (C, ph, pw), transformers' processor (ph, pw, "
                              f"C)); load its HF directory (config.json with model_type 'gemma4_vision' or "
                              f"'gemma4') or a timm hub directory")
    classifier = any(key.startswith("encoder.") for key in state)
    tower = {key.removeprefix("encoder."): value for key, value in state.items()}
    head_dim = tower["blocks.0.attn.q_norm.weight"].shape[0] if "blocks.0.attn.q_norm.weight" in tower else 1
    dim = tower["patch_embed.input_proj.weight"].shape[0]
    channels = overrides.get("in_chans", 3)
    patch = round((tower["patch_embed.input_proj.weight"].shape[1] // channels) ** 0.5)
    blocks = {int(key.split(".")[1]) for key in tower if key.startswith("blocks.")}
    args = dict(embed_dim=dim, depth=len(blocks), head_dim=head_dim, num_heads=dim // head_dim,
                intermediate_size=tower["blocks.0.mlp.gate_proj.linear.weight"].shape[0] if blocks else 1,
                patch_size=patch, in_chans=channels, position_embedding_size=tower[
                    "patch_embed.position_embedding_table"].shape[1],
                use_clipped_linears="blocks.0.attn.q_proj.input_min" in tower, standardize="std_bias" in tower,
                num_classes=tower["head.weight"].shape[0] if "head.weight" in tower else 0,
                img_size=overrides.get("image_size", 768 // patch * patch))
    architecture = f"gemma4_vit_{'570m' if args['standardize'] else '167m'}" + ("" if classifier else "_enc")
    return read_timm_gemma4(state, architecture, args, None, overrides, source)


def read_timm_gemma4_directory(state: dict[str, torch.Tensor], hub: dict[str, Any], overrides: dict[str, Any],
                               path: Path) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm hub directory of Gemma 4: its architecture's definition, then ``model_args``, then ``global_pool``."""
    model_args = hub.get("model_args", {})
    check_fields(model_args, MODEL_ARG_KINDS, path.parent / "config.json", within="model_args.")
    args = {key: value for key, value in model_args.items() if key in TIMM_DEFAULTS}
    return read_timm_gemma4(state, str(hub["architecture"]), args, hub.get("global_pool", model_args.get(
        "global_pool")), overrides, str(path))


def _native_size(patch: int, kernel: int, cells: int) -> int:
    """HF's config names no image size: timm's 768 px, or the largest square of whole pooling cells the position
    table reaches if that is less."""
    cell = patch * kernel
    return max(1, min(768 // cell, cells // kernel)) * cell


def read_hf_gemma4(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                   ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF directory of ``Gemma4VisionModel`` (``gemma4_vision``) or of a whole Gemma 4 model (``gemma4``), whose
    vision tower is read (the language and audio models left out); its output is the soft tokens."""
    path = directory / "config.json"
    whole = hf["model_type"] == "gemma4"
    tower = hf.get("vision_config") if whole else hf
    if whole and not isinstance(tower, dict):
        raise CheckpointError(f"{path}: a Gemma 4 model without a vision_config; vitkit reads Gemma 4's vision "
                              f"tower, and this model has none")
    within = "vision_config." if whole else ""
    check_fields(tower, HF_FIELDS, path, required=HF_REQUIRED, within=within)
    act, rope = tower.get("hidden_activation", "gelu_pytorch_tanh"), tower.get("rope_parameters") or {}
    if act != "gelu_pytorch_tanh" or rope.get("rope_type", "axial") != "axial":
        raise CheckpointError(f"{path}: {within}hidden_activation={act!r}, rope_parameters={rope}; vitkit computes "
                              f"Gemma 4's gelu_pytorch_tanh and axial rope")
    dim, heads = tower["hidden_size"], tower["num_attention_heads"]
    patch, kernel = tower.get("patch_size", 16), tower.get("pooling_kernel_size", 3)
    cells = tower.get("position_embedding_size", 10240)
    args = dict(embed_dim=dim, depth=tower["num_hidden_layers"], num_heads=heads,
                num_kv_heads=tower.get("num_key_value_heads", heads), head_dim=tower.get("head_dim", dim // heads),
                intermediate_size=tower["intermediate_size"], norm_eps=tower.get("rms_norm_eps", 1e-6),
                rope_theta=rope.get("rope_theta", 100.0), position_embedding_size=cells, pooling_kernel_size=kernel,
                patch_size=patch, standardize=tower.get("standardize", False),
                use_clipped_linears=tower.get("use_clipped_linears", False),
                img_size=_native_size(patch, kernel, cells))
    fields = gemma4_fields(args, "soft", path)
    state = prefixed_weights(directory, HF_TOWER if whole else "")
    if whole:
        warnings.warn(f"{directory}: a whole Gemma 4 model; its vision tower ({HF_TOWER}*) is read, its language "
                      f"model and the rest are left out", stacklevel=4)
    provenance = Provenance(format="hf-gemma4", source=str(directory), normalization="unit", crop_pct=1.0)
    config = described_config(fields, overrides, provenance, path)
    return config, _to_vitkit(state, HF_NAMES, config, "hwc", str(path))


def patch_batch_from_hf(pixel_values: torch.Tensor, image_position_ids: torch.Tensor) -> PatchBatch:
    """transformers' Gemma 4 image processor output as a NaFlex batch for a Gemma 4 model read by vitkit:
    ``pixel_values`` (B, N, P*P*C), each patch flattened (ph, pw, C) in [0, 1] as vitkit's ``PatchBatch`` holds
    them, and ``image_position_ids`` (B, N, 2), each patch's (x, y), (-1, -1) for padding; the result holds the
    same patches with (row, column) coordinates, the mask of real patches and each image's grid."""
    mask = (image_position_ids >= 0).all(dim=-1)
    coords = image_position_ids.flip(-1).clamp(min=0)
    grids = coords.masked_fill(~mask[..., None], 0).max(dim=1).values + 1
    return PatchBatch(pixel_values, coords, mask, grids)


# ---------------------------------------------------------------------------------------------- writing
def is_gemma4(config: ViTConfig) -> bool:
    """Whether ``config`` is Gemma 4's encoder (its learned per-axis table and sandwich norms)."""
    return config.pos_embed == "learned-axes" or config.sandwich_norm


# What timm's model_args and pooling hold; every other option of GEMMA4 is fixed by the architecture.
WRITTEN_AS_ARGS = ("image_size", "patch_size", "in_chans", "dim", "depth", "num_heads", "mlp_dim", "ln_eps",
                   "pos_axis_cells", "rope_theta", "clamp_linears", "soft_pool", "soft_standardize", "num_classes",
                   "final_norm", "pool", "fc_norm", "fc_norm_scale")


def timm_gemma4_architecture(config: ViTConfig, path: Any) -> tuple[str, dict[str, Any]]:
    """timm's definition (with ``model_args``) that builds ``config``'s model; what it cannot hold is refused."""
    c = config
    differ = [f"{name}={getattr(c, name)!r}" for name, value in GEMMA4.items()
              if name not in WRITTEN_AS_ARGS and getattr(c, name) != value]
    classifier = c.pool == "gap" and c.num_classes > 0
    differ += [reason for reason, bad in [
        (f"pool={c.pool!r}", c.pool not in ("soft", "gap")), ("prefix tokens", c.num_prefix_tokens),
        ("a classifier without timm's norm after the mean (fc_norm, no scale)",
         classifier and not (c.fc_norm and not c.fc_norm_scale and c.final_norm)),
        ("a norm after the mean without a head", not classifier and c.pool == "gap" and c.fc_norm and c.final_norm),
        ("representation_size", c.representation_size), ("a hybrid backbone", c.backbone is not None),
    ] if bad]
    if differ:
        raise FormatError(f"cannot write {path}: timm's Gemma 4 vision encoder cannot hold {', '.join(differ)}")
    size = "570m" if c.soft_standardize else "167m"
    architecture = f"gemma4_vit_{size}" + ("" if classifier else "_enc")
    args = dict(img_size=list(c.image_size), patch_size=c.patch_size, in_chans=c.in_chans, embed_dim=c.dim,
                depth=c.depth, num_heads=c.num_heads, head_dim=c.head_dim, intermediate_size=c.mlp_dim,
                norm_eps=c.ln_eps, rope_theta=c.rope_theta, position_embedding_size=c.pos_axis_cells,
                pooling_kernel_size=c.soft_pool, standardize=c.soft_standardize, use_clipped_linears=c.clamp_linears,
                num_classes=c.num_classes, global_pool="avg" if c.pool == "gap" else "soft")
    if classifier:
        args.update(final_norm=True)
    return architecture, args


def timm_gemma4_state(model: torch.nn.Module, classifier: bool) -> dict[str, torch.Tensor]:
    """``model``'s weights in timm's names and layout (the inverse of :func:`_to_vitkit`)."""
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    kernel = state["patch_embed.proj.weight"]
    state["patch_embed.proj.weight"] = kernel.reshape(kernel.shape[0], -1)
    for name in [name for name in state if name.endswith((".weight", ".bounds")) and name.startswith("blocks.")]:
        layer, kind = name.rsplit(".", 1)
        packed = next((ours for ours in PACKED if layer.endswith("." + ours)), None)
        if packed is None:
            continue
        block, tensor = layer[:-len(packed)], state.pop(name)
        parts = PACKED[packed]
        if kind == "weight":
            for part, piece in zip(parts, tensor.chunk(len(parts))):
                state[f"{block}{part}.linear.weight"] = piece
        else:
            for i, part in enumerate(parts):
                state.update({f"{block}{part}.{bound}": tensor[j, i].clone() for j, bound in enumerate(BOUNDS)})
    state = {TIMM_NAMES.to_theirs(name): tensor.contiguous() for name, tensor in state.items()}
    return {f"encoder.{name}" if classifier and not name.startswith("head.") else name: tensor
            for name, tensor in state.items()}


def refuse_hf_gemma4(model: torch.nn.Module, directory: Path) -> Path:
    """The HF writer of Gemma 4's encoder: none (vitkit reads ``Gemma4VisionModel``; it writes timm's layout)."""
    raise FormatError(f"cannot write {directory}: vitkit writes Gemma 4's vision encoder for timm (--to timm), not "
                      f"as HF's Gemma4VisionModel")


def write_timm_gemma4(model: torch.nn.Module, path: Path) -> Path:
    """``model`` for timm: a ``.safetensors`` state dict, or (any other path) a timm hub directory whose
    ``config.json`` names the architecture and the ``model_args`` that build it, written atomically."""
    architecture, args = timm_gemma4_architecture(model.config, path)
    classifier = not architecture.endswith("_enc")
    state = timm_gemma4_state(model, classifier)
    if path.suffix == ".safetensors":
        with atomic_file(path, "wb") as handle:
            handle.write(save(state, metadata={"format": "pt"}))
        return path
    c = model.config
    hub = dict(architecture=architecture, num_classes=c.num_classes, num_features=c.dim,
               global_pool=args["global_pool"], model_args=args,
               pretrained_cfg=dict(input_size=[c.in_chans, *c.image_size], mean=[0.0] * c.in_chans,
                                   std=[1.0] * c.in_chans, crop_pct=c.provenance.crop_pct, crop_mode="center",
                                   interpolation="bicubic", num_classes=c.num_classes, classifier="head",
                                   first_conv="encoder.patch_embed.input_proj" if classifier
                                   else "patch_embed.input_proj"))
    with atomic_directory(path) as staging:
        (staging / "config.json").write_text(json.dumps(hub, indent=2))
        (staging / "model.safetensors").write_bytes(save(state, metadata={"format": "pt"}))
    return path
