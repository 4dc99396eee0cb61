"""Google's ``.npz`` checkpoints: the paper's and AugReg's (vit_jax) and big_vision's.

Arrays are Flax parameters named by their path: ``Transformer/encoderblock_3/MlpBlock_3/Dense_0/kernel``.
The layouts differ in the block's module names (pre-Linen ``LayerNorm_0, MultiHeadDotProductAttention_1,
LayerNorm_2, MlpBlock_3``; Linen ``..._0, ..._0, LayerNorm_1, MlpBlock_0``), the prefix (none,
``opt/target/``, ``params/``), big_vision's position table (no [class] slot, since it adds positions
before prepending the token) and its scan-stacked blocks (``encoderblock/`` with a leading depth axis).
Files carry no numerics: they are Google's (tanh GELU, LayerNorm eps 1e-6, StdConv (w-m)/(std+1e-5),
GroupNorm eps 1e-6).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..atomic import atomic_file
from ..errors import CheckpointError, FormatError
from ..models.config import Provenance, ViTConfig
from ..models.vit import VisionTransformer
from .files import read_npz_arrays
from .inference import infer_config, options_in_use
from .names import Names, fuse_qkv, split_qkv, with_prefix_positions

PREFIXES = ("opt/target/", "params/", "")
GOOGLE_NUMERICS = dict(gelu="tanh", ln_eps=1e-6, std_conv="std+eps", std_conv_eps=1e-5, gn_eps=1e-6,
                       pos_interp="bilinear", pos_interp_align_corners=True)

_BLOCK = "Transformer/encoderblock_{i}/"
# The first entry for each vitkit name is the layout written (vit_jax's released files, pre-Linen).
NAMES = Names([
    ("embedding", "patch_embed.proj"),
    ("cls", "cls_token"),
    ("Transformer/posembed_input/pos_embedding", "pos_embed.weight"),
    ("pos_embedding", "pos_embed.weight"),  # big_vision
    ("Transformer/encoder_norm", "norm"),
    ("pre_logits", "pre_logits.0"),
    ("head", "head"),
    *[(_BLOCK + theirs, "blocks.{i}." + ours) for theirs, ours in [
        ("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2"), ("LayerNorm_1", "norm2"),
        *[(f"{mha}/{part}", f"attn.{short}") for mha in ("MultiHeadDotProductAttention_1",
                                                           "MultiHeadDotProductAttention_0")
          for part, short in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "proj"))],
        *[(f"{mlp}/Dense_{n}", f"mlp.fc{n + 1}") for mlp in ("MlpBlock_3", "MlpBlock_0") for n in (0, 1)],
    ]],
    ("conv_root", "patch_embed.backbone.stem.conv"),
    ("gn_root", "patch_embed.backbone.stem.norm"),
    *[(f"block{{I}}/unit{{J}}/{theirs}", f"patch_embed.backbone.stages.{{i}}.{{j}}.{ours}") for theirs, ours in [
        ("conv1", "conv1"), ("conv2", "conv2"), ("conv3", "conv3"), ("gn1", "norm1"), ("gn2", "norm2"),
        ("gn3", "norm3"), ("conv_proj", "downsample.conv"), ("gn_proj", "downsample.norm")]],
])


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the file as float32 (bf16, stored by JAX as raw 2-byte values, widened exactly)."""
    arrays = read_npz_arrays(path)
    for key, array in arrays.items():
        if array.dtype.kind == "V" and array.dtype.itemsize == 2:  # bfloat16: the top half of a float32
            arrays[key] = (array.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif array.dtype.kind != "f":
            raise CheckpointError(f"{path}: array {key!r} has dtype {array.dtype}, expected floats")
        else:
            arrays[key] = array.astype(np.float32)
    return arrays


def _strip_prefix(arrays: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    for prefix in PREFIXES:
        if f"{prefix}embedding/kernel" in arrays:
            return {key.removeprefix(prefix): value for key, value in arrays.items() if key.startswith(prefix)}
    raise CheckpointError(f"{path}: not a Google ViT checkpoint: no 'embedding/kernel' under any of the "
                          f"prefixes {[p or '(none)' for p in PREFIXES]}; found {sorted(arrays)[:6]} ...")


def _unstack_scan(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """big_vision's scanned encoder (one ``encoderblock/`` with a leading depth axis) as separate blocks."""
    out = {}
    for key, value in arrays.items():
        if key.startswith("Transformer/encoderblock/"):
            for depth, layer in enumerate(value):
                out[key.replace("encoderblock/", f"encoderblock_{depth}/")] = layer
        else:
            out[key] = value
    return out


def _ours(key: str) -> str | None:
    full = NAMES.to_ours(key)
    if full is not None or "/" not in key:
        return full
    module, leaf = key.rsplit("/", 1)
    ours = NAMES.to_ours(module)
    if ours is None or leaf not in ("kernel", "scale", "bias"):
        return None
    return f"{ours}.{'bias' if leaf == 'bias' else 'weight'}"


def _to_torch(name: str, array: np.ndarray) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if name in ("pos_embed.weight", "cls_token") or tensor.ndim == 1:
        return tensor
    if tensor.ndim == 4:  # conv kernel HWIO -> OIHW
        return tensor.permute(3, 2, 0, 1).contiguous()
    if re.search(r"\.attn\.[qkv]\.", name):  # (D, heads, head_dim) kernel or (heads, head_dim) bias
        return tensor.reshape(tensor.shape[0], -1).t().contiguous() if tensor.ndim == 3 else tensor.reshape(-1)
    if name.endswith("attn.proj.weight") and tensor.ndim == 3:  # (heads, head_dim, D)
        return tensor.reshape(-1, tensor.shape[-1]).t().contiguous()
    return tensor.t().contiguous()  # dense kernel (in, out) -> (out, in)


def _to_flax(name: str, tensor: torch.Tensor, heads: int) -> np.ndarray:
    tensor = tensor.detach().float().cpu()
    if name in ("pos_embed.weight", "cls_token") or tensor.ndim == 1:
        if re.search(r"\.attn\.[qkv]\.bias", name):
            tensor = tensor.reshape(heads, -1)
        return tensor.numpy()
    if tensor.ndim == 4:
        return tensor.permute(2, 3, 1, 0).contiguous().numpy()
    if re.search(r"\.attn\.[qkv]\.", name):
        return tensor.t().reshape(tensor.shape[1], heads, -1).contiguous().numpy()
    if name.endswith("attn.proj.weight"):
        return tensor.t().reshape(heads, -1, tensor.shape[0]).contiguous().numpy()
    return tensor.t().contiguous().numpy()


def read_npz(path: Path, overrides: dict[str, Any]) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    arrays = _unstack_scan(_strip_prefix(read_arrays(path), path))
    state, unknown = {}, []
    for key, array in arrays.items():
        name = _ours(key)
        if name is None:
            unknown.append(key)
        else:
            state[name] = _to_torch(name, array)
    if unknown:
        raise CheckpointError(f"{path}: {len(unknown)} arrays vitkit cannot place: "
                              + ", ".join(sorted(unknown)[:20]) + (" ..." if len(unknown) > 20 else ""))
    query = arrays.get("Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel",
                       arrays.get("Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"))
    # big_vision evaluates the whole image resized to the model's size: crop_pct 1.
    provenance = Provenance(format="google-npz", source=str(path), crop_pct=1.0)
    settings: dict[str, Any] = dict(GOOGLE_NUMERICS, provenance=provenance)
    if query is not None and query.ndim == 3:
        settings["num_heads"] = query.shape[1]
    return infer_config(fuse_qkv(state), overrides, str(path), **settings)


def _warn_of_numerics(config: ViTConfig, path: Path) -> None:
    """A .npz holds weights only: its readers assume Google's numerics. Say which of this model's differ,
    since the written file will then compute slightly different outputs."""
    relevant = ("gelu", "ln_eps") + (("std_conv", "std_conv_eps", "gn_eps") if config.backbone is not None else ())
    differ = [f"{name}={getattr(config, name)!r} (read back as {GOOGLE_NUMERICS[name]!r})"
              for name in relevant if getattr(config, name) != GOOGLE_NUMERICS[name]]
    if differ:
        warnings.warn(f"{path}: Google's .npz stores no numerics and is read with Google's; this model's "
                      f"{', '.join(differ)} will not travel, so outputs read back differ slightly", stacklevel=3)


def write_npz(model: VisionTransformer, path: str | Path) -> Path:
    """Export to vit_jax's layout (what the paper's code, AugReg and timm read), atomically."""
    config, path = model.config, Path(path)
    unsupported = [reason for reason, bad in [
        ("fc_norm", config.fc_norm),
        (f"pos_embed={config.pos_embed!r} (only 'learned')", config.pos_embed != "learned"),
        ("pool='gap' with a [class] token", config.pool == "gap" and config.class_token),
        ("a bias-free qkv", not config.qkv_bias),
    ] if bad] + options_in_use(config)
    if unsupported:
        raise FormatError(f"cannot write {path}: Google's layout has no {', '.join(unsupported)}")
    _warn_of_numerics(config, path)
    arrays = {}
    config, state = with_prefix_positions(config, model.state_dict())
    for name, tensor in split_qkv(state).items():
        flax = NAMES.to_theirs(name)
        if flax is None:
            module, leaf = name.rsplit(".", 1)
            is_norm = module.rsplit(".", 1)[-1].startswith("norm")
            flax = f"{NAMES.to_theirs(module)}/{'bias' if leaf == 'bias' else 'scale' if is_norm else 'kernel'}"
        arrays[flax] = _to_flax(name, tensor, config.num_heads)
    with atomic_file(path, "wb") as handle:
        np.savez(handle, **arrays)
    return path
