"""The Qwen VL vision towers: timm's ``qwen3_vit_*`` (88m, 306m, 416m; the ``_enc`` encoders and ``_merge``
classifiers; hub directories and bare state dicts), written back to timm, and transformers' Qwen2.5-VL tower
(``Qwen2_5_VisionTransformerPretrainedModel``, read from a whole ``qwen2_5_vl`` folder: the tower's tensors only) and
Qwen3-VL tower (``Qwen3VLVisionModel``, ``qwen3_vl``: timm's Qwen3 ViT with a Conv3d; its DeepStack mergers left out).

timm's Qwen3 ViT, as vitkit's config options: a pre-norm ViT of LayerNorms with a tanh-GELU MLP and a patch
projection with bias, no prefix tokens and no final norm; a learned 48 x 48 table resampled bilinearly with corners
aligned to the input grid (``pos_grid``, ``pos_interp='bilinear'``, ``pos_interp_align_corners``) plus axial RoPE on
patch indices, rows then columns, rotate-half (``rope_half``). The encoders (``_enc``) end in the patch merger:
each token normed, the 2 x 2 cells concatenated, Linear, GELU, Linear to the language model's width (``merge_size``,
``merge_dim``, ``pool='merge'``); the classifiers average the patches (``_merge``: the merged tokens), normalise
the mean without a learned scale and apply a head.

Qwen2.5-VL's tower: RMSNorm, a SwiGLU MLP with biases, the same RoPE with no table, no final norm; a Conv3d over
two frames without bias, which for a still image (the frame repeated) is the 2-D kernel summed over time, read so;
window attention in the blocks not in ``fullatt_block_indexes`` (windows of ``window_size`` pixels: 8 x 8 patches
of 14 px; ``attn_window``, ``global_blocks``), and the patch merger (RMSNorm) at the end. transformers' image
processor packs the patches of several images into one sequence with their ``grid_thw``:
:func:`packed_batch_from_hf` makes of it the :class:`~vitkit.models.packed.PackedBatch` vitkit's model takes.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, FormatError, InputError
from ..models.config import Provenance, ViTConfig
from ..models.packed import PackedBatch
from ..models.registry import QWEN3
from .files import check_fields
from .inference import described_config
from .hf import GELUS
from .internvl import tower_config, tower_weights
from .names import Names, rename
from .radio import packed_gate_value
from .timm_families import write_timm_state

# timm's definitions: (embed_dim, depth, num_heads, mlp_ratio) of each size.
TIMM_SIZES = {"88m": (768, 12, 12, 4.0), "306m": (1024, 24, 16, 4.0), "416m": (1152, 27, 16, 4304 / 1152)}
ARCHITECTURE = re.compile(r"qwen3_vit_(88m|306m|416m)(_enc|_merge)?")
# The arguments of timm's Qwen3VitEncoder / Qwen3VitClassifier, in timm's words.
TIMM_DEFAULTS: dict[str, Any] = dict(
    img_size=768, patch_size=16, in_chans=3, num_classes=0, out_features=0, embed_dim=1152, depth=27, num_heads=16,
    mlp_ratio=4304 / 1152, merge_size=2, pos_embed_grid_size=48, rope_temperature=10000.0, norm_eps=1e-6,
    final_norm=True, encoder_pool="", act_layer=None,
)
MODEL_ARG_KINDS = dict(img_size="size", patch_size="count", in_chans="count", num_classes="whole",
                       out_features="whole", embed_dim="count", depth="count", num_heads="count",
                       mlp_ratio="positive", merge_size="count", pos_embed_grid_size="count",
                       rope_temperature="positive", norm_eps="positive", final_norm="flag")
TIMM_NAMES = Names([
    ("pos_embed", "pos_embed.weight"),
    ("{rest}", "{rest}"),
])

HF_TYPES = ("qwen2_5_vl", "qwen2_5_vl_vision", "qwen3_vl", "qwen3_vl_vision")
HF_PREFIXES = ("model.visual.", "visual.")  # transformers 5's and earlier names of the tower in a whole model
HF_FIELDS = dict(depth="count", hidden_size="count", intermediate_size="count", num_heads="count",
                 in_channels="count", patch_size="count", spatial_merge_size="count", temporal_patch_size="count",
                 window_size="count", out_hidden_size="count")
HF_NAMES = Names([
    ("patch_embed.proj.weight", "patch_embed.proj.weight"),
    ("blocks.{i}.mlp.down_proj.{rest}", "blocks.{i}.mlp.fc2.{rest}"),
    ("blocks.{i}.{rest}", "blocks.{i}.{rest}"),
    ("merger.ln_q.weight", "merger.norm.weight"),
    ("merger.mlp.0.{rest}", "merger.fc1.{rest}"),
    ("merger.mlp.2.{rest}", "merger.fc2.{rest}"),
])
HF3_NAMES = Names([  # Qwen3-VL's tower: timm's Qwen3 ViT with a Conv3d
    ("patch_embed.proj.{rest}", "patch_embed.proj.{rest}"),
    ("pos_embed.weight", "pos_embed.weight"),
    ("blocks.{i}.mlp.linear_fc1.{rest}", "blocks.{i}.mlp.fc1.{rest}"),
    ("blocks.{i}.mlp.linear_fc2.{rest}", "blocks.{i}.mlp.fc2.{rest}"),
    ("blocks.{i}.{rest}", "blocks.{i}.{rest}"),
    ("merger.norm.{rest}", "merger.norm.{rest}"),
    ("merger.linear_fc1.{rest}", "merger.fc1.{rest}"),
    ("merger.linear_fc2.{rest}", "merger.fc2.{rest}"),
])


def is_qwen3_architecture(architecture: str) -> bool:
    """Whether a timm architecture name (a pretrained tag after '.' aside) is one of timm's Qwen3 ViTs."""
    return ARCHITECTURE.fullmatch(architecture.split(".")[0]) is not None


