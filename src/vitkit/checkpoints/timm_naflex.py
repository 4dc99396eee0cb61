"""timm's NaFlexViT (one model for any aspect ratio, SigLIP 2's NaFlex, C-RADIO): the fields of its configuration that
vitkit reads, the definitions it knows, and its weights read into vitkit's layout (a linear embedding of
flattened patches becomes the patch kernel; the (1, rows, cols, D) position table a table of the patches)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import CheckpointError, FormatError
from ..models.config import Provenance, ViTConfig
from .inference import infer_config
from .names import Names, rename

# timm's NaFlexViT (one model for any aspect ratio, SigLIP 2's NaFlex): its configuration's fields, in timm's
# words, and those of its definitions vitkit reads; a position table of 16 x 16 by default, resampled per image.
NAFLEX_DEFAULTS: dict[str, Any] = dict(
    global_pool="map", fc_norm=None, final_norm=True, pool_include_prefix=False, pos_embed="learned",
    pos_embed_interp_mode="bicubic", pos_embed_antialias=True, pos_embed_align_corners=False,
    pos_embed_ar_preserving=False, pos_embed_use_grid_sample=False, act_layer=None, rope_type="",
    patchify_channels_last=True, attn_type="standard", num_kv_heads=None,
)
_RADIO = dict(global_pool="token", final_norm=False, pos_embed_interp_mode="bilinear", pos_embed_ar_preserving=True,
              pos_embed_antialias=False)
NAFLEX_ARCHITECTURES = {
    r"naflexvit_base_patch16_gap": dict(global_pool="avg", fc_norm=True),
    r"naflexvit_base_patch16_map": {},
    r"naflexvit_so150m2_patch16_reg1_gap": dict(global_pool="avg", fc_norm=True),
    r"naflexvit_so150m2_patch16_reg1_map": {},
    r"naflexvit_(base|so400m)_patch16_siglip": dict(act_layer="gelu_tanh", pos_embed_interp_mode="bilinear"),
    r"naflexvit_base_patch16_par_gap": dict(global_pool="avg", fc_norm=True, pos_embed_ar_preserving=True),
    # C-RADIO: a 128 x 128 table resized bilinearly to a square of the grid's longer side, then cropped; [class]
    # pooled, no final norm. Corners aligned as each checkpoint's own code: v3-B and v3-H only.
    r"naflexvit_(base|huge)_patch16_radio_v3": dict(_RADIO, pos_embed_align_corners=True),
    r"naflexvit_(large|giant)_patch16_radio_v3|naflexvit_\w+_patch16_radio_v4": _RADIO,
}
NAFLEX_HEADS = {832: 13, 1152: 16}
NAFLEX_NAMES = Names([
    ("embeds.pos_embed", "pos_embed.weight"),
    ("embeds.cls_token", "cls_token"),
    ("embeds.reg_token", "reg_token"),
    ("embeds.proj.{rest}", "patch_embed.proj.{rest}"),
    ("embeds.norm.{rest}", "patch_embed.norm.{rest}"),
    ("attn_pool.latent", "attn_pool.probe"),
    ("{rest}", "{rest}"),
])


def naflex_fields(args: dict[str, Any], source: Any) -> dict[str, Any]:
    """vitkit's config fields for timm NaFlexViT configuration ``args`` (the definition's, then model_args)."""
    a = {**NAFLEX_DEFAULTS, **args}
    refused = [f"{name}={a[name]!r}" for name, bad in [
        ("pos_embed", a["pos_embed"] not in ("learned", "none")),
        ("rope_type", a["rope_type"] not in ("", "none")), ("attn_type", a["attn_type"] != "standard"),
        ("pos_embed_use_grid_sample", a["pos_embed_use_grid_sample"]),
        ("num_kv_heads", a["num_kv_heads"] is not None), ("global_pool", a["global_pool"] not in ("avg", "map", "token")),
        ("act_layer", a["act_layer"] not in (None, "gelu", "gelu_tanh")),
    ] if bad]
    if refused:
        raise CheckpointError(f"{source}: a NaFlexViT with {', '.join(refused)}, which vitkit does not compute")
    fc_norm = a["fc_norm"] if a["fc_norm"] is not None else a["global_pool"] == "avg"
    return dict(pool={"avg": "gap", "map": "map", "token": "token"}[a["global_pool"]], fc_norm=fc_norm,
                pool_prefix=a["pool_include_prefix"], gelu="tanh" if a["act_layer"] == "gelu_tanh" else "exact",
                pos_interp=a["pos_embed_interp_mode"], pos_interp_antialias=a["pos_embed_antialias"],
                pos_interp_align_corners=a["pos_embed_align_corners"], pos_interp_crop=a["pos_embed_ar_preserving"],
                final_norm=a["final_norm"], no_embed_class=True, ln_eps=1e-6)


def read_timm_naflex(state: dict[str, torch.Tensor], args: dict[str, Any], overrides: dict[str, Any], source: str,
                     told_heads: int | None = None, told_size: Any = None) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A timm NaFlexViT: its linear patch embedding over flattened patches (channels last) becomes the patch
    kernel, its (1, rows, cols, D) position table a table of the patches alone, on a grid of rows x cols. A cropped
    table (C-RADIO's 128 x 128) keeps its grid apart from the native size ``told_size`` a hub directory names."""
    fields = naflex_fields(args, source)
    state = rename(state, NAFLEX_NAMES, source)
    proj, table = state["patch_embed.proj.weight"], state.get("pos_embed.weight")
    if proj.ndim == 2:
        channels = proj.shape[1]
        in_chans = args.get("in_chans", 3)
        patch = round((channels // in_chans) ** 0.5)
        if patch * patch * in_chans != channels:
            raise CheckpointError(f"{source}: embeds.proj.weight of shape {tuple(proj.shape)} is no patch kernel of "
                                  f"{in_chans} channels")
        if {**NAFLEX_DEFAULTS, **args}["patchify_channels_last"]:  # each patch flattened (row, column, channel)
            kernel = proj.reshape(-1, patch, patch, in_chans).permute(0, 3, 1, 2)
        else:
            kernel = proj.reshape(-1, in_chans, patch, patch)
        state["patch_embed.proj.weight"] = kernel
    if table is not None:
        rows, cols = table.shape[1:3]
        state["pos_embed.weight"] = table.reshape(1, rows * cols, -1)
        size = (rows * state["patch_embed.proj.weight"].shape[-1], cols * state["patch_embed.proj.weight"].shape[-1])
        overrides = {"image_size": size, **overrides} if rows != cols else overrides
    dim = state["patch_embed.proj.weight"].shape[0]
    heads = told_heads or NAFLEX_HEADS.get(dim)
    if heads:
        fields["num_heads"] = heads
    config, state = infer_config(state, overrides, source, **fields,
                                 provenance=Provenance(format="timm", source=source))
    if config.pos_interp_crop and told_size is not None and table is not None:
        config = own_table_grid(config, told_size, source)
    return config, state


def own_table_grid(config: ViTConfig, image_size: Any, source: str) -> ViTConfig:
    """``config``, whose learned table was read at the grid of its image size, with that grid kept as the table's
    own (``pos_grid``) and ``image_size`` as the native input size."""
    try:
        return config.replace(pos_grid=config.grid_size, image_size=image_size)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{source}: the native size {image_size!r} does not fit the model ({error})") from error


# ---------------------------------------------------------------------------------------------- writing
# The family options timm's NaFlexViT of C-RADIO holds (config.FAMILY_DEFAULTS' names).
NAFLEX_RADIO_OPTIONS = {"reg_tokens", "no_embed_class", "patch_bias", "layer_scale", "final_norm", "pos_interp_crop",
                        "pos_grid"}


def naflex_radio(model: torch.nn.Module, path: Any) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """A model with C-RADIO's cropped table as timm's ``naflexvit_*_radio``: the architecture (v3-B's when corners
    are aligned, v3-L's otherwise), the ``model_args`` that build it and the weights in its names; what that
    definition cannot hold (a summary of several class tokens: timm pools [class] alone) is refused, naming the
    fields."""
    c = model.config
    refused = [f"{name}={value!r}" for name, value in c.family_options().items() if name not in NAFLEX_RADIO_OPTIONS]
    refused += [reason for reason, bad in [
        (f"pos_interp={c.pos_interp!r} with antialias={c.pos_interp_antialias}",
         (c.pos_interp, c.pos_interp_antialias) != ("bilinear", False)),
        (f"ln_eps={c.ln_eps}", c.ln_eps != 1e-6), (f"gelu={c.gelu!r}", c.gelu == "quick"),
        ("no [class] token", not c.class_token), (f"pool={c.pool!r}", c.pool != "token"),
        ("representation_size", c.representation_size), ("a hybrid backbone", c.backbone is not None),
        ("a table with prefix rows", not c.no_embed_class), ("a dense head", c.dense_head != "none"),
    ] if bad]
    if refused:
        raise FormatError(f"cannot write {path}: timm's naflexvit_*_radio cannot hold {', '.join(refused)}")
    grid = c.pos_grid or c.grid_size
    args = dict(img_size=list(c.image_size), patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
                embed_dim=c.dim, depth=c.depth, num_heads=c.num_heads, mlp_ratio=(c.mlp_dim + 0.5) / c.dim,
                qkv_bias=c.qkv_bias, reg_tokens=c.reg_tokens, init_values=c.layer_scale, global_pool="token",
                final_norm=c.final_norm, pos_embed_grid_size=list(grid),
                pos_embed_align_corners=c.pos_interp_align_corners, act_layer="gelu_tanh" if c.gelu == "tanh" else "gelu")
    names = NAFLEX_NAMES
    state = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu()
        if name == "patch_embed.proj.weight":  # each patch flattened (row, column, channel)
            tensor = tensor.permute(0, 2, 3, 1).reshape(c.dim, -1)
        elif name == "pos_embed.weight":
            tensor = tensor.reshape(1, *grid, c.dim)
        state[names.to_theirs(name)] = tensor.contiguous()
    if not c.patch_bias:  # timm's embedding has a bias: a zero one is exactly none
        state["embeds.proj.bias"] = torch.zeros(c.dim, dtype=state["embeds.proj.weight"].dtype)
    corners = "base" if c.pos_interp_align_corners else "large"
    return f"naflexvit_{corners}_patch16_radio_v3", args, state
