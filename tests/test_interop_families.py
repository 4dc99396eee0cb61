"""The families on the ViT skeleton (DeiT, DeiT-III, DINOv2 with registers, CLIP, SigLIP, QK-norm, SwiGLU),
saved by timm's and transformers' own models with every distinctive weight randomised, load with their
logits or pooled features."""

from functools import partial

import pytest
import torch
from interop_helpers import randomised
from safetensors.torch import save_file

import vitkit

timm = pytest.importorskip("timm")

# dynamic_img_size: timm resamples its position table for other sizes, to be matched too.
BASE = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2, num_classes=10,
            dynamic_img_size=True)


def timm_family(family):
    """A small timm model of ``family`` with its distinctive settings, and the overrides a bare state
    dict of it needs (the numerics the weights cannot show)."""
    from timm.layers import SwiGLUPacked
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    kinds = {
        "deit": (VisionTransformer, {}, {}),
        "deit-distilled": (VisionTransformerDistilled, {}, {}),
        "deit3": (VisionTransformer, dict(no_embed_class=True, init_values=1e-6), {}),
        "dinov2": (VisionTransformer, dict(init_values=1e-5), {}),
        "dinov2-reg4": (VisionTransformer, dict(init_values=1e-5, reg_tokens=4, no_embed_class=True), {}),
        "clip": (VisionTransformer, dict(pre_norm=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-5)),
                 dict(ln_eps=1e-5)),
        "clip-quickgelu": (VisionTransformer, dict(pre_norm=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-5),
                                                   act_layer="quick_gelu"), dict(ln_eps=1e-5, gelu="quick")),
        "siglip": (VisionTransformer, dict(class_token=False, global_pool="map", act_layer="gelu_tanh"),
                   dict(gelu="tanh")),
        "qk-norm": (VisionTransformer, dict(qk_norm=True), {}),
        "swiglu": (VisionTransformer, dict(mlp_layer=SwiGLUPacked, act_layer=torch.nn.SiLU, mlp_ratio=4,
                                           init_values=1e-5), {}),
    }
    cls, kwargs, overrides = kinds[family]
    return randomised(cls(**{**BASE, **kwargs})), {"num_heads": 4, **overrides}


FAMILIES = ["deit", "deit-distilled", "deit3", "dinov2", "dinov2-reg4", "clip", "clip-quickgelu", "siglip",
            "qk-norm", "swiglu"]


@pytest.mark.parametrize("family", FAMILIES)
def test_timm_families_give_timms_logits(tmp_path, family):
    peer, overrides = timm_family(family)
    path = tmp_path / "peer.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, path)
    model = vitkit.load(path, **overrides)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in peer.parameters())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(model.forward_head(model.forward_features(x), pre_logits=True),
                                   peer.forward_head(peer.forward_features(x), pre_logits=True), atol=1e-5, rtol=0)
        x = torch.randn(1, 3, 48, 40)  # another grid: the position table resampled as timm does
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)


def test_writers_refuse_what_their_format_cannot_hold(tmp_path):
    """Google's npz and HF's ViT have no LayerScale or registers: refused, naming the fields; a position
    table without prefix rows is written with zero rows there, which is exactly equivalent."""
    from vitkit.checkpoints.google import write_npz
    from vitkit.checkpoints.hf import write_hf

    config = dict(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
    dinov2 = vitkit.create_model(vitkit.ViTConfig(**config, layer_scale=1e-5, reg_tokens=4, no_embed_class=True))
    for write in (write_npz, write_hf):
        with pytest.raises(vitkit.CheckpointError, match="has no reg_tokens=4, layer_scale=1e-05"):
            write(dinov2, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    deit3 = randomised(vitkit.create_model(vitkit.ViTConfig(**config, no_embed_class=True)))
    x = torch.randn(2, 3, 16, 16)
    for write, name in ((write_npz, "m.npz"), (write_hf, "hf")):
        again = vitkit.load(write(deit3, tmp_path / name), gelu="exact")  # npz files do not record it
        assert again.config.pos_embed == "learned"
        with torch.no_grad():
            torch.testing.assert_close(again(x), deit3(x), atol=1e-5, rtol=0)
