"""FlexiViT: one checkpoint run at another patch size, against timm's own resampling of the same weights."""

import pytest
import torch
from interop_helpers import randomised
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.models.patch_resize import resample_patch_kernel

timm = pytest.importorskip("timm")

SIZE = 48  # a 3x3 grid at the checkpoint's patch 16, 6x6 at 8, 12x12 at 4
TINY = dict(depth=2, embed_dim=64, num_heads=2, img_size=SIZE, num_classes=10)


@pytest.mark.parametrize("old,new", [(16, 8), (16, 32), (16, 4), (14, 16)])
@pytest.mark.parametrize("mode,antialias", [("bicubic", True), ("bilinear", False)])
def test_kernel_resampling_is_timms(old, new, mode, antialias):
    """Reference: ``timm.layers.resample_patch_embed`` with the same interpolation, on a random kernel."""
    from timm.layers import resample_patch_embed

    kernel = torch.randn(32, 3, old, old, generator=torch.Generator().manual_seed(old * 100 + new))
    ours = resample_patch_kernel(kernel, (new, new), mode, antialias)
    theirs = resample_patch_embed(kernel, (new, new), interpolation=mode, antialias=antialias)
    assert ours.shape == (32, 3, new, new)
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_upsampled_kernel_gives_a_resized_patch_its_token():
    """The defining property, against F.interpolate: upsampling loses nothing, so <resize(x), k'> = <x, k>."""
    kernel, patches = torch.randn(8, 3, 8, 8), torch.randn(5, 3, 8, 8)
    resized = torch.nn.functional.interpolate(patches, size=(16, 16), mode="bicubic", antialias=True)
    tokens = torch.einsum("nchw,dchw->nd", patches, kernel)
    resampled = torch.einsum("nchw,dchw->nd", resized, resample_patch_kernel(kernel, (16, 16)))
    torch.testing.assert_close(resampled, tokens, atol=1e-4, rtol=0)


def timm_at_patch(weights, patch_size, architecture, **kwargs):
    """timm's own path for a checkpoint at another patch size: ``create_model(pretrained=True)`` on the
    file, whose loader (``checkpoint_filter_fn``) resamples the patch kernel by the pseudo-inverse and the
    position table to the new grid: bilinear without antialias for FlexiViT, bicubic with it otherwise."""
    overlay = dict(file=str(weights), custom_load=False, num_classes=TINY["num_classes"])
    return timm.create_model(architecture, pretrained=True, pretrained_cfg_overlay=overlay, patch_size=patch_size,
                             **{**TINY, **kwargs}).eval()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny FlexiViT-S (no position rows for [class]) with random weights: a bare state dict and the
    hub directory that timm's own ``save_for_hf`` writes (architecture flexivit_small, tag 1200ep_in1k)."""
    from timm.models._hub import save_for_hf

    root = tmp_path_factory.mktemp("flexivit")
    peer = randomised(timm.create_model("flexivit_small.1200ep_in1k", **TINY))
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, root / "flexivit.safetensors")
    save_for_hf(peer, str(root / "hub"), safe_serialization=True)
    return root


