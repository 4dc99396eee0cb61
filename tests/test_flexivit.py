"""FlexiViT: one checkpoint run at another patch size, against timm's own resampling of the same weights."""

import pytest
import torch

import vitkit
from vitkit.models.patch_resize import resample_patch_kernel

timm = pytest.importorskip("timm")


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
