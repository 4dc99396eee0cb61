import math

import pytest
import torch

import vitkit
from vitkit.train.mpp import (MaskedPatchPrediction, corrupt, downsized_levels, draw_corruption,
                              mean_colour_classes)


def encoder(**overrides):
    base = dict(image_size=16, patch_size=4, dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=0)
    return vitkit.create_model(vitkit.ViTConfig(**{**base, **overrides}))


def test_masking_statistics_match_the_paper():
    """50% of patches corrupted; of those 80% [mask], 10% random, 10% kept (within 5 sigma)."""
    generator = torch.Generator().manual_seed(0)
    c = draw_corruption(4000, 196, generator=generator)
    assert (c.corrupted.sum(1) == 98).all()  # exactly half of every image
    total = c.corrupted.sum().item()
    for part, expected in ((c.mask, 0.8), (c.random, 0.1), (c.kept, 0.1)):
        share = part.sum().item() / total
        assert abs(share - expected) < 5 * math.sqrt(expected * (1 - expected) / total)
    assert not (c.mask & c.random).any() and not (c.mask & ~c.corrupted).any()
    c = draw_corruption(1000, 10, ratio=0.3, mask_prob=0.5, random_prob=0.5, generator=generator)
    assert (c.corrupted.sum(1) == 3).all() and not c.kept.any()
    with pytest.raises(ValueError, match="mask_prob \\+ random_prob <= 1"):
        draw_corruption(1, 4, mask_prob=0.9, random_prob=0.2)


def test_corrupt_replaces_as_drawn():
    generator = torch.Generator().manual_seed(1)
    patches = torch.randn(3, 20, 8)
    c = draw_corruption(3, 20, generator=generator)
    token = torch.full((1, 1, 8), 7.0)
    out = corrupt(patches, token, c, generator)
    assert (out[c.mask] == 7.0).all()
    assert torch.equal(out[~c.corrupted | c.kept], patches[~c.corrupted | c.kept])
    flat = patches.reshape(-1, 8)
    for b, n in c.random.nonzero().tolist():
        matches = (flat == out[b, n]).all(1).nonzero().flatten().tolist()
        assert matches and b * 20 + n not in matches  # another patch's embedding, never its own


def test_mean_colour_targets_by_hand():
    image = torch.zeros(1, 3, 8, 8)
    image[0, :, :4, :4] = torch.tensor([0.0, 0.5, 0.99]).reshape(3, 1, 1)  # levels 0, 4, 7
    image[0, 0, :4, 4:6] = 1.0  # patch 1: red is half 1, half 0 -> mean 0.5 -> level 4
    image[0, :, 4:, :] = 1.0  # patches 2, 3: white -> level 7 in every channel
    classes = mean_colour_classes(image, 4).tolist()
    assert classes == [[0 * 64 + 4 * 8 + 7, 4 * 64, 511, 511]]
    gray = torch.full((1, 1, 4, 4), 0.3)
    assert mean_colour_classes(gray, 4).tolist() == [[2]]  # 1 channel: 8 classes


def test_downsized_targets_by_hand():
    image = torch.zeros(1, 1, 8, 8)
    image[0, 0, :, 4:] = torch.tensor([0.0, 0.25, 0.5, 0.75])  # right half: columns 0, .25, .5, .75
    levels = downsized_levels(image, 8, size=2, bits=2)  # one 8x8 patch -> 2x2 cells of 4x4 -> 2 bits
    # left cells average 0 -> level 0; right cells average 0.375 -> floor(0.375 * 4) = 1
    assert levels.tolist() == [[[0, 1, 0, 1]]]


@pytest.mark.parametrize("target,bits", [("mean-colour", 1), ("downsized", 2), ("pixels", 3)])
def test_objective_trains_the_encoder(target, bits):
    """On images of one random colour each, a corrupted patch's colour is predictable from the other
    patches: 150 Adam steps must take accuracy far above chance (or the pixel error far down)."""
    mpp = MaskedPatchPrediction(encoder(), target=target, bits=bits)
    optimiser = torch.optim.Adam(mpp.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    history = []
    for _ in range(150):
        images = (torch.rand(16, 3, 1, 1).expand(16, 3, 16, 16) - 0.5) / 0.5
        loss, metrics = mpp(images, generator)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        history.append({k: v.item() for k, v in metrics.items()})
    assert mpp.mask_token.grad is not None and mpp.encoder.patch_embed.proj.weight.grad.abs().sum() > 0
    if target == "pixels":
        assert sum(h["mse"] for h in history[-10:]) < 0.1 * 10 * history[0]["mse"]
    else:
        chance = 1 / 2 ** (bits * 3) if target == "mean-colour" else 1 / 2 ** bits
        assert sum(h["accuracy"] for h in history[-10:]) / 10 > max(0.6, 2 * chance)


def test_hybrid_targets_cover_each_tokens_pixels():
    """A hybrid's token stands for backbone stride x patch_size pixels: one target per token, from its own
    pixels (here a 32 px image, stem-only ResNet of stride 4, patch 2 -> 8 px squares in a 4x4 grid)."""
    mpp = MaskedPatchPrediction(encoder(image_size=32, patch_size=2, backbone=(), backbone_width=32, gn_groups=8))
    assert mpp.encoder.config.grid_size == (4, 4)
    image = torch.zeros(1, 3, 32, 32)
    image[0, :, :8, 8:16] = 1.0  # the second token's 8x8 square is white, all else black
    classes = mpp.targets((image - 0.5) / 0.5)
    assert classes.shape == (1, 16) and classes[0, 1] == 511 and (classes[0, [0, *range(2, 16)]] == 0).all()
    loss, _ = mpp((image - 0.5) / 0.5, torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)
