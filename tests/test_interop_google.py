"""Google .npz checkpoints in each layout give timm's logits (timm reads vit_jax files itself, so it
also checks what vitkit writes), and native -> npz -> native is lossless."""

import warnings

import numpy as np
import pytest
import torch
from interop_helpers import google_layout, round_to_bf16, timm_model
from safetensors.torch import save_file

import vitkit
from vitkit.checkpoints.google import write_npz

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import _load_weights  # noqa: E402  (timm's own npz reader)


def npz_from_timm(peer, tmp_path, **overrides):
    """The peer's weights as vit_jax arrays, via vitkit's reader of timm files and writer of npz; timm's
    own npz reader must give back the peer's outputs, or the file is wrong."""
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "peer.safetensors")
    write_npz(vitkit.load(tmp_path / "peer.safetensors", **overrides), tmp_path / "base.npz")
    with np.load(tmp_path / "base.npz") as npz:
        return {key: npz[key] for key in npz.files}


@pytest.mark.parametrize("layout", ["vit_jax", "linen", "opt_target", "big_vision", "bf16"])
@pytest.mark.parametrize("pool", ["token", "gap"])
def test_every_layout_gives_the_peers_logits(tmp_path, layout, pool):
    kwargs = dict(act_layer="gelu_tanh")  # Google's numerics: tanh GELU, LayerNorm eps 1e-6
    if pool == "gap":
        kwargs.update(class_token=False, global_pool="avg", fc_norm=False)
    peer = timm_model(**kwargs)
    if layout == "big_vision" and pool == "token":
        with torch.no_grad():
            peer.pos_embed[:, 0] = 0  # big_vision adds positions before prepending the [class] token
    if layout == "bf16":
        round_to_bf16(peer)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = peer(x)
    arrays = npz_from_timm(peer, tmp_path, gelu="tanh", num_heads=4)
    check = timm_model(**kwargs)
    _load_weights(check, str(tmp_path / "base.npz"))
    with torch.no_grad():
        torch.testing.assert_close(check(x), expected, atol=1e-5, rtol=0)

    np.savez(tmp_path / f"{layout}.npz", **google_layout(arrays, layout))
    model = vitkit.load(tmp_path / f"{layout}.npz")
    c = model.config
    assert (c.gelu, c.ln_eps, c.pool, c.depth, c.num_heads, c.mlp_dim, c.patch_size, c.image_size) == \
        ("tanh", 1e-6, pool, 2, 4, 128, 8, (32, 32))
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=0)


def test_hybrid_npz_gives_timms_hybrid_logits(tmp_path):
    peer = timm_model(backbone=(1, 1), img_size=64, patch_size=1)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = peer(x)
    npz_from_timm(peer, tmp_path, num_heads=4)
    check = timm_model(backbone=(1, 1), img_size=64, patch_size=1)
    _load_weights(check, str(tmp_path / "base.npz"))
    with torch.no_grad():
        torch.testing.assert_close(check(x), expected, atol=2e-5, rtol=0)
    google = vitkit.load(tmp_path / "base.npz")
    assert google.config.backbone == (1, 1) and google.config.grid_size == (8, 8)
    assert (google.config.std_conv, google.config.std_conv_eps, google.config.gn_eps) == ("std+eps", 1e-5, 1e-6)
    # The same arrays under timm's numerics are timm's model.
    model = vitkit.load(tmp_path / "base.npz", gelu="exact", std_conv="sqrt(var+eps)", std_conv_eps=1e-8,
                        gn_eps=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name,kwargs", [
    ("ViT-Ti/16", dict(representation_size=24)),
    ("ViT-Ti/16", dict(pool="gap", class_token=False)),
    ("R+ViT-Ti/16", {}),
    ("R26+ViT-S/32", dict(backbone=(1, 1), dim=64, num_heads=2, mlp_dim=64)),
])
def test_native_to_npz_to_native_is_bit_identical(tmp_path, name, kwargs):
    model = vitkit.create_model(name, image_size=64, depth=2, num_classes=5, gelu="tanh", pos_interp="bilinear",
                                pos_interp_align_corners=True, **kwargs)  # an npz implies Google numerics
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.eval().save(tmp_path / "native")
    vitkit.checkpoints.export(vitkit.load(tmp_path / "native"), tmp_path / "m.npz", "npz")
    vitkit.checkpoints.convert(tmp_path / "m.npz", tmp_path / "back", "native")
    back = vitkit.load(tmp_path / "back")
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert {k: v for k, v in back.config.to_dict().items() if k != "provenance"} == \
        {k: v for k, v in model.config.to_dict().items() if k != "provenance"}
    x = torch.randn(2, 3, 64, 64)
    assert torch.equal(back(x), model(x))


