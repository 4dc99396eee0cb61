"""The analyses on models with several prefix tokens (DINOv2 registers, DeiT's distillation token, SigLIP
without [class]): prefix tokens stay out of the patch grid, rollout and attention distance read the right rows."""

import numpy as np
import pytest
import torch

import vitkit
from vitkit.analysis import attention_maps, attention_rollout, mean_attention_distance
from vitkit.analysis.attention import patch_distances
from vitkit.cli import main

SMALL = dict(image_size=(32, 48), depth=2, dim=32, num_heads=2, mlp_dim=64)


def family(name, **overrides):
    torch.manual_seed(0)
    model = vitkit.create_model(name, patch_size=8, **{**SMALL, **overrides}).eval()
    with torch.no_grad():  # LayerScale at 1e-5 would hide the blocks' attention behind the residual
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def rollout_by_hand(attn, prefix, readout_row):
    """Abnar & Zuidema's rollout over the full token set, written out: mean over heads, (A + I) / 2 per
    layer, rows renormalised, multiplied from the first layer; then ``readout_row`` over the patches."""
    joint = None
    for layer in attn:
        a = layer.mean(1)
        a = (a + torch.eye(a.shape[-1])) / 2
        a = a / a.sum(-1, keepdim=True)
        joint = a if joint is None else torch.bmm(a, joint)
    row = joint[:, readout_row, prefix:] if readout_row is not None else joint[:, prefix:, prefix:].mean(1)
    return row


@pytest.mark.parametrize("name,prefix,readout", [
    ("DINOv2-S/14-reg4", 5, 0), ("DeiT-S/16-distilled", 2, 0), ("SigLIP-B/16", 0, None),
])
def test_prefix_tokens_stay_out_of_the_grid(name, prefix, readout):
    model = family(name)
    x = torch.randn(2, 3, 32, 48)
    attn = attention_maps(model, x)
    assert attn.shape[-1] == prefix + 4 * 6
    maps = attention_rollout(attn, (4, 6))
    expected = rollout_by_hand(attn, prefix, readout).reshape(2, 4, 6)
    expected = expected / expected.amax(dim=(1, 2), keepdim=True)
    torch.testing.assert_close(maps, expected, atol=1e-5, rtol=0)
    # attention distance: patch queries over patch keys only, renormalised, averaged over queries and images
    patches = attn[..., prefix:, prefix:]
    patches = patches / patches.sum(-1, keepdim=True)
    by_hand = (patches * patch_distances((4, 6), 8).float()).sum(-1).mean(dim=(1, 3))
    torch.testing.assert_close(mean_attention_distance(attn, (4, 6), 8), by_hand, atol=1e-4, rtol=1e-5)


def test_analyze_a_dinov2_checkpoint_with_registers(tmp_path):
    family("DINOv2-S/14-reg4", image_size=32).save(tmp_path / "dino")
    assert main(["analyze", str(tmp_path / "dino"), "--out", str(tmp_path / "out"), "--batch-size", "2"]) == 0
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"attention_distance.png", "filters.png", "position_similarity.png", "rollout_000.png",
            "rollout_001.png", "index.html"} <= written
    assert np.load(tmp_path / "out" / "position_similarity.npy").shape == (4, 4, 4, 4)
    assert np.load(tmp_path / "out" / "rollout.npy").shape == (2, 4, 4)
