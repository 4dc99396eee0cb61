"""ViTConfig checks every field when built; the family options default off; bad model inputs are clear errors."""

import math

import pytest
import torch

import vitkit
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
    ("extra", [], "extra=\\[\\], expected a dict"),
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
    assert not (plain.dist_token or plain.reg_tokens or plain.no_embed_class or plain.pre_norm or plain.qk_norm)
    assert (plain.patch_bias, plain.layer_scale, plain.mlp, plain.num_prefix_tokens) == (True, None, "gelu", 1)
    assert vitkit.ViTConfig.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("images,expected", [
    (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), "expected floating-point images .* got torch.uint8"),
    (torch.zeros(0, 3, 16, 16), "expected at least one image .* got shape \\(0, 3, 16, 16\\)"),
    (torch.zeros(2, 1, 16, 16), "expected 3 input channels, got 1"),
    (torch.zeros(3, 16, 16), "expected images of shape \\(batch, 3, height, width\\), got \\(3, 16, 16\\)"),
    (torch.zeros(2, 3, 16, 12), "multiples of the patch size 8, got 16x12"),
])
def test_bad_inputs_name_the_shape(images, expected):
    with pytest.raises(ValueError, match=expected):
        vitkit.create_model(vitkit.ViTConfig(**TINY))(images)
