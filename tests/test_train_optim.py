"""Schedules and weight-decay masks against hand-computed values."""

import math

import pytest
import torch

from vitkit import ViTConfig, VisionTransformer
from vitkit.train import decay_mask, learning_rate, make_optimizer


@pytest.mark.parametrize("step, cosine, linear", [
    (0, 0.0, 0.0), (1, 0.5, 0.5), (2, 1.0, 1.0),          # linear warm-up over 2 steps
    (4, 0.5 * (1 + math.cos(math.pi / 4)), 0.75),          # progress (4 - 2) / 8 = 1/4
    (6, 0.5, 0.5), (10, 0.0, 0.0), (12, 0.0, 0.0),
])
def test_warmup_then_decay(step, cosine, linear):
    assert learning_rate(step, 1.0, 10, 2, "cosine") == pytest.approx(cosine)
    assert learning_rate(step, 1.0, 10, 2, "linear") == pytest.approx(linear)


def test_decay_to_end_lr_and_constant():
    assert learning_rate(6, 1.0, 10, 2, "linear", end_lr=0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert learning_rate(9, 0.3, 10, 0, "constant") == 0.3
    with pytest.raises(ValueError, match="unknown schedule 'step'"):
        learning_rate(0, 1.0, 10, 0, "step")


def _model():
    return VisionTransformer(ViTConfig(image_size=8, patch_size=4, dim=8, depth=1, num_heads=2, mlp_dim=16,
                                       num_classes=3, representation_size=8))


def test_weight_decay_only_on_weight_matrices():
    model = _model()
    decayed, plain = decay_mask(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decayed) == sorted([
        "patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc2.weight", "pre_logits.0.weight", "head.weight"])
    assert {"cls_token", "pos_embed.weight", "norm.weight", "blocks.0.norm1.bias", "head.bias"} <= {
        names[id(p)] for p in plain}
    assert len(decayed) + len(plain) == len(list(model.parameters()))


def test_adamw_first_step_closed_form():
    """Adam's first bias-corrected update is g / (|g| + eps); decoupled decay adds lr * wd * w."""
    model = _model()
    lr, wd = 0.01, 0.1
    optimizer = make_optimizer(model, "adamw", lr, wd)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    optimizer.step()
    adam = lr * 0.5 / (0.5 + 1e-8)
    w = dict(model.named_parameters())
    torch.testing.assert_close(w["head.weight"], before["head.weight"] * (1 - lr * wd) - adam)
    torch.testing.assert_close(w["cls_token"], before["cls_token"] - adam)


def test_sgd_momentum_without_decay():
    model = _model()
    optimizer = make_optimizer(model, "sgd", 0.1, 0.0, momentum=0.9)
    before = model.head.bias.detach().clone()
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
    torch.testing.assert_close(model.head.bias, before - 0.1 * (1 + 1.9))  # buffers 1, then 0.9 + 1
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        make_optimizer(model, "lamb", 0.1)