@pytest.mark.parametrize("patch_size", [8, 4])
def test_flexivit_hub_checkpoint_at_another_patch_size_gives_timms_logits(checkpoint, patch_size):
    """Reference: timm's FlexiViT loaded from the same file at ``patch_size`` (bilinear resizes)."""
    model = vitkit.load(checkpoint / "hub", patch_size=patch_size)
    peer = timm_at_patch(checkpoint / "hub" / "model.safetensors", patch_size, "flexivit_small.1200ep_in1k")
    c = model.config
    assert (c.patch_size, c.grid_size, c.image_size) == (patch_size, (SIZE // patch_size,) * 2, (SIZE, SIZE))
    assert model.patch_embed.proj.weight.shape == peer.patch_embed.proj.weight.shape
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        assert (model(x) - peer(x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("patch_size", [8, 4])
def test_bare_state_dict_at_another_patch_size_gives_timms_logits(checkpoint, patch_size, tmp_path):
    """A bare state dict does not say it is a FlexiViT: vitkit resizes as timm does for any ViT (bicubic,
    antialiased), and as for FlexiViT when told ``pos_interp='bilinear', pos_interp_antialias=False``.
    The resized model saves and loads as a native checkpoint with the same logits."""
    weights = checkpoint / "flexivit.safetensors"
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        any_vit = timm_at_patch(weights, patch_size, "vit_small_patch16_224", no_embed_class=True)(x)
        flexi = timm_at_patch(weights, patch_size, "flexivit_small")(x)
        assert (any_vit - flexi).abs().max().item() > 1e-3  # the two resizes differ: each match below is earned
        model = vitkit.load(weights, num_heads=2, patch_size=patch_size)
        assert (model(x) - any_vit).abs().max().item() <= 1e-5
        told = vitkit.load(weights, num_heads=2, patch_size=patch_size, pos_interp="bilinear",
                           pos_interp_antialias=False)
        assert (told(x) - flexi).abs().max().item() <= 1e-5
        native = vitkit.load(told.save(tmp_path / "native"))
        assert native.config.patch_size == patch_size
        torch.testing.assert_close(native(x), told(x), atol=0, rtol=0)


@pytest.mark.parametrize("patch_size", [8, 4])
def test_new_patch_and_image_size_together_resample_the_table_once(checkpoint, patch_size):
    """Reference: timm's FlexiViT loaded at ``patch_size`` and 64 pixels, whose table goes 3x3 -> grid in
    one resize (a resize to 48 // P first and then to 64 // P would not match)."""
    model = vitkit.load(checkpoint / "hub", patch_size=patch_size, image_size=64)
    peer = timm_at_patch(checkpoint / "hub" / "model.safetensors", patch_size, "flexivit_small", img_size=64)
    assert model.config.grid_size == (64 // patch_size,) * 2
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (model(x) - peer(x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("patch_size,message", [
    (0, r"patch_size: expected an int >= 1, got 0"),
    (5, r"image_size: expected sides that are multiples of patch_size=5, got \(48, 48\)"),
    (8.0, r"patch_size: expected an int >= 1, got 8.0"),
])
def test_patch_sizes_that_cannot_run_are_refused_and_leave_the_model_as_it_was(checkpoint, patch_size, message):
    model = vitkit.load(checkpoint / "hub")
    kernel = model.patch_embed.proj.weight.clone()
    with pytest.raises(vitkit.ConfigError, match=message):
        model.resize_patch(patch_size)
    assert model.config.patch_size == 16 and torch.equal(model.patch_embed.proj.weight, kernel)
    with pytest.raises(vitkit.ConfigError, match=message):
        vitkit.load(checkpoint / "hub", patch_size=patch_size)


def test_hybrids_keep_their_patch_size():
    model = vitkit.create_model(vitkit.ViTConfig(image_size=32, patch_size=2, backbone=(), backbone_width=32,
                                                 gn_groups=8, dim=32, depth=1, num_heads=2, mlp_dim=64))
    with pytest.raises(vitkit.ConfigError, match=r"resize_patch\(1\): a hybrid's patches are cut from its CNN"):
        model.resize_patch(1)


@pytest.mark.parametrize("size,message", [
    ((0, 8), r"patch size \(0, 8\): expected a \(height, width\) pair of positive ints"),
    (8, r"patch size 8: expected a \(height, width\) pair"),
    ((8, 8.0), r"patch size \(8, 8.0\): expected"),
])
def test_kernel_sizes_that_are_not_pairs_of_positive_ints_are_refused(size, message):
    with pytest.raises(vitkit.ConfigError, match=message):
        resample_patch_kernel(torch.randn(4, 3, 16, 16), size)


def test_a_kernel_of_another_rank_is_refused():
    with pytest.raises(vitkit.InputError, match=r"patch kernel of shape \(4, 768\): expected \(dim, channels"):
        resample_patch_kernel(torch.randn(4, 768), (8, 8))


@pytest.mark.parametrize("patch_size", [8, 4])
def test_resize_patch_can_follow_timms_set_input_size(checkpoint, patch_size):
    """Two reference paths of timm: its loading path (bilinear, no antialias for FlexiViT: ``resize_patch``'s
    default, from the family's settings) and ``set_input_size`` (bicubic with antialias, for any ViT), which
    ``resize_patch(mode='bicubic', antialias=True)`` follows; they differ, so each match is earned."""
    peer = timm.create_model("flexivit_small", **TINY)
    peer.load_state_dict(load_file(checkpoint / "flexivit.safetensors"))
    peer.eval().set_input_size(patch_size=patch_size)
    loaded = timm_at_patch(checkpoint / "hub" / "model.safetensors", patch_size, "flexivit_small.1200ep_in1k")
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        assert (peer(x) - loaded(x)).abs().max().item() > 1e-3
        for how, reference in (({}, loaded), (dict(mode="bicubic", antialias=True), peer)):
            model = vitkit.load(checkpoint / "hub").eval()
            model.resize_patch(patch_size, **how)
            assert (model(x) - reference(x)).abs().max().item() <= 1e-5, how
            assert model.config.pos_interp == "bilinear"  # the family's setting stays for later resizes
    with pytest.raises(vitkit.ConfigError, match=r"resize_patch\(mode='cubic'\): expected one of"):
        model.resize_patch(8, mode="cubic")
