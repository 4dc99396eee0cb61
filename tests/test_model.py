import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.models.config import POS_INTERPS
from vitkit.models.position import grid_cells, resample_grid, resample_weights, resample_with_prefix, sincos_2d


def tiny(**overrides):
    base = dict(image_size=32, patch_size=8, dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=10)
    return vitkit.create_model(vitkit.ViTConfig(**{**base, **overrides}))


@pytest.mark.parametrize("pos_embed", ["learned", "learned-2d", "sincos-2d", "relative", "none"])
@pytest.mark.parametrize("pool,class_token", [("token", True), ("gap", True), ("gap", False)])
def test_shapes_square_and_non_square(pos_embed, pool, class_token):
    model = tiny(pos_embed=pos_embed, pool=pool, class_token=class_token).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert model(torch.randn(3, 3, 48, 24)).shape == (3, 10)  # non-square, resampled on the fly
    features = model.forward_features(torch.randn(1, 3, 16, 40))
    assert features.shape == (1, int(class_token) + 2 * 5, 64)


def test_num_classes_zero_gives_features():
    model = tiny(num_classes=0).eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 64)


def test_pre_logits_is_linear_tanh():
    model = tiny(representation_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    rep = model.forward_head(model.forward_features(x), pre_logits=True)
    assert rep.shape == (2, 32) and rep.abs().max() < 1
    cls = model.forward_features(x)[:, 0]
    torch.testing.assert_close(rep, torch.tanh(cls @ model.pre_logits[0].weight.T + model.pre_logits[0].bias))


def test_gap_pools_patch_tokens_after_the_final_norm():
    model = tiny(pool="gap", class_token=True).eval()
    torch.nn.init.normal_(model.head.weight)
    x = torch.randn(2, 3, 32, 32)
    tokens = model.forward_features(x)
    torch.testing.assert_close(model(x), model.head(tokens[:, 1:].mean(1)))


def test_fc_norm_normalises_after_pooling():
    model = tiny(pool="gap", fc_norm=True).eval()
    x = torch.randn(2, 3, 32, 32)
    z, _ = model.embed(x)
    for block in model.blocks:
        z = block(z)
    expected = torch.nn.functional.layer_norm(z[:, 1:].mean(1), (64,), model.fc_norm.weight, model.fc_norm.bias, 1e-6)
    torch.testing.assert_close(model.forward_head(model.forward_features(x), pre_logits=True), expected)


def test_equations_by_hand():
    """Eqs. (1)-(4) written out with plain tensor algebra from the model's own weights."""
    model = tiny(gelu="tanh").eval()
    torch.nn.init.normal_(model.head.weight)
    torch.nn.init.normal_(model.cls_token)
    x = torch.randn(2, 3, 32, 32)
    # (1): flatten 8x8x3 patches (channel-major like the conv kernel) and project with E.
    patches = x.unfold(2, 8, 8).unfold(3, 8, 8)  # B, C, 4, 4, 8, 8
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(2, 16, 3 * 64)
    conv = model.patch_embed.proj
    z = patches @ conv.weight.reshape(64, -1).T + conv.bias
    z = torch.cat([model.cls_token.expand(2, -1, -1), z], 1) + model.pos_embed.weight
    ln = lambda t, m: torch.nn.functional.layer_norm(t, (64,), m.weight, m.bias, 1e-6)  # noqa: E731
    for block in model.blocks:
        a = block.attn
        q, k, v = (ln(z, block.norm1) @ a.qkv.weight.T + a.qkv.bias).chunk(3, -1)
        heads = lambda t: t.reshape(2, 17, 4, 16).transpose(1, 2)  # noqa: E731
        probs = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) / 16 ** 0.5, -1)
        msa = (probs @ heads(v)).transpose(1, 2).reshape(2, 17, 64) @ a.proj.weight.T + a.proj.bias
        z = msa + z  # (2)
        h = ln(z, block.norm2) @ block.mlp.fc1.weight.T + block.mlp.fc1.bias
        h = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
        z = h @ block.mlp.fc2.weight.T + block.mlp.fc2.bias + z  # (3)
    y = ln(z[:, 0], model.norm)  # (4)
    torch.testing.assert_close(model(x), y @ model.head.weight.T + model.head.bias, atol=1e-5, rtol=1e-5)


def test_resampling_to_own_grid_is_identity():
    table = torch.randn(1, 1 + 12, 8)
    assert torch.equal(resample_with_prefix(table, 1, (3, 4), (3, 4)), table)
    model = tiny().eval()
    assert model.pos_embed((4, 4)) is model.pos_embed.weight


