import pytest
import torch

import vitkit
from vitkit.models import model_config
from vitkit.models.stats import config_parameters, forward_flops

# Parameter counts with 1000 classes at 224 px (issue 2; the same as timm's and big_vision's models).
EXPECTED = {
    "ViT-Ti/16": 5_717_416, "ViT-S/16": 22_050_664, "ViT-S/32": 22_878_952,
    "ViT-B/8": 86_576_872, "ViT-B/16": 86_567_656, "ViT-B/32": 88_224_232,
    "ViT-L/16": 304_326_632, "ViT-L/32": 306_535_400, "ViT-H/14": 632_045_800,
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_counts_are_exact(name):
    assert config_parameters(model_config(name)) == EXPECTED[name]


def test_list_models_is_the_paper_table_then_the_hybrids():
    assert vitkit.list_models()[:len(EXPECTED)] == list(EXPECTED)
    assert vitkit.list_models()[len(EXPECTED):len(EXPECTED) + 5] == ["R+ViT-Ti/16", "R26+ViT-S/32", "R26+ViT-B/32",
                                                    "R50+ViT-B/16", "R50+ViT-L/32"]


@pytest.mark.parametrize("name", ["vit-b/16", "VIT-B/16", " ViT-b/16 "])
def test_names_are_case_insensitive(name):
    config = model_config(name)
    assert (config.depth, config.dim, config.mlp_dim, config.num_heads, config.patch_size) == (12, 768, 3072, 12, 16)


def test_any_size_patch_pair():
    config = model_config("ViT-L/14")
    assert (config.depth, config.dim, config.patch_size) == (24, 1024, 14)


def test_table1_dimensions():
    for name, dims in {"ViT-Ti/16": (12, 192, 768, 3), "ViT-S/16": (12, 384, 1536, 6),
                       "ViT-L/16": (24, 1024, 4096, 16), "ViT-H/14": (32, 1280, 5120, 16)}.items():
        c = model_config(name)
        assert (c.depth, c.dim, c.mlp_dim, c.num_heads) == dims


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'ViT-X/16'"):
        vitkit.create_model("ViT-X/16")
    with pytest.raises(ValueError, match="did you mean"):
        vitkit.create_model("ViT-B16")


def test_flops_match_closed_form():
    # Per image: patch projection N*P^2*C*D, per layer 4ND^2 (qkv+proj) + 2N^2 D (scores+mix)
    # + 2N*D*mlp, then the head D*K; FLOPs are twice the multiply-adds.
    c = model_config("ViT-B/16")
    n, t, d = 196, 197, 768
    macs = n * 16 * 16 * 3 * d + c.depth * (4 * t * d * d + 2 * t * t * d + 2 * t * d * c.mlp_dim) + d * 1000
    assert forward_flops(c) == 2 * macs


def test_init_follows_google():
    model = vitkit.create_model("ViT-Ti/16", num_classes=10)
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    assert torch.count_nonzero(model.cls_token) == 0
    assert abs(model.pos_embed.weight.std().item() - 0.02) < 0.002
    qkv = model.blocks[0].attn.qkv.weight
    bound = (6 / (192 + 192)) ** 0.5  # xavier-uniform for each of q, k, v as a D x D kernel
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.95 * bound
    fc1 = model.blocks[0].mlp.fc1.weight
    assert fc1.abs().max() <= (6 / (192 + 768)) ** 0.5
    assert model.blocks[0].mlp.fc1.bias.abs().max() < 1e-5
