"""What the embeddings learned (figure 7 left and centre): the principal components of the
patch-embedding filters and the cosine similarity between position embeddings, or, in a model with rotary
position embeddings, between the patches' rotary phases."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError


def position_similarity(table: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Cosine similarity of each patch's position embedding with every other, (rows, cols, rows, cols):
    entry [i, j] is the map of patch (i, j) against the whole grid."""
    rows, cols = grid
    if table.ndim != 2 or table.shape[0] != rows * cols:
        raise ValueError(f"position table of shape {tuple(table.shape)} does not hold a {rows}x{cols} grid "
                         f"(expected ({rows * cols}, dim))")
    unit = F.normalize(table.double(), dim=-1)
    return (unit @ unit.T).float().reshape(rows, cols, rows, cols)


def position_table(model: nn.Module) -> tuple[torch.Tensor, tuple[int, int]]:
    """The patch part of a model's position embeddings, (rows*cols, dim), at its native grid (a table kept on a
    grid of its own, C-RADIO's, as the model resamples it there); learned, 2-D and sine-cosine tables alike."""
    embedding = getattr(model, "pos_embed", None)
    if embedding is None:
        raise ConfigError("the model has no position embeddings (pos_embed='none')")
    grid = tuple(model.config.grid_size)
    with torch.no_grad():
        table = embedding(grid)
    return table[0, embedding.prefix:].detach(), grid


def rope_phases(model: nn.Module, grid: tuple[int, int] | None = None) -> torch.Tensor:
    """The rotary phase vector of every patch, (rows*cols, width): its row of [cos; sin] in ``model.rope``'s
    table for ``grid`` (the model's native grid by default), prefix rows dropped. With learned mixed frequencies
    (RoPE-ViT) the rows of every block and head are concatenated, so the cosine similarity of two vectors is the
    average over blocks and heads of the per-head similarities (every head's row has the same norm)."""
    rope = getattr(model, "rope", None)
    if rope is None:
        raise ConfigError("the model has no rotary position embeddings (rope='none')")
    grid = tuple(model.config.grid_size if grid is None else grid)
    with torch.no_grad():
        table = rope(grid, next(model.parameters()).device)  # (2, [depth, heads,] prefix + N, d)
    patches = table[..., model.config.num_prefix_tokens:, :].detach().float().cpu()
    return patches.movedim(-2, 0).reshape(grid[0] * grid[1], -1)


def principal_components(samples: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` principal directions (count, features) of (n, features) samples, in float64, and the
    fraction of the variance each explains. Signs are fixed so that every direction's largest-magnitude entry is
    positive (an SVD's signs are arbitrary)."""
    samples = samples.double()
    _, singular, directions = torch.linalg.svd(samples - samples.mean(0), full_matrices=False)
    directions = directions[:count]
    directions = directions * directions.gather(1, directions.abs().argmax(1, keepdim=True)).sign()
    variance = singular ** 2
    return directions, variance[:len(directions)] / variance.sum()


def filter_components(weight: torch.Tensor, count: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` principal components of a (filters, channels, P, P) bank, shaped like a
    filter, and the fraction of the variance each explains (signs as ``principal_components`` fixes them)."""
    if weight.ndim != 4:
        raise ValueError(f"expected filters of shape (filters, channels, height, width), got {tuple(weight.shape)}")
    components, explained = principal_components(weight.detach().reshape(weight.shape[0], -1), count)
    return components.reshape(len(components), *weight.shape[1:]).float(), explained.float()


def patch_filters(model: nn.Module) -> torch.Tensor:
    """The linear patch projection E as (D, channels, P, P) pixel filters."""
    projection = getattr(getattr(model, "patch_embed", None), "proj", None)
    channels = model.config.in_chans
    if not isinstance(projection, nn.Conv2d) or projection.in_channels != channels:
        raise ConfigError("the model has no pixel patch projection to analyse (a hybrid embeds CNN features, "
                         f"expected patch_embed.proj to be a Conv2d over {channels} image channels)")
    return projection.weight.detach()