def test_resampling_keeps_class_slot_and_interpolates_2d():
    table = torch.randn(1, 1 + 4, 6)
    out = resample_with_prefix(table, 1, (2, 2), (4, 6), mode="bilinear")
    assert out.shape == (1, 1 + 24, 6)
    assert torch.equal(out[:, 0], table[:, 0])
    expected = torch.nn.functional.interpolate(table[:, 1:].reshape(1, 2, 2, 6).permute(0, 3, 1, 2), size=(4, 6),
                                               mode="bilinear", align_corners=False)
    torch.testing.assert_close(out[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 24, 6))
    with pytest.raises(ValueError, match="does not hold a"):
        resample_grid(table[:, 1:], (3, 3), (4, 4))


def test_resampled_tables_are_cached_in_inference_only():
    model = tiny().eval()
    with torch.no_grad():
        first = model.pos_embed((6, 2))
        assert model.pos_embed((6, 2)) is first
        model.pos_embed.weight.add_(1.0)  # a new version of the weights invalidates the cache
        assert model.pos_embed((6, 2)) is not first
    table = model.pos_embed((6, 2))
    assert table.requires_grad and table.grad_fn is not None


def test_resize_image_makes_new_grid_native():
    model = tiny().eval()
    x = torch.randn(1, 3, 64, 48)
    before = model(x)
    model.resize_image((64, 48))
    assert model.config.image_size == (64, 48) and model.pos_embed.weight.shape == (1, 1 + 48, 64)
    torch.testing.assert_close(model(x), before)


def test_learned_2d_resize_and_sincos_formula():
    model = tiny(pos_embed="learned-2d").eval()
    x = torch.randn(1, 3, 48, 16)
    before = model(x)
    model.resize_image((48, 16))
    assert model.pos_embed.rows.shape == (6, 32) and model.pos_embed.cols.shape == (2, 32)
    torch.testing.assert_close(model(x), before)
    table = sincos_2d(*grid_cells((2, 3)), 8)
    # row index 1*3+2 is y=1, x=2; quarter=2 frequencies 1 and 1/10000.
    expected = torch.tensor([2.0, 2e-4]).sin().tolist() + torch.tensor([2.0, 2e-4]).cos().tolist() + \
        torch.tensor([1.0, 1e-4]).sin().tolist() + torch.tensor([1.0, 1e-4]).cos().tolist()
    torch.testing.assert_close(table[5], torch.tensor(expected))


def test_reset_head_is_zero_and_drops_pre_logits():
    model = tiny(representation_size=32)
    model.reset_head(5)
    assert model.config.num_classes == 5 and model.config.representation_size is None
    assert isinstance(model.pre_logits, torch.nn.Identity)
    assert model.head.weight.shape == (5, 64) and not model.head.weight.any()
    assert not model(torch.randn(1, 3, 32, 32)).any()


def test_intermediates_and_attention_match_fused_path():
    model = tiny().eval()
    x = torch.randn(2, 3, 32, 40)
    out = model.forward_intermediates(x, attention=True)
    assert len(out.blocks) == 2 and out.grid == (4, 5)
    torch.testing.assert_close(out.features, model.forward_features(x), atol=1e-5, rtol=1e-5)
    probs = out.attentions[0]
    assert probs.shape == (2, 4, 21, 21)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 21))


@pytest.mark.parametrize("regulariser", ["dropout", "attn_dropout", "drop_path"])
def test_regularisers_draw_anew_in_training_and_stay_off_in_eval(regulariser):
    model = tiny(**{regulariser: 0.2})
    x = torch.randn(16, 3, 32, 32)  # drop path draws per image: 16 draws alike twice by chance is 2^-16 rare
    with torch.no_grad():
        assert not torch.allclose(model.train().forward_features(x), model.forward_features(x))
        assert torch.equal(model.eval().forward_features(x), model.forward_features(x))
    if regulariser == "drop_path":  # stochastic depth's linear rule over 2 blocks: 0, then the full rate
        assert model.blocks[0].drop_path.rate == 0.0 and model.blocks[1].drop_path.rate == pytest.approx(0.2)


@pytest.mark.parametrize("shape,message", [
    ((2, 1, 32, 32), "expected 3 input channels, got 1"),
    ((2, 3, 30, 32), "multiples of the patch size 8, got 30x32"),
    ((3, 32, 32), "expected images of shape"),
])
def test_bad_inputs_are_clear_errors(shape, message):
    with pytest.raises(ValueError, match=message):
        tiny()(torch.randn(*shape))