def test_npz_export_names_the_numerics_it_cannot_carry(tmp_path):
    """A .npz is read with Google's numerics: writing a timm-style model (exact GELU, eps 1e-5) warns, naming
    each field that will not travel; a model with Google's numerics writes silently."""
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1, num_classes=3, gelu="exact", ln_eps=1e-5)
    with pytest.warns(UserWarning, match=r"gelu='exact' \(read back as 'tanh'\), ln_eps=1e-05") as caught:
        write_npz(model, tmp_path / "timm_style.npz")
    assert len(caught) == 1 and vitkit.load(tmp_path / "timm_style.npz").config.gelu == "tanh"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_npz(model.__class__(model.config.replace(gelu="tanh", ln_eps=1e-6)), tmp_path / "google.npz")


def test_bad_npz_files_are_clear_errors(tmp_path):
    np.savez(tmp_path / "objects.npz", **{"embedding/kernel": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(vitkit.CheckpointError, match="refusing to unpickle"):
        vitkit.load(tmp_path / "objects.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3, np.float32))
    with pytest.raises(vitkit.CheckpointError, match="no 'embedding/kernel'"):
        vitkit.load(tmp_path / "other.npz")
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1, gelu="tanh")
    write_npz(model, tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as npz:
        arrays = {k: npz[k] for k in npz.files if k != "Transformer/encoder_norm/scale"}
    arrays["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"] = np.zeros((192, 100), np.float32)
    arrays["Transformer/extra/thing"] = np.zeros(2, np.float32)
    np.savez(tmp_path / "broken.npz", **arrays)
    with pytest.raises(vitkit.CheckpointError, match="cannot place: Transformer/extra/thing"):
        vitkit.load(tmp_path / "broken.npz")
    del arrays["Transformer/extra/thing"]
    np.savez(tmp_path / "broken.npz", **arrays)
    with pytest.raises(vitkit.CheckpointError) as error:
        vitkit.load(tmp_path / "broken.npz")
    assert "missing keys (1): norm.weight" in str(error.value)
    assert "blocks.0.mlp.fc2.weight: checkpoint (192, 768) vs model (192, 100)" in str(error.value)


def test_cli_convert_and_info_on_any_format(tmp_path, capsys):
    from vitkit.cli import main

    peer = timm_model()
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "peer.safetensors")
    assert main(["info", str(tmp_path / "peer.safetensors")]) == 1
    assert "pass the override num_heads=" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "peer.safetensors"), str(tmp_path / "m.npz"), "--to", "npz",
                 "--set", "num_heads=4", "--set", "gelu=tanh"]) == 0
    assert "timm -> npz" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "m.npz")]) == 0
    out = capsys.readouterr().out
    assert "(google-npz)" in out and "GELU tanh, LayerNorm eps 1e-06" in out and "10 classes" in out
    assert "normalised 'google': mean [0.5, 0.5, 0.5], std [0.5, 0.5, 0.5]" in out
    assert main(["convert", str(tmp_path / "m.npz"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    capsys.readouterr()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vitkit.load(tmp_path / "hf", gelu="exact")(x), peer(x), atol=1e-5, rtol=0)


def test_google_checkpoints_resample_like_scipy_linear_zoom(tmp_path):
    """vit_jax resizes position tables with scipy.ndimage.zoom(order=1); a Google checkpoint loaded at
    another size must get the same table (class slot untouched)."""
    ndimage = pytest.importorskip("scipy.ndimage")
    peer = timm_model(act_layer="gelu_tanh")
    arrays = npz_from_timm(peer, tmp_path, num_heads=4)
    np.savez(tmp_path / "g.npz", **arrays)
    model = vitkit.load(tmp_path / "g.npz", image_size=(56, 40))
    table = arrays["Transformer/posembed_input/pos_embedding"][0]
    side = int(round((table.shape[0] - 1) ** 0.5))
    grid = table[1:].reshape(side, side, -1)
    zoomed = ndimage.zoom(grid, (model.config.grid_size[0] / side, model.config.grid_size[1] / side, 1), order=1)
    expected = np.concatenate([table[:1], zoomed.reshape(-1, table.shape[-1])])
    np.testing.assert_allclose(model.pos_embed.weight[0].detach().numpy(), expected, atol=1e-6, rtol=1e-5)
