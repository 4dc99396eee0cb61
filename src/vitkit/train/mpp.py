"""Masked patch prediction, the paper's self-supervised objective (section 4.6, appendix B.1.2).

Half of the patch embeddings are corrupted -- of those, 80% replaced by a learnable [mask] embedding,
10% by a random other patch embedding, 10% left as they are -- and the encoder predicts, from its final
representation of every corrupted patch, that patch's 3-bit mean colour (512 classes for RGB). The
appendix's alternatives are options: the 4x4-downsized patch in 3 bits per value (``downsized``), or
every pixel by L2 regression (``pixels``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..models.vit import VisionTransformer

TARGETS = ("mean-colour", "downsized", "pixels")


@dataclass
class Corruption:
    """Which patches are corrupted, and how: (B, N) boolean masks; ``mask | random | kept == corrupted``."""

    corrupted: torch.Tensor
    mask: torch.Tensor
    random: torch.Tensor

    @property
    def kept(self) -> torch.Tensor:
        return self.corrupted & ~self.mask & ~self.random


def draw_corruption(batch: int, num_patches: int, ratio: float = 0.5, mask_prob: float = 0.8,
                    random_prob: float = 0.1, generator: torch.Generator | None = None,
                    device: torch.device | str = "cpu") -> Corruption:
    """Corrupt exactly round(ratio * N) patches of each image; each one independently becomes the
    [mask] embedding (``mask_prob``), a random other patch (``random_prob``) or stays (the rest)."""
    if not (0.0 < ratio <= 1.0 and mask_prob >= 0 and random_prob >= 0 and mask_prob + random_prob <= 1.0):
        raise ValueError(f"need 0 < ratio <= 1 and mask_prob + random_prob <= 1, got ratio={ratio}, "
                         f"mask_prob={mask_prob}, random_prob={random_prob}")
    count = max(1, round(ratio * num_patches))
    scores = torch.rand(batch, num_patches, generator=generator, device=device)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    corrupted = ranks < count
    how = torch.rand(batch, num_patches, generator=generator, device=device)
    mask = corrupted & (how < mask_prob)
    random = corrupted & (how >= mask_prob) & (how < mask_prob + random_prob)
    return Corruption(corrupted, mask, random)


def corrupt(patches: torch.Tensor, mask_token: torch.Tensor, corruption: Corruption,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """Apply a corruption to (B, N, D) patch embeddings; random replacements come from any other patch
    position in the batch."""
    batch, num_patches, dim = patches.shape
    flat = patches.reshape(batch * num_patches, dim)
    total = batch * num_patches
    source = torch.randint(0, total - 1, (total,), generator=generator, device=patches.device)
    own = torch.arange(total, device=patches.device)
    source = source + (source >= own).long()  # skip the patch itself: "a random *other* patch"
    replaced = torch.where(corruption.random.reshape(-1, 1), flat[source], flat)
    replaced = torch.where(corruption.mask.reshape(-1, 1), mask_token.reshape(1, dim).to(flat.dtype), replaced)
    return replaced.reshape(batch, num_patches, dim)


def patch_pixels(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C, P, P) patches in raster order (the order of the patch tokens)."""
    batch, channels = pixels.shape[:2]
    patches = pixels.unfold(2, patch_size, patch_size).unfold(3, patch_size, patch_size)
    return patches.permute(0, 2, 3, 1, 4, 5).reshape(batch, -1, channels, patch_size, patch_size)


