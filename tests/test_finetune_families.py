"""Fine-tuning from the families: a new zero head on the pooled representation (both DeiT heads, the
attention pool kept), at a new resolution, with tables without prefix rows resampled as timm does."""

import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.train import resolve
from vitkit.data.survey import Geometry
from vitkit.train.run import build_model

timm = pytest.importorskip("timm")


def pretrained(name, path):
    torch.manual_seed(0)
    model = vitkit.create_model(name, image_size=16, patch_size=4, dim=16, depth=2, num_heads=2, mlp_dim=32,
                                in_chans=1, num_classes=7 if "DeiT" in name else 0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save(path)
    return model


@pytest.mark.parametrize("name", ["DINOv2-S/14-reg4", "DeiT3-S/16", "DeiT-S/16-distilled", "SigLIP-B/16",
                                  "CLIP-B/16"])
def test_family_checkpoints_are_prepared_for_finetuning(tmp_path, name):
    from timm.layers import resample_abs_pos_embed

    source = pretrained(name, tmp_path / "pre")
    recipe = resolve("paper-finetune", overrides=dict(model=dict(init=str(tmp_path / "pre"), image_size=24),
                                                      data=dict(dataset="digits")))
    model = build_model(recipe, [str(d) for d in range(10)], Geometry((8, 8), {1: "digits #0"}))
    prefix = source.config.pos_prefix_tokens
    expected = resample_abs_pos_embed(source.pos_embed.weight, (6, 6), (4, 4), num_prefix_tokens=prefix,
                                      interpolation="bicubic", antialias=False)
    torch.testing.assert_close(model.pos_embed.weight, expected, atol=1e-6, rtol=0)
    for head in (model.head, model.head_dist) if model.head_dist is not None else (model.head,):
        assert head.out_features == 10 and not head.weight.any() and not head.bias.any()
    kept = {k: v for k, v in source.state_dict().items() if not k.startswith(("head", "pos_embed"))}
    for key, value in kept.items():  # registers, gammas, the attention pool, the blocks
        torch.testing.assert_close(model.state_dict()[key], value)
    assert model(torch.randn(2, 1, 24, 24)).shape == (2, 10)


def test_vitkit_finetune_from_dinov2_with_registers(tmp_path):
    pretrained("DINOv2-S/14-reg4", tmp_path / "pre")
    assert main(["finetune", str(tmp_path / "pre"), "--dataset", "digits", "--image-size", "24", "--steps", "2",
                 "--batch-size", "16", "--run-dir", str(tmp_path / "ft")]) == 0
    model = vitkit.load(tmp_path / "ft" / "model")
    assert (model.config.reg_tokens, model.config.image_size, model.config.num_classes) == (4, (24, 24), 10)
    assert model.pos_embed.weight.shape == (1, 36, 16)
