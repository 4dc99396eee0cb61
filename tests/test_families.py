"""ViTConfig checks every field when built; the family options default off; bad model inputs are clear errors."""

import math

import pytest
import torch

import vitkit
from vitkit.models.stats import config_parameters
from vitkit.errors import ConfigError

TINY = dict(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)


@pytest.mark.parametrize("field,value,expected", [
    ("depth", -1, "depth=-1, expected an int >= 1"),
    ("num_heads", 0, "num_heads=0, expected an int >= 1"),
    ("dim", "64", "dim='64', expected an int >= 1"),
    ("dim", True, "dim=True, expected an int >= 1"),
    ("mlp_dim", 3.0, "mlp_dim=3.0, expected an int >= 1"),
    ("num_classes", -2, "num_classes=-2, expected an int >= 0"),
    ("reg_tokens", -1, "reg_tokens=-1, expected an int >= 0"),
    ("dropout", math.nan, "dropout=nan, expected a finite number in"),
    ("attn_dropout", 1.0, "attn_dropout=1.0, expected a finite number in \\[0.0, 1.0\\)"),
    ("drop_path", -0.1, "drop_path=-0.1"),
    ("ln_eps", 0.0, "ln_eps=0.0, expected a positive number"),
    ("ln_eps", math.inf, "ln_eps=inf"),
    ("layer_scale", math.nan, "layer_scale=nan, expected null or a finite number"),
    ("qkv_bias", 1, "qkv_bias=1, expected true or false"),
    ("class_token", "yes", "class_token='yes', expected true or false"),
    ("pool", "max", "pool='max', expected one of"),
    ("gelu", "relu", "gelu='relu', expected one of"),
    ("mlp", "geglu", "mlp='geglu', expected one of"),
    ("pos_interp", "cubic", "pos_interp='cubic', expected one of"),
    ("representation_size", 0, "representation_size=0, expected null or an int >= 1"),
    ("image_size", "224", "image_size='224', expected an int or a \\(height, width\\) pair"),
    ("image_size", (16, 16, 3), "image_size=\\(16, 16, 3\\)"),
    ("image_size", 0, "image_size=\\(0, 0\\), expected positive sides"),
    ("backbone", (3, 0), "backbone=\\(3, 0\\)"),
    ("provenance", [], "provenance=\\[\\], expected a Provenance or a JSON object"),
])
def test_every_field_is_checked_when_built(field, value, expected):
    with pytest.raises(ConfigError, match=f"invalid ViTConfig: {expected}"):
        vitkit.ViTConfig(**{**TINY, field: value})


def test_rules_between_fields():
    with pytest.raises(ConfigError, match="dist_token=True needs class_token=True, pool='token'"):
        vitkit.ViTConfig(**TINY, dist_token=True, class_token=False, pool="gap")
    with pytest.raises(ConfigError, match="dim=16 is not divisible by num_heads=3"):
        vitkit.ViTConfig(**{**TINY, "num_heads": 3})
    with pytest.raises(ConfigError, match="unknown ViTConfig keys"):
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
