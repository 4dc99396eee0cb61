"""The same weights in timm's and torchvision's ViT give the same logits: the guard on eqs. (1)-(4)."""

import pytest
import torch

import vitkit

timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")

DIM, DEPTH, HEADS, MLP, PATCH, SIZE, CLASSES = 64, 3, 4, 256, 8, 32, 10


def randomised(model):
    """Random non-zero weights everywhere, so no parameter can hide behind an init of zeros or ones."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model.eval()


def ours(**overrides):
    config = vitkit.ViTConfig(image_size=SIZE, patch_size=PATCH, dim=DIM, depth=DEPTH, num_heads=HEADS,
                              mlp_dim=MLP, num_classes=CLASSES, **overrides)
    return randomised(vitkit.create_model(config))


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_timm_parity(pool):
    model = ours(pool=pool)
    peer = timm.models.vision_transformer.VisionTransformer(
        img_size=SIZE, patch_size=PATCH, embed_dim=DIM, depth=DEPTH, num_heads=HEADS, mlp_ratio=MLP / DIM,
        num_classes=CLASSES, global_pool="token" if pool == "token" else "avg", fc_norm=False).eval()
    state = {k.replace("pos_embed.weight", "pos_embed"): v for k, v in model.state_dict().items()}
    peer.load_state_dict(state, strict=True)
    x = torch.randn(4, 3, SIZE, SIZE)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)


def test_torchvision_parity():
    model = ours()
    peer = torchvision.models.VisionTransformer(image_size=SIZE, patch_size=PATCH, num_layers=DEPTH,
                                                num_heads=HEADS, hidden_dim=DIM, mlp_dim=MLP,
                                                num_classes=CLASSES).eval()
    state = {"class_token": model.cls_token, "conv_proj.weight": model.patch_embed.proj.weight,
             "conv_proj.bias": model.patch_embed.proj.bias, "encoder.pos_embedding": model.pos_embed.weight,
             "encoder.ln.weight": model.norm.weight, "encoder.ln.bias": model.norm.bias,
             "heads.head.weight": model.head.weight, "heads.head.bias": model.head.bias}
    for i, block in enumerate(model.blocks):
        prefix = f"encoder.layers.encoder_layer_{i}."
        for ours_name, theirs in [("norm1", "ln_1"), ("norm2", "ln_2"), ("attn.qkv", "self_attention.in_proj"),
                                  ("attn.proj", "self_attention.out_proj"), ("mlp.fc1", "mlp.0"),
                                  ("mlp.fc2", "mlp.3")]:
            module = block.get_submodule(ours_name)
            sep = "_" if theirs.endswith("in_proj") else "."
            state[prefix + theirs + sep + "weight"] = module.weight
            state[prefix + theirs + sep + "bias"] = module.bias
    peer.load_state_dict(state, strict=True)
    x = torch.randn(4, 3, SIZE, SIZE)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)


def test_timm_parity_at_another_resolution_with_antialias():
    """Our on-the-fly resampling equals timm's dynamic_img_size resampling (bicubic, antialias)."""
    model = ours(pos_interp_antialias=True)
    peer = timm.models.vision_transformer.VisionTransformer(
        img_size=SIZE, patch_size=PATCH, embed_dim=DIM, depth=DEPTH, num_heads=HEADS, mlp_ratio=MLP / DIM,
        num_classes=CLASSES, dynamic_img_size=True).eval()
    peer.load_state_dict({k.replace("pos_embed.weight", "pos_embed"): v for k, v in model.state_dict().items()})
    x = torch.randn(2, 3, 48, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)