def is_qwen3_state(state: dict[str, Any]) -> bool:
    """Whether a bare state dict is timm's Qwen3 ViT with its patch merger, or a classifier around its encoder."""
    return any(key.endswith("merger.fc1.weight") for key in state) or "encoder.pos_embed" in state


def refuse_unmerged_qwen3(state: dict[str, Any], overrides: dict[str, Any], source: str) -> None:
    """Refuse a bare state dict that is timm's plain ViT without prefix tokens or any norm, or timm's Qwen3 ViT
    encoder pooling the mean (no merger): their keys are the same, and Qwen3's RoPE is not in the weights; told by
    ``rope`` in ``overrides`` (rope='none': the plain ViT)."""
    if "rope" in overrides or "pos_embed" not in state or not any(key.startswith("blocks.") for key in state):
        return
    if not {"cls_token", "reg_token", "norm.weight", "fc_norm.weight", "norm_pre.weight"} & state.keys():
        raise CheckpointError(f"{source}: a timm state dict without prefix tokens or norms after the blocks, as both "
                              f"timm's plain ViT and its Qwen3 ViT encoder pooling the mean (qwen3_vit_*_enc, "
                              f"global_pool='avg': rotary embeddings not saved in the weights) have; load the Qwen3 "
                              f"ViT from its timm hub directory, or pass rope='none' to read a plain ViT")