def test_bad_configs_are_clear_errors():
    with pytest.raises(ValueError, match=r"^ViTConfig: pool: expected 'gap' or 'map' with class_token=False, "
                                         r"got 'token'$"):
        vitkit.ViTConfig(class_token=False)
    with pytest.raises(ValueError, match=r"^ViTConfig: image_size: expected sides that are multiples of "
                                         r"patch_size=16, got \(225, 225\)$"):
        vitkit.ViTConfig(image_size=225)
    with pytest.raises(ValueError, match=r"^config.json: widht: unknown key$"):
        vitkit.ViTConfig.from_dict({"widht": 3})


def test_relative_attention_by_hand():
    """Appendix D.4: logits_ij = (q_i . k_j + q_i . R[i - j]) / sqrt(d), with R learned per offset."""
    model = tiny(pos_embed="relative", depth=1).eval()
    attn = model.blocks[0].attn
    x = torch.randn(2, 5, 64)
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).reshape(2, 5, 3, 4, 16).permute(2, 0, 3, 1, 4)
    rel = attn.relative.weight  # (heads, 2M - 1, d), M = 17 tokens at the native grid
    logits = torch.empty(2, 4, 5, 5)
    for i in range(5):
        for j in range(5):
            logits[:, :, i, j] = ((q[:, :, i] * (k[:, :, j] + rel[:, i - j + 16])).sum(-1)) / 4.0
    mixed = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 64)
    expected = mixed @ attn.proj.weight.T + attn.proj.bias
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)
    out, probs = attn.forward_with_probs(x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(probs, logits.softmax(-1), atol=1e-6, rtol=1e-5)


def test_relative_attention_learns_and_runs_at_other_sizes():
    model = tiny(pos_embed="relative").train()
    torch.nn.init.normal_(model.head.weight)  # a zero head would pass no gradient back
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert model.blocks[0].attn.relative.weight.grad.abs().sum() > 0
    assert model.pos_embed is None
    assert model.eval()(torch.randn(1, 3, 48, 64)).shape == (1, 10)  # longer offsets are clamped


def test_patch_projection_is_lecun_normal_truncated_at_two_sigma():
    """Flax's lecun_normal: std sqrt(1 / fan_in) after truncation at +-2 of the underlying normal's std."""
    model = vitkit.create_model(vitkit.ViTConfig(image_size=32, patch_size=16, dim=768, depth=1, num_heads=12,
                                                 mlp_dim=8, num_classes=0))
    weight = model.patch_embed.proj.weight  # fan_in 3 * 16 * 16 = 768; 768 * 768 draws
    lecun = math.sqrt(1 / 768)
    assert abs(weight.std().item() / lecun - 1) < 0.02
    assert weight.abs().max().item() <= 2 * lecun / 0.87962566103423978 + 1e-7


@pytest.mark.parametrize("mode", POS_INTERPS)
def test_resample_weights_are_torchs_interpolate(mode):
    """The resize an exported graph and a NaFlex batch compute as weights is F.interpolate's, for every mode, with
    and without antialias and corner alignment, shrinking and growing (one axis of a 2-D image, as tables are)."""
    smooth = mode in ("bilinear", "bicubic")
    switches = (False, True) if smooth else (False,)
    for antialias, align in itertools.product(switches, switches):
        for length, size in itertools.product((1, 3, 7, 16), (1, 2, 5, 16, 23)):
            column = torch.randn(length)
            image = column[None, None, :, None].expand(1, 1, length, 3)
            options = dict(align_corners=align) if smooth else {}
            expected = F.interpolate(image, size=(size, 3), mode=mode, antialias=antialias, **options)[0, 0, :, 1]
            weights = resample_weights(torch.arange(size), size, length, mode, antialias, align)
            torch.testing.assert_close(weights @ column, expected, atol=2e-5, rtol=0)


def test_a_config_cannot_ask_for_more_modules_than_can_be_built():
    """A config.json or --set asking for 10^9 blocks is refused at once, not built block by block on the meta
    device before any weight is compared (a hang)."""
    with pytest.raises(vitkit.ConfigError, match=r"^ViTConfig: depth: expected an int in \[1, 4096\], got 1000000000$"):
        vitkit.ViTConfig(depth=10**9)
    with pytest.raises(vitkit.ConfigError, match=r"^ViTConfig: reg_tokens: expected an int in \[0, 4096\], got 5000$"):
        vitkit.ViTConfig(reg_tokens=5000)
