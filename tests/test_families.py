"""ViTConfig checks every field when built; the family options default off; bad model inputs are clear errors."""

import math
import re

import pytest
import torch

import vitkit
from vitkit.models.stats import config_parameters
from vitkit.errors import ConfigError

TINY = dict(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)


@pytest.mark.parametrize("field,value,expected", [
    ("depth", -1, "depth: expected an int in [1, 4096], got -1"),
    ("num_heads", 0, "num_heads: expected an int >= 1, got 0"),
    ("dim", "64", "dim: expected an int >= 1, got '64'"),
    ("dim", True, "dim: expected an int >= 1, got True"),
    ("mlp_dim", 3.0, "mlp_dim: expected an int >= 1, got 3.0"),
    ("num_classes", -2, "num_classes: expected an int >= 0, got -2"),
    ("reg_tokens", -1, "reg_tokens: expected an int in [0, 4096], got -1"),
    ("dropout", math.nan, "dropout: expected a finite number in [0, 1), got nan"),
    ("attn_dropout", 1.0, "attn_dropout: expected a number in [0, 1), got 1.0"),
    ("drop_path", -0.1, "drop_path: expected a number in [0, 1), got -0.1"),
    ("ln_eps", 0.0, "ln_eps: expected a number > 0, got 0.0"),
    ("ln_eps", math.inf, "ln_eps: expected a finite number > 0, got inf"),
    ("layer_scale", math.nan, "layer_scale: expected a finite number, or null, got nan"),
    ("qkv_bias", 1, "qkv_bias: expected true or false, got 1"),
    ("class_token", "yes", "class_token: expected true or false, got 'yes'"),
    ("pool", "max", "pool: expected one of ['token', 'gap', 'map', 'soft', 'merge'], got 'max'"),
    ("gelu", "relu", "gelu: expected one of ['exact', 'tanh', 'quick'], got 'relu'"),
    ("mlp", "reglu", "mlp: expected one of ['gelu', 'swiglu', 'geglu', 'relu'], got 'reglu'"),
    ("pos_interp", "cubic", "pos_interp: expected one of ['nearest', 'nearest-exact', 'bilinear', 'bicubic', "
                            "'area'], got 'cubic'"),
    ("representation_size", 0, "representation_size: expected an int >= 1, or null, got 0"),
    ("image_size", "224", "image_size: expected an int or a (height, width) pair of ints, each >= 1, got '224'"),
    ("image_size", (16, 16, 3), "image_size: expected an int or a (height, width) pair of ints, each >= 1, "
                                "got (16, 16, 3)"),
    ("image_size", 0, "image_size: expected an int or a (height, width) pair of ints, each >= 1, got 0"),
    ("backbone", (3, 0), "backbone: expected a list of positive block counts, or null, got (3, 0)"),
    ("provenance", [], "provenance: expected a Provenance or a JSON object, got []"),
])
def test_every_field_is_checked_when_built(field, value, expected):
    """One shape for every refusal, the whole message: ``ViTConfig: <field>: expected <what>, got <value>``."""
    with pytest.raises(ConfigError, match=f"^{re.escape(f'ViTConfig: {expected}')}$"):
        vitkit.ViTConfig(**{**TINY, field: value})


def test_rules_between_fields():
    with pytest.raises(ConfigError, match=re.escape("ViTConfig: dist_token: expected false unless class_token=True, "
                                                    "pool='token'")):
        vitkit.ViTConfig(**TINY, dist_token=True, class_token=False, pool="gap")
    with pytest.raises(ConfigError, match="^ViTConfig: dim: expected a multiple of num_heads=3, got 16$"):
        vitkit.ViTConfig(**{**TINY, "num_heads": 3})
    with pytest.raises(ConfigError, match="^config.json: widht: unknown key$"):
        vitkit.ViTConfig.from_dict({"widht": 3})


def test_family_options_default_off():
    """A config without the new fields is the paper's model: same parameters, same JSON round trip."""
    plain = vitkit.ViTConfig(**TINY)
    d, mlp, classes, tokens = 16, 32, 3, (16 // 8) ** 2 + 1  # TINY by hand: 4 patches and [class]
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * mlp + mlp) + (mlp * d + d)  # 2 LN, qkv, proj, MLP
    paper = (3 * 8 * 8 * d + d) + d + tokens * d + block + 2 * d + (d * classes + classes)  # embed, [class], pos, head
    assert config_parameters(plain) == paper
    assert plain.family_options() == {}
    assert vitkit.ViTConfig.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("images,expected", [
    (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), "expected floating-point images .* got torch.uint8"),
    (torch.zeros(0, 3, 16, 16), "expected at least one image .* got shape \\(0, 3, 16, 16\\)"),
    (torch.zeros(2, 1, 16, 16), "expected 3 input channels, got 1"),
    (torch.zeros(3, 16, 16), "expected images of shape \\(batch, 3, height, width\\), got \\(3, 16, 16\\)"),
    (torch.zeros(2, 3, 16, 12), "multiples of the patch size 8, got 16x12"),
])
def test_bad_inputs_name_the_shape(images, expected):
    with pytest.raises(vitkit.InputError, match=expected):
        vitkit.create_model(vitkit.ViTConfig(**TINY))(images)


# Each named family variant and timm's model of it, built with timm's defaults (head, image size).
TIMM_NAMES = {
    "DeiT-Ti/16": "deit_tiny_patch16_224", "DeiT-S/16": "deit_small_patch16_224", "DeiT-B/16": "deit_base_patch16_224",
    "DeiT-Ti/16-distilled": "deit_tiny_distilled_patch16_224",
    "DeiT-S/16-distilled": "deit_small_distilled_patch16_224",
    "DeiT-B/16-distilled": "deit_base_distilled_patch16_224",
    "DeiT3-S/16": "deit3_small_patch16_224", "DeiT3-M/16": "deit3_medium_patch16_224",
    "DeiT3-B/16": "deit3_base_patch16_224", "DeiT3-L/16": "deit3_large_patch16_224",
    "DeiT3-H/14": "deit3_huge_patch14_224",
    **{f"DINOv2-{size}/14{reg}": f"vit_{name}_patch14{reg.replace('-', '_')}_dinov2"
       for size, name in (("S", "small"), ("B", "base"), ("L", "large"), ("g", "giant")) for reg in ("", "-reg4")},
    "CLIP-B/32": "vit_base_patch32_clip_224", "CLIP-B/16": "vit_base_patch16_clip_224",
    "CLIP-L/14": "vit_large_patch14_clip_224", "CLIP-H/14": "vit_huge_patch14_clip_224",
    "SigLIP-B/16": "vit_base_patch16_siglip_224", "SigLIP-So400m/14": "vit_so400m_patch14_siglip_224",
}


def test_every_family_variant_has_a_timm_twin():
    assert sorted(TIMM_NAMES) == sorted(vitkit.models.registry.FAMILY_VARIANTS)


@pytest.mark.parametrize("name", list(TIMM_NAMES))
def test_family_parameter_counts_match_timm(name):
    """Golden counts: timm's own model of the variant, built on the meta device, has exactly as many."""
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        peer = timm.create_model(TIMM_NAMES[name])
    config = vitkit.models.model_config(name)
    assert config_parameters(config) == sum(p.numel() for p in peer.parameters())
    assert (config.image_size, config.num_classes) == (tuple(peer.patch_embed.img_size), peer.num_classes)