# ---------------------------------------------------------------------------------------------- timm
def qwen3_fields(args: dict[str, Any], encoder: bool, source: Any) -> dict[str, Any]:
    """vitkit's config fields for timm's Qwen3 ViT built with ``args`` (its definition's, then ``model_args``): the
    encoder (``encoder``, pooled by ``global_pool``) or the classifier (``encoder_pool``, then the mean)."""
    a = {**TIMM_DEFAULTS, **args}
    pool = a.get("global_pool", "merge" if encoder else "avg")
    merge = pool == "merge" if encoder else a["encoder_pool"] == "merge"
    refused = [reason for reason, bad in [
        (f"act_layer={a['act_layer']!r}", a["act_layer"] not in (None, "gelu_tanh")),
        (f"global_pool={pool!r} (no pooling; the patch tokens are forward_features)",
         pool not in (("merge", "avg") if encoder else ("avg",))),
        (f"encoder_pool={a['encoder_pool']!r}", not encoder and a["encoder_pool"] not in ("", "merge")),
    ] if bad]
    if refused:
        raise CheckpointError(f"{source}: a Qwen3 ViT with {', '.join(refused)}, which vitkit does not compute")
    dim, size, grid = a["embed_dim"], a["img_size"], a["pos_embed_grid_size"]
    fields = dict(QWEN3, image_size=tuple(size) if isinstance(size, list) else size, patch_size=a["patch_size"],
                  in_chans=a["in_chans"], dim=dim, depth=a["depth"], num_heads=a["num_heads"],
                  mlp_dim=int(dim * a["mlp_ratio"]), ln_eps=float(a["norm_eps"]), pos_grid=(grid, grid),
                  rope_theta=float(a["rope_temperature"]))
    if merge:
        fields.update(merge_size=a["merge_size"], merge_dim=a["out_features"], pool="merge")
    if not encoder:
        fields.update(pool="gap", fc_norm=True, fc_norm_scale=False, final_norm=a["final_norm"],
                      num_classes=a["num_classes"])
    elif pool == "avg":
        fields.update(pool="gap")
    return fields


