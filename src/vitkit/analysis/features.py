"""Dense patch features: the final state of every patch token laid out on the image's patch grid, at any image
size the model runs (what DINOv3 users take for segmentation, depth and retrieval), and their principal
components as colours; an image-text model's patches embedded into its joint space, and their cosine with texts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
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


def patch_embeddings(model: nn.Module, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, E, rows, cols): each patch token of ``tokens`` (B, T, D, after the final norm) put through what the
    model does to its pooled state, as if that patch were the only token pooled: the attention pool over it alone
    (pool='map': SigLIP's), the norm on the pooled output, the pre-logits layer and the head; for an image-text
    model's image tower the head is its projection into the space the texts embed into (CLIP's: final norm and
    projection)."""
    c = model.config
    if model.soft_pool is not None or c.summary_tokens or model.head_dist is not None:
        raise ConfigError("patch embeddings: the model pools several outputs (soft tokens, summary tokens or a "
                          "distillation head), not one vector a patch could stand in for")
    patches = grid_features(tokens, grid, c.num_prefix_tokens)
    batch, dim, rows, cols = patches.shape
    alone = patches.flatten(2).transpose(1, 2).reshape(-1, 1, dim)  # every patch a sequence of one token
    pooled = model.attn_pool(alone) if model.attn_pool is not None else alone[:, 0]
    embedded = model.head(model.pre_logits(model.fc_norm(pooled)))
    return embedded.reshape(batch, rows * cols, -1).transpose(1, 2).reshape(batch, -1, rows, cols)


def text_similarity(model: nn.Module, tokens: torch.Tensor, grid: tuple[int, int],
                    texts: torch.Tensor) -> torch.Tensor:
    """(B, K, rows, cols): the cosine of each patch's embedding (``patch_embeddings``) with each of the ``texts``
    (K, E) embedded by the text tower of the same image-text model."""
    patches = F.normalize(patch_embeddings(model, tokens, grid).float(), dim=1)
    return torch.einsum("berc,ke->bkrc", patches, F.normalize(texts.float(), dim=-1))
