"""Dense patch features: the final state of every patch token laid out on the image's patch grid, at any image
size the model runs (what DINOv3 users take for segmentation, depth and retrieval), and their principal
components as colours."""

from __future__ import annotations

import torch
from torch import nn

from .embeddings import principal_components


def encode(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """All (B, T, D) tokens after the final norm (``forward_features``) and the (rows, cols) patch grid."""
    z, grid = model.embed(images)
    return model.encode(z, model.rope_tables(grid, z.device), model.grid_masks(grid)), grid


def grid_features(tokens: torch.Tensor, grid: tuple[int, int], prefix: int) -> torch.Tensor:
    """(B, prefix + rows*cols, D) tokens -> the patch tokens as a (B, D, rows, cols) map, prefix tokens dropped."""
    batch, count, dim = tokens.shape
    rows, cols = grid
    if count != prefix + rows * cols:
        raise ValueError(f"{count} tokens do not hold {prefix} prefix tokens and a {rows}x{cols} grid")
    return tokens[:, prefix:].transpose(1, 2).reshape(batch, dim, rows, cols)


def patch_features(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Dense features (B, D, H/P, W/P) of (B, C, H, W) images whose sides are multiples of the patch P: the
    patch tokens after the final norm, [class], distillation and register tokens dropped, in row-major grid
    order (a hybrid's grid is H/stride, W/stride). Runs under the caller's grad mode, with the model as it is."""
    tokens, grid = encode(model, images)
    return grid_features(tokens, grid, model.config.num_prefix_tokens)


def feature_colours(features: torch.Tensor, components: int = 3) -> torch.Tensor:
    """A (D, rows, cols) map's first ``components`` principal components over its patches as (rows, cols,
    components) values in [0, 1] (each component scaled by its own min and max; signs so that each direction's
    largest-magnitude loading is positive): the usual picture of dense features, three components as RGB."""
    dim, rows, cols = features.shape
    patches = features.reshape(dim, -1).T.double()
    directions, _ = principal_components(patches, components)
    projected = (patches - patches.mean(0)) @ directions.T
    low, high = projected.amin(0), projected.amax(0)
    scaled = (projected - low) / torch.where(high > low, high - low, torch.ones_like(high))
    return scaled.reshape(rows, cols, -1).float()