def read_timm_qwen3(state: dict[str, torch.Tensor], architecture: str, model_args: dict[str, Any],
                    overrides: dict[str, Any], source: str) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm state dict of ``architecture`` (one of the Qwen3 ViTs) built with ``model_args``."""
    size, kind = ARCHITECTURE.fullmatch(architecture.split(".")[0]).groups()
    dim, depth, heads, ratio = TIMM_SIZES[size]
    args = {**dict(embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=ratio),
            **(dict(encoder_pool="merge") if kind == "_merge" else {}), **model_args}
    fields = qwen3_fields(args, kind == "_enc", source)
    state = {key.removeprefix("encoder."): value for key, value in state.items()}
    provenance = Provenance(format="timm", source=source, name=architecture, normalization="google", crop_pct=1.0)
    config = described_config(fields, overrides, provenance, source)
    return config, rename(state, TIMM_NAMES, source)


def read_bare_qwen3(state: dict[str, torch.Tensor], overrides: dict[str, Any], source: str
                    ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A bare state dict of timm's Qwen3 ViT, read by timm's definitions: sizes from the shapes, the encoder with
    its merger or the classifier whose weights have a head (``encoder.*``)."""
    classifier = any(key.startswith("encoder.") for key in state)
    tower = {key.removeprefix("encoder."): value for key, value in state.items()}
    kernel, table = tower["patch_embed.proj.weight"], tower["pos_embed"]
    dim, blocks = kernel.shape[0], {int(key.split(".")[1]) for key in tower if key.startswith("blocks.")}
    size = next((name for name, (width, depth, _, _) in TIMM_SIZES.items()
                 if (width, depth) == (dim, len(blocks))), None)
    if "num_heads" not in overrides and size is None:
        raise CheckpointError(f"{source}: a Qwen3 ViT of width {dim} and {len(blocks)} blocks, none of timm's sizes "
                              f"(88m, 306m, 416m): its head count is not in the weights; pass num_heads=...")
    merged = "merger.fc1.weight" in tower
    args = dict(embed_dim=dim, depth=len(blocks), num_heads=overrides.get("num_heads") or TIMM_SIZES[size][2],
                mlp_ratio=tower["blocks.0.mlp.fc1.weight"].shape[0] / dim if blocks else 4.0,
                patch_size=kernel.shape[-1], in_chans=kernel.shape[1], pos_embed_grid_size=math.isqrt(table.shape[1]),
                out_features=tower["merger.fc2.weight"].shape[0] if "merger.fc2.weight" in tower else 0,
                num_classes=tower["head.weight"].shape[0] if "head.weight" in tower else 0,
                img_size=768 // kernel.shape[-1] * kernel.shape[-1])
    if merged:
        args["merge_size"] = math.isqrt(tower["merger.fc1.weight"].shape[1] // dim)
    name = f"qwen3_vit_{size or '88m'}" + (("_merge" if merged else "") if classifier else "_enc")
    if not classifier and not merged:
        raise CheckpointError(f"{source}: a Qwen3 ViT encoder without its patch merger, whose pooling the weights do "
                              f"not tell; load its timm hub directory")
    return read_timm_qwen3(state, name, args, overrides, source)


def read_timm_qwen3_directory(state: dict[str, torch.Tensor], hub: dict[str, Any], overrides: dict[str, Any],
                              path: Path) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm hub directory of a Qwen3 ViT: its architecture's definition, then ``model_args``, then its pooling."""
    model_args = hub.get("model_args", {})
    check_fields(model_args, MODEL_ARG_KINDS, path.parent / "config.json", within="model_args.")
    args = {key: value for key, value in model_args.items() if key in TIMM_DEFAULTS or key == "global_pool"}
    if "global_pool" in hub:
        args["global_pool"] = hub["global_pool"]
    return read_timm_qwen3(state, str(hub["architecture"]), args, overrides, str(path))


def is_qwen3(config: ViTConfig) -> bool:
    """Whether ``config`` is timm's Qwen3 ViT (a table with rope and no prefix tokens, its merger or the classifier
    of it)."""
    return (config.rope == "axial" and config.pos_embed == "learned" and config.pos_interp_align_corners
            and not config.num_prefix_tokens and config.norm == "layer" and config.attn_window == 0)


def timm_qwen3_architecture(config: ViTConfig, path: Any) -> tuple[str, dict[str, Any]]:
    """timm's definition (with ``model_args``) that builds ``config``'s model; what it cannot hold is refused."""
    c = config
    classifier = c.pool == "gap" and c.num_classes > 0
    grid = c.pos_grid or c.grid_size
    differ = [f"{name}={getattr(c, name)!r}" for name, value in QWEN3.items()
              if name not in ("final_norm", "num_classes") and getattr(c, name) != value]
    differ += [reason for reason, bad in [
        (f"pool={c.pool!r}", c.pool not in ("merge", "gap")), ("a non-square table", grid[0] != grid[1]),
        ("a classifier without timm's norm after the mean (fc_norm, no scale)",
         classifier and not (c.fc_norm and not c.fc_norm_scale)),
        ("a mean without a head other than the encoder's (no norm)", not classifier and c.pool == "gap" and
         (c.fc_norm or c.merge_size)),
        ("representation_size", c.representation_size), ("a hybrid backbone", c.backbone is not None),
        (f"mlp={c.mlp!r}", c.mlp != "gelu"), ("qk_norm", c.qk_norm), ("layer_scale", c.layer_scale is not None),
        ("rope options of other families", (c.rope_xy, c.rope_split, c.rope_offset, c.rope_ref_grid, c.rope_grid)
         != (False, False, 0.0, None, "index")),
        ("patch_bias=False, proj_bias=False or k_bias=False", not (c.patch_bias and c.proj_bias and c.k_bias)),
    ] if bad]
    if differ:
        raise FormatError(f"cannot write {path}: timm's Qwen3 ViT cannot hold {', '.join(differ)}")
    size = next((name for name, (dim, depth, _, _) in TIMM_SIZES.items() if (dim, depth) == (c.dim, c.depth)), "88m")
    architecture = f"qwen3_vit_{size}" + ("_enc" if not classifier else "_merge" if c.merge_size else "")
    args = dict(img_size=list(c.image_size), patch_size=c.patch_size, in_chans=c.in_chans, embed_dim=c.dim,
                depth=c.depth, num_heads=c.num_heads, mlp_ratio=(c.mlp_dim + 0.5) / c.dim, norm_eps=c.ln_eps,
                pos_embed_grid_size=grid[0], rope_temperature=c.rope_theta, merge_size=c.merge_size or 2,
                out_features=c.merge_dim, global_pool="merge" if c.pool == "merge" else "avg")
    if classifier:
        args.update(num_classes=c.num_classes, final_norm=c.final_norm, encoder_pool="merge" if c.merge_size else "")
    return architecture, args


def timm_qwen3_state(model: torch.nn.Module, classifier: bool) -> dict[str, torch.Tensor]:
    """``model``'s weights in timm's names (a classifier's encoder under ``encoder.``)."""
    state = {TIMM_NAMES.to_theirs(name): tensor.detach().cpu().contiguous()
             for name, tensor in model.state_dict().items()}
    return {f"encoder.{name}" if classifier and not name.startswith("head.") else name: tensor
            for name, tensor in state.items()}


def write_timm_qwen3(model: torch.nn.Module, path: Path) -> Path:
    """``model`` for timm: a ``.safetensors`` state dict, or (any other path) a timm hub directory whose
    ``config.json`` names the architecture and the ``model_args`` that build it, written atomically."""
    architecture, args = timm_qwen3_architecture(model.config, path)
    classifier = not architecture.endswith("_enc")
    first_conv = "encoder.patch_embed.proj" if classifier else "patch_embed.proj"
    return write_timm_state(path, model.config, architecture, args, timm_qwen3_state(model, classifier), first_conv)


# ---------------------------------------------------------------------------------------------- transformers
def read_hf_qwen_vl(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                    ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF directory of a Qwen2.5-VL or Qwen3-VL model, or of its vision tower alone, read by its model_type."""
    read = read_hf_qwen3_vl if hf["model_type"].startswith("qwen3_vl") else read_hf_qwen2_5_vl
    return read(directory, hf, overrides)


def read_hf_qwen3_vl(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                     ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF directory of a whole Qwen3-VL model (``qwen3_vl``), whose vision tower is read (the language model
    left out), or of the tower alone (``qwen3_vl_vision``): timm's Qwen3 ViT with the Conv3d summed over its frames;
    its DeepStack mergers (tokens of middle blocks for the language model) are left out with a warning."""
    path = directory / "config.json"
    whole = hf["model_type"] == "qwen3_vl"
    tower, within = tower_config(hf, whole, "a Qwen3-VL", path)
    check_fields(tower, {**HF_FIELDS, "num_position_embeddings": "count"}, path, required=(
        "hidden_size", "intermediate_size", "depth", "num_heads", "out_hidden_size"), within=within)
    act, rope = tower.get("hidden_act", "gelu_pytorch_tanh"), tower.get("rope_parameters") or {}
    cells = tower.get("num_position_embeddings", 2304)
    if act not in GELUS or rope.get("rope_type", "axial") != "axial" or math.isqrt(cells) ** 2 != cells:
        raise CheckpointError(f"{path}: {within}hidden_act={act!r}, rope_parameters={rope}, num_position_embeddings="
                              f"{cells}; vitkit computes a GELU, axial rope and a square table")
    patch, side = tower.get("patch_size", 16), math.isqrt(cells)
    fields = dict(QWEN3, gelu=GELUS[act], rope_theta=float(rope.get("rope_theta", 10000.0)), pos_grid=(side, side),
                  merge_size=tower.get("spatial_merge_size", 2), merge_dim=tower["out_hidden_size"], pool="merge",
                  dim=tower["hidden_size"], depth=tower["depth"], num_heads=tower["num_heads"],
                  mlp_dim=tower["intermediate_size"], patch_size=patch, in_chans=tower.get("in_channels", 3),
                  image_size=side * patch)
    state = tower_weights(directory, HF_PREFIXES if whole else None, "Qwen3-VL", "its language model is")
    deepstack = sorted({key.split(".")[1] for key in state if key.startswith("deepstack_merger_list.")})
    if deepstack:
        warnings.warn(f"{directory}: Qwen3-VL's {len(deepstack)} DeepStack mergers (deepstack_merger_list.*, tokens "
                      f"of middle blocks) are left out; vitkit reads the tower and its last merger", stacklevel=4)
    state = {key: value for key, value in state.items() if not key.startswith("deepstack_merger_list.")}
    state = _hf_layout(rename(state, HF3_NAMES, str(path)), tower.get("temporal_patch_size", 2), path)
    if "pos_embed.weight" in state:
        state["pos_embed.weight"] = state["pos_embed.weight"][None]
    provenance = Provenance(format="hf-qwen3_vl", source=str(directory), normalization="google", crop_pct=1.0)
    return described_config(fields, overrides, provenance, path), state


def read_hf_qwen2_5_vl(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                       ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF directory of a whole Qwen2.5-VL model (``qwen2_5_vl``), whose vision tower is read (the language model
    left out), or of the tower alone (``qwen2_5_vl_vision``); its output is the patch merger's tokens."""
    path = directory / "config.json"
    whole = hf["model_type"] == "qwen2_5_vl"
    tower, within = tower_config(hf, whole, "a Qwen2.5-VL", path)
    check_fields(tower, HF_FIELDS, path, required=("hidden_size", "intermediate_size", "depth", "num_heads",
                                                   "out_hidden_size"), within=within)
    act, rope = tower.get("hidden_act", "silu"), tower.get("rope_parameters") or {}
    if act != "silu" or rope.get("rope_type", "axial") != "axial":
        raise CheckpointError(f"{path}: {within}hidden_act={act!r}, rope_parameters={rope}; vitkit computes "
                              f"Qwen2.5-VL's silu (SwiGLU) and axial rope")
    patch, merge = tower.get("patch_size", 14), tower.get("spatial_merge_size", 2)
    window = tower.get("window_size", 112) // merge // patch
    full = tower.get("fullatt_block_indexes", [7, 15, 23, 31])
    if not window or not (isinstance(full, list) and all(isinstance(i, int) and 0 <= i < tower["depth"]
                                                          for i in full)):
        raise CheckpointError(f"{path}: {within}window_size={tower.get('window_size', 112)}, "
                              f"fullatt_block_indexes={full!r}; expected windows of at least {merge} patches of "
                              f"{patch} px a side and indices of the {tower['depth']} blocks")
    fields = dict(class_token=False, pos_embed="none", rope="axial", rope_half=True,
                  rope_theta=float(rope.get("rope_theta", 10000.0)), norm="rms", ln_eps=1e-6, mlp="swiglu",
                  qkv_bias=True, patch_bias=False, final_norm=False, num_classes=0, pool="merge", merge_size=merge,
                  merge_dim=tower["out_hidden_size"], attn_window=window * merge, global_blocks=tuple(full),
                  dim=tower["hidden_size"], depth=tower["depth"], num_heads=tower["num_heads"],
                  mlp_dim=tower["intermediate_size"], patch_size=patch, in_chans=tower.get("in_channels", 3),
                  image_size=32 * patch)  # HF's config names no image size: 448 px for 14 px patches
    state = tower_weights(directory, HF_PREFIXES if whole else None, "Qwen2.5-VL", "its language model is")
    provenance = Provenance(format="hf-qwen2_5_vl", source=str(directory), normalization="clip", crop_pct=1.0)
    config = described_config(fields, overrides, provenance, path)
    return config, _hf_layout(rename(state, HF_NAMES, str(path)), tower.get("temporal_patch_size", 2), path)


def _hf_layout(state: dict[str, torch.Tensor], frames: int, source: Path) -> dict[str, torch.Tensor]:
    """The tower's tensors in vitkit's shapes: the Conv3d kernel summed over its ``frames`` (a still image is the
    frame repeated; summed in float64, rounded once), SwiGLU's gate and value packed as ``fc1``, gate first."""
    kernel = state.get("patch_embed.proj.weight")
    if kernel is not None:
        if kernel.ndim != 5 or kernel.shape[2] != frames:
            raise CheckpointError(f"{source}: patch_embed.proj.weight of shape {tuple(kernel.shape)}; expected a "
                                  f"Conv3d kernel over temporal_patch_size={frames} frames")
        state["patch_embed.proj.weight"] = kernel.double().sum(dim=2).to(kernel.dtype)
    return packed_gate_value(state)


def packed_batch_from_hf(pixel_values: torch.Tensor, grid_thw: torch.Tensor, merge_size: int = 2,
                         temporal_patch_size: int = 2, in_chans: int = 3) -> PackedBatch:
    """transformers' Qwen2-VL / Qwen2.5-VL image processor output as a :class:`PackedBatch`: ``pixel_values`` (N,
    C * T * P * P), each patch flattened (C, T, ph, pw) with the image repeated over the T = ``temporal_patch_size``
    frames, the images one after another, each image's patches in ``merge_size`` x ``merge_size`` cells (the cells
    row by row, the patches of a cell row by row); ``grid_thw`` (I, 3), each image's (1, rows, columns). The result
    holds each patch's first frame, flattened (ph, pw, C) as vitkit's batches are, with its (row, column)."""
    if grid_thw.ndim != 2 or grid_thw.shape[-1] != 3 or grid_thw.is_floating_point() or not len(grid_thw):
        raise InputError(f"grid_thw of shape {tuple(grid_thw.shape)} ({grid_thw.dtype}); expected integer (images, 3) "
                         f"rows of (frames, rows, columns)")
    if pixel_values.ndim != 2 or not pixel_values.is_floating_point():
        raise InputError(f"pixel_values of shape {tuple(pixel_values.shape)} ({pixel_values.dtype}); expected "
                         f"floating-point (patches, {in_chans} x {temporal_patch_size} x P x P)")
    count, width = pixel_values.shape
    patch = math.isqrt(width // (in_chans * temporal_patch_size))
    if in_chans * temporal_patch_size * patch * patch != width:
        raise InputError(f"pixel_values rows of {width} values; expected {in_chans} channels x "
                         f"{temporal_patch_size} frames x P x P")
    frames, rows, cols = grid_thw.unbind(-1)
    if (frames != 1).any() or (rows % merge_size).any() or (cols % merge_size).any() or (rows < 1).any() or (
            cols < 1).any():
        raise InputError(f"grid_thw {grid_thw.tolist()}; expected (1, rows, columns) of still images, rows and columns "
                         f"multiples of merge_size={merge_size} (a video has several frames: vitkit reads images)")
    sizes = rows * cols
    if int(sizes.sum()) != count:
        raise InputError(f"grid_thw {grid_thw.tolist()} holds {int(sizes.sum())} patches; pixel_values has {count} "
                         f"rows, expected one per patch")
    pixels = pixel_values.reshape(count, in_chans, temporal_patch_size, patch, patch)
    if not (pixels == pixels[:, :, :1]).all():
        raise InputError(f"pixel_values whose {temporal_patch_size} frames differ: a video; vitkit reads still images "
                         f"(each frame repeated, as the image processor makes them)")
    images = torch.repeat_interleave(torch.arange(len(grid_thw)), sizes)
    index = torch.arange(count) - (sizes.cumsum(0) - sizes)[images]
    k, across = merge_size, (cols // merge_size)[images]
    cell, within = torch.div(index, k * k, rounding_mode="floor"), index % (k * k)
    coords = torch.stack([torch.div(cell, across, rounding_mode="floor") * k + torch.div(within, k,
                                                                                           rounding_mode="floor"),
                          cell % across * k + within % k], dim=-1)
    patches = pixels[:, :, 0].permute(0, 2, 3, 1).reshape(count, -1)
    return PackedBatch(patches, coords, images, torch.stack([rows, cols], dim=-1).long())
