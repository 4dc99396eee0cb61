"""What the attention of a ViT shows (section 4.5): the probabilities themselves, attention rollout
(Abnar & Zuidema, 2020) back onto the image, and the mean attention distance of every head.

Attention tensors here are shaped (layers, batch, heads, tokens, tokens); the first ``tokens - rows*cols``
tokens are prefix tokens ([class], distillation, register tokens, in that order; none in a model without them),
the rest the patches of a (rows, cols) grid in row-major order, square or not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import ConfigError

HEAD_FUSIONS = ("mean", "max", "min")
# The output whose row of the rolled-out attention is drawn, as the report names it: what the head reads under
# pool='token', 'gap' and 'map' (the attention pool's probe weighs the last layer's tokens by its attention).
READOUTS = {"token": "the [class] token", "mean": "the mean of the patch tokens",
            "probe": "the attention pool's probe"}
POOL_READOUTS = {"token": "token", "gap": "mean", "map": "probe", "soft": "mean", "merge": "mean"}


def capture_attention(model: nn.Module, images: torch.Tensor, layers: Sequence[int] | None = None
                      ) -> tuple[torch.Tensor, tuple[int, int]]:
    """The post-softmax attention of ``layers`` (all by default, negatives count from the end) and the
    token grid it spans, from ``model.forward_intermediates`` (explicit softmax, same weights as the
    fused path, which itself stays untouched)."""
    with torch.no_grad():
        seen = model.forward_intermediates(images, attention=True)
    depth = len(seen.attentions)
    chosen = range(depth) if layers is None else list(layers)
    bad = [layer for layer in chosen if not -depth <= layer < depth]
    if bad:
        raise ConfigError(f"layers {bad} out of range for a model with {depth} blocks "
                         f"(expected 0..{depth - 1} or -{depth}..-1)")
    return torch.stack([seen.attentions[layer] for layer in chosen]), tuple(seen.grid)


def attention_maps(model: nn.Module, images: torch.Tensor, layers: Sequence[int] | None = None) -> torch.Tensor:
    """Attention probabilities of shape (layers, batch, heads, tokens, tokens)."""
    return capture_attention(model, images, layers)[0]


def _as_stack(attn: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    attn = attn if isinstance(attn, torch.Tensor) else torch.stack(list(attn))
    if attn.ndim != 5 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError("expected attention of shape (layers, batch, heads, tokens, tokens), "
                         f"got {tuple(attn.shape)}")
    return attn.float()


def _split_tokens(tokens: int, grid: tuple[int, int] | None) -> tuple[int, tuple[int, int]]:
    """(prefix tokens, grid); a missing grid is taken to be square behind 0 or 1 prefix token."""
    if grid is None:
        for prefix in (0, 1):
            side = math.isqrt(tokens - prefix)
            if side and side * side == tokens - prefix:
                return prefix, (side, side)
        raise ValueError(f"{tokens} tokens do not form a square grid; pass grid=(rows, cols)")
    rows, cols = grid
    if tokens < rows * cols:
        raise ValueError(f"grid {tuple(grid)} has {rows * cols} patches but the attention spans {tokens} tokens")
    return tokens - rows * cols, (rows, cols)


def _discard_weakest(attn: torch.Tensor, ratio: float) -> torch.Tensor:
    """Zero the weakest ``ratio`` of each (tokens, tokens) map (Gildenblat's rollout option)."""
    flat = attn.flatten(1)
    count = int(flat.shape[1] * ratio)
    if count == 0:
        return attn
    weakest = flat.topk(count, dim=1, largest=False).indices
    return flat.scatter(1, weakest, 0.0).view_as(attn)


def rollout_matrix(attn: torch.Tensor | Sequence[torch.Tensor], head_fusion: str = "mean",
                   discard_ratio: float = 0.0) -> torch.Tensor:
    """Attention rolled out through all layers, (batch, tokens, tokens): per layer the heads are fused,
    the identity is added for the residual connection, (A + I) / 2, rows are renormalised, and the
    layers are multiplied, last layer on the left."""
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion={head_fusion!r}, expected one of {HEAD_FUSIONS}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio={discard_ratio} must be in [0, 1)")
    attn = _as_stack(attn)
    identity = torch.eye(attn.shape[-1], dtype=attn.dtype, device=attn.device)
    joint = None
    for layer in attn:
        fused = {"mean": layer.mean(1), "max": layer.amax(1), "min": layer.amin(1)}[head_fusion]
        fused = (_discard_weakest(fused, discard_ratio) + identity) / 2
        fused = fused / fused.sum(-1, keepdim=True)
        joint = fused if joint is None else fused @ joint
    return joint


def output_readout(model: nn.Module, readout: str | None = None) -> str:
    """The output of ``model``'s rollout: ``readout`` if given (checked against the model), else what its head
    reads (``POOL_READOUTS``): the [class] token (``"token"``) under pool='token', the mean of the patch tokens
    (``"mean"``) under pool='gap', the attention pool's probe (``"probe"``) under pool='map', the mean again under
    pool='soft' (Gemma 4's soft tokens are means of patches) and pool='merge' (Qwen's merger tokens read every patch,
    each its own cell's)."""
    config = model.config
    chosen = readout or POOL_READOUTS[config.pool]
    if chosen not in READOUTS:
        raise ConfigError(f"readout={chosen!r}, expected one of {list(READOUTS)}")
    if chosen == "token" and not config.class_token:
        raise ConfigError("readout='token' reads the [class] token, but the model has none "
                          f"({config.num_prefix_tokens} prefix tokens, all registers); use readout='mean'")
    if chosen == "probe" and config.pool != "map":
        raise ConfigError(f"readout='probe' reads the attention pool's probe, but the model pools by "
                          f"pool={config.pool!r}; use readout={POOL_READOUTS[config.pool]!r}")
    return chosen


def probe_attention(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """The attention of the pool's probe (pool='map') over the tokens it pools, (B, heads, tokens): the
    probabilities its fused attention uses, from the (B, T, D) final features (``forward_features``)."""
    pool, config = model.attn_pool, model.config
    tokens = features[:, 0 if config.pool_prefix else config.num_prefix_tokens:]
    batch, count, dim = tokens.shape
    width = dim // pool.num_heads
    query = pool.q(pool.probe).reshape(pool.num_heads, width)
    keys = pool.kv(tokens)[..., :dim].reshape(batch, count, pool.num_heads, width)
    return (torch.einsum("hd,bthd->bht", query, keys) * width ** -0.5).softmax(dim=-1)


def readout_weights(model: nn.Module, features: torch.Tensor, readout: str | None = None) -> torch.Tensor:
    """The output of ``model`` as weights over its last layer's tokens, (B, T), from its (B, T, D) final
    features: 1 on [class] (``"token"``), 1/N on each of the N patches (``"mean"``), or the probe's attention
    averaged over the pool's heads (``"probe"``); ``readout`` as :func:`output_readout` decides it."""
    chosen = output_readout(model, readout)
    if chosen != "probe":
        return _named_readout(chosen, features.shape[:2], model.config.num_prefix_tokens).to(features.device)
    probabilities = probe_attention(model, features).float().mean(dim=1)
    weights = features.new_zeros(features.shape[:2], dtype=torch.float32)
    weights[:, features.shape[1] - probabilities.shape[1]:] = probabilities
    return weights


def _named_readout(readout: str, shape: torch.Size, prefix: int) -> torch.Tensor:
    """(B, T) weights of a named output: 1 on [class] (``"token"``) or 1/N on each of the N patches (``"mean"``)."""
    weights = torch.zeros(shape)
    if readout == "token":
        weights[:, 0] = 1.0
    else:
        weights[:, prefix:] = 1.0 / (shape[1] - prefix)
    return weights


def attention_rollout(attn: torch.Tensor | Sequence[torch.Tensor], grid: tuple[int, int] | None = None,
                      head_fusion: str = "mean", discard_ratio: float = 0.0,
                      readout: str | nn.Module | torch.Tensor | None = None) -> torch.Tensor:
    """Where the output looks in the image, (batch, rows, cols), each map scaled to a maximum of 1; prefix
    tokens ([class], distillation, registers) never appear on the grid.

    The readout rule, the same as ``vitkit analyze``'s: the output is read where the model's head reads it,
    the [class] row of the rolled-out attention under pool='token', the mean of the patch rows under
    pool='gap', the probe's attention over the last layer's tokens times the rolled-out attention under
    pool='map'. ``readout`` says which: the model the attention came from (token and gap pooling; an attention
    pool's probe depends on the images, so pass its weights), the (B, T) weights of
    :func:`readout_weights` (any pooling), or a name, ``"token"`` or ``"mean"``. Attention alone cannot tell how a
    model pools: left out, it is ``"token"`` behind prefix tokens and ``"mean"`` without; :func:`rollout` follows
    the model's pooling from the images.
    """
    joint = rollout_matrix(attn, head_fusion, discard_ratio)
    prefix, (rows, cols) = _split_tokens(joint.shape[-1], grid)
    weights = _readout_row(readout, joint, prefix)
    maps = (weights.to(joint)[:, None, :] @ joint)[:, 0, prefix:].reshape(-1, rows, cols)
    peak = maps.amax(dim=(1, 2), keepdim=True)
    return maps / torch.where(peak > 0, peak, torch.ones_like(peak))


def _readout_row(readout: str | nn.Module | torch.Tensor | None, joint: torch.Tensor, prefix: int) -> torch.Tensor:
    """(B, T) weights of the output over the last layer's tokens, for ``attention_rollout``."""
    if isinstance(readout, torch.Tensor):
        if readout.shape != joint.shape[:2]:
            raise ValueError(f"readout weights of shape {tuple(readout.shape)}; expected (batch, tokens) = "
                             f"{tuple(joint.shape[:2])}")
        return readout
    if isinstance(readout, nn.Module):
        readout = output_readout(readout)
        if readout == "probe":
            raise ConfigError("the model pools by attention (pool='map'), whose probe weighs each image's tokens: "
                              "pass readout=readout_weights(model, features), or use rollout(model, images)")
    readout = readout or ("token" if prefix else "mean")
    if readout not in ("token", "mean"):
        raise ValueError(f"readout={readout!r}, expected 'token', 'mean', a model or (batch, tokens) weights")
    if readout == "token" and not prefix:
        raise ValueError("readout='token' needs a [class] token, but the attention has no prefix token")
    return _named_readout(readout, joint.shape[:2], prefix)


def rollout(model: nn.Module, images: torch.Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0,
            readout: str | None = None) -> torch.Tensor:
    """The attention rollout of ``model`` on ``images``, (batch, rows, cols), read out where its head reads
    (``attention_rollout``'s rule; ``readout`` names another output, see :func:`output_readout`)."""
    with torch.no_grad():
        seen = model.forward_intermediates(images, attention=True)
        weights = readout_weights(model, seen.features, readout)
    return attention_rollout(torch.stack(seen.attentions), tuple(seen.grid), head_fusion, discard_ratio, weights)


def patch_distances(grid: tuple[int, int], patch_size: float | tuple[float, float]) -> torch.Tensor:
    """Euclidean distance in pixels between the centres of every pair of patches, (N, N)."""
    (rows, cols), (height, width) = grid, (patch_size if isinstance(patch_size, tuple) else (patch_size,) * 2)
    y, x = torch.meshgrid(torch.arange(rows, dtype=torch.float64) * height,
                          torch.arange(cols, dtype=torch.float64) * width, indexing="ij")
    centres = torch.stack([y.flatten(), x.flatten()], dim=1)
    return (centres[:, None] - centres[None]).norm(dim=-1)


def mean_attention_distance(attn: torch.Tensor | Sequence[torch.Tensor], grid: tuple[int, int],
                            patch_size: float | tuple[float, float]) -> torch.Tensor:
    """Mean attention distance in input pixels, (layers, heads) (figure 7 right, figure 11).

    Per patch query, the attention-weighted distance between patch centres over the patch keys (prefix
    tokens dropped, rows renormalised over the patches), averaged over queries, then over images.
    ``patch_size`` is the pixel stride of a token: P for a ViT, 16 for a ResNet hybrid.
    """
    attn = _as_stack(attn)
    prefix, grid = _split_tokens(attn.shape[-1], grid)
    patches = attn[..., prefix:, prefix:]
    patches = patches / patches.sum(-1, keepdim=True).clamp_min(torch.finfo(patches.dtype).tiny)
    distances = patch_distances(grid, patch_size).to(patches)
    per_query = torch.einsum("lbhqk,qk->lbhq", patches, distances)
    return per_query.mean(dim=(1, 3))