def quantise(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Values in [0, 1] -> integers in [0, 2^bits)."""
    levels = 2 ** bits
    return (values * levels).floor().clamp(0, levels - 1).long()


def mean_colour_classes(pixels: torch.Tensor, patch_size: int, bits: int = 3) -> torch.Tensor:
    """Each patch's mean colour in ``bits`` bits per channel, as one class index: (B, N) in
    [0, 2^(bits * C)); for RGB and 3 bits, r * 64 + g * 8 + b."""
    levels = quantise(patch_pixels(pixels, patch_size).mean(dim=(-1, -2)), bits)  # (B, N, C)
    weights = (2 ** bits) ** torch.arange(levels.shape[-1] - 1, -1, -1, device=levels.device)
    return (levels * weights).sum(-1)


def downsized_levels(pixels: torch.Tensor, patch_size: int, size: int = 4, bits: int = 3) -> torch.Tensor:
    """Each patch averaged down to size x size, each value in ``bits`` bits: (B, N, C * size * size)."""
    patches = patch_pixels(pixels, patch_size)
    batch, num, channels = patches.shape[:3]
    pooled = F.adaptive_avg_pool2d(patches.reshape(-1, channels, patch_size, patch_size), size)
    return quantise(pooled, bits).reshape(batch, num, channels * size * size)


class MaskedPatchPrediction(nn.Module):
    """A ViT encoder with a [mask] embedding and a linear prediction head over its patch tokens.

    ``pixel_mean``/``pixel_std`` undo the input normalisation so targets are computed on [0, 1] colours.
    After pre-training, ``self.encoder`` is an ordinary ViT to save and fine-tune.
    """

    def __init__(self, encoder: VisionTransformer, target: str = "mean-colour", bits: int = 3,
                 ratio: float = 0.5, mask_prob: float = 0.8, random_prob: float = 0.1,
                 pixel_mean: float | tuple[float, ...] = 0.5, pixel_std: float | tuple[float, ...] = 0.5,
                 downsized_size: int = 4):
        super().__init__()
        if target not in TARGETS:
            raise ValueError(f"target={target!r}, expected one of {TARGETS}")
        config = encoder.config
        self.encoder, self.target, self.bits = encoder, target, bits
        self.ratio, self.mask_prob, self.random_prob = ratio, mask_prob, random_prob
        self.downsized_size = downsized_size
        channels, patch = config.in_chans, config.effective_patch_size  # a hybrid token covers more pixels
        self.register_buffer("pixel_mean", torch.as_tensor(pixel_mean, dtype=torch.float32).reshape(-1, 1, 1))
        self.register_buffer("pixel_std", torch.as_tensor(pixel_std, dtype=torch.float32).reshape(-1, 1, 1))
        self.mask_token = nn.Parameter(torch.empty(1, 1, config.dim))
        nn.init.normal_(self.mask_token, std=0.02)
        outputs = {"mean-colour": 2 ** (bits * channels),
                   "downsized": channels * downsized_size ** 2 * 2 ** bits,
                   "pixels": channels * patch * patch}[target]
        self.head = nn.Linear(config.dim, outputs)

    def targets(self, images: torch.Tensor) -> torch.Tensor:
        pixels = (images.float() * self.pixel_std + self.pixel_mean).clamp(0, 1)
        patch = self.encoder.config.effective_patch_size
        if self.target == "mean-colour":
            return mean_colour_classes(pixels, patch, self.bits)
        if self.target == "downsized":
            return downsized_levels(pixels, patch, self.downsized_size, self.bits)
        return patch_pixels(pixels, patch).flatten(2)

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss over corrupted patches, and its accuracy (or mean squared error for ``pixels``)."""
        encoder = self.encoder
        patches, grid = encoder.patch_embed(images)
        corruption = draw_corruption(patches.shape[0], patches.shape[1], self.ratio, self.mask_prob,
                                     self.random_prob, generator, patches.device)
        corrupted = encoder.embed_patches(corrupt(patches, self.mask_token, corruption, generator), grid)
        tokens = encoder.encode(corrupted, encoder.rope_tables(grid, corrupted.device), encoder.grid_masks(grid))
        chosen = corruption.corrupted
        predictions = self.head(tokens[:, encoder.num_prefix_tokens:][chosen])
        targets = self.targets(images)[chosen]
        if self.target == "pixels":
            loss = F.mse_loss(predictions.float(), targets)
            return loss, {"mse": loss.detach()}
        if self.target == "downsized":
            predictions = predictions.reshape(*targets.shape, 2 ** self.bits)
        loss = F.cross_entropy(predictions.float().flatten(0, -2), targets.flatten())
        correct = (predictions.argmax(-1) == targets).float().mean()
        return loss, {"accuracy": correct}
