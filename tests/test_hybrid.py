"""The hybrid (section 3.2): sizes of the named variants, and the numerics of its BiT ResNet checked
against closed forms and timm's layers."""

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.models import model_config
from vitkit.models.resnet import StdConv2d, same_padding, standardize
from vitkit.models.stats import config_parameters

# 224 px, 1000 classes: the same as timm's vit_tiny_r_s16_p8_224, vit_small_r26_s32_224, ...
EXPECTED = {"R+ViT-Ti/16": 6_337_704, "R26+ViT-S/32": 36_431_912, "R26+ViT-B/32": 101_383_976,
            "R50+ViT-B/16": 98_659_112, "R50+ViT-L/32": 328_994_856}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_counts_are_exact(name):
    assert config_parameters(model_config(name)) == EXPECTED[name]


def test_r50_b16_is_the_papers_hybrid():
    config = model_config("r50+vit-b/16")
    assert config.backbone == (3, 4, 9) and config.patch_size == 1 and config.grid_size == (14, 14)
    assert config.provenance.name == "R50+ViT-B/16"
    assert vitkit.ViTConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="unknown hybrid 'R26\\+ViT-B/16'"):
        model_config("R26+ViT-B/16")


def test_weight_standardisation_formulas():
    w = torch.randn(4, 3, 3, 3)
    centred = w - w.mean(dim=(1, 2, 3), keepdim=True)
    std = w.std(dim=(1, 2, 3), unbiased=False, keepdim=True)
    torch.testing.assert_close(standardize(w, "std+eps", 1e-5), centred / (std + 1e-5))
    torch.testing.assert_close(standardize(w, "sqrt(var+eps)", 1e-8), centred / (std ** 2 + 1e-8).sqrt())
    tiny = torch.tensor([[[[0.0, 1e-3]]]], dtype=torch.float64)  # std 5e-4: where eps goes shows
    assert standardize(tiny, "std+eps", 1e-5)[0, 0, 0, 1] == pytest.approx(5e-4 / (5e-4 + 1e-5), rel=1e-12)
    assert standardize(tiny, "sqrt(var+eps)", 1e-5)[0, 0, 0, 1] == pytest.approx(5e-4 / (25e-8 + 1e-5) ** 0.5,
                                                                                 rel=1e-12)


@pytest.mark.parametrize("size,expected", [(4, (0, 1)), (5, (1, 1)), (7, (1, 1))])
def test_same_padding_is_tensorflows(size, expected):
    x = torch.ones(1, 1, size, size)
    padded = same_padding(x, 3, 2)
    before, after = expected
    assert padded.shape[-1] == size + before + after
    assert padded[0, 0, 1, :before].sum() == 0 and padded[0, 0, 1, size + before:].sum() == 0


def test_std_conv_matches_timms_std_conv2d_same():
    timm_layers = pytest.importorskip("timm.layers")
    peer = timm_layers.StdConv2dSame(8, 16, 3, stride=2, eps=1e-8)
    ours = StdConv2d(8, 16, 3, 2, formula="sqrt(var+eps)", eps=1e-8)
    ours.weight.data.copy_(peer.weight.data)
    x = torch.randn(2, 8, 9, 10)
    torch.testing.assert_close(ours(x), peer(x), atol=1e-5, rtol=0)
    expected = F.conv2d(F.pad(x, (0, 1, 1, 1)), standardize(peer.weight, "sqrt(var+eps)", 1e-8), stride=2)
    torch.testing.assert_close(ours(x), expected)


def test_hybrid_forward_and_numerics_from_config():
    model = vitkit.create_model("R26+ViT-S/32", image_size=64, depth=1, backbone=(1, 1), num_classes=3,
                                gn_eps=1e-3).eval()
    assert model.patch_embed.backbone.stem.norm.eps == 1e-3
    assert model.patch_embed.backbone.stages[1][0].conv2.stride == (2, 2)
    assert model(torch.randn(2, 3, 64, 96)).shape == (2, 3)
    with pytest.raises(ValueError, match="multiples of the patch size 8"):
        model(torch.randn(1, 3, 60, 64))
