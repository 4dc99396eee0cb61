"""The families of 2023-25 on timm's Eva and VisionTransformer (DINOv3, EVA and EVA-02, Perception Encoder,
RoPE-ViT axial and mixed, timm's RoPE ViTs, AIMv2), made by timm's own definitions with every weight randomised
and saved as timm saves them (hub directories and bare state dicts), load with timm's features and logits: at
the native size and, where timm computes other grids, at a non-square one."""

import json

import pytest
import torch
from interop_helpers import randomised
from safetensors.torch import save_file

import vitkit

timm = pytest.importorskip("timm")

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
# architecture -> the vitkit fields its definition must set (what the weights alone cannot show).
ARCHITECTURES = {
    "vit_small_patch16_dinov3": dict(rope="axial", rope_grid="centered", rope_theta=100.0, rope_half=True,
                                     reg_tokens=4, k_bias=True, qkv_bias=False, ln_eps=1e-5, pool="gap"),
    "vit_small_patch16_dinov3_qkvb": dict(rope="axial", k_bias=False, qkv_bias=True),
    "vit_small_plus_patch16_dinov3": dict(mlp="swiglu"),
    "vit_small_patch16_lingbot": dict(rope_grid="centered", reg_tokens=4, pool="token"),
    "eva02_tiny_patch14_224": dict(rope="axial", rope_ref_grid=16, rope_xy=False, k_bias=False, fc_norm=True),
    "eva02_base_patch14_224": dict(mlp_norm=True, mlp="swiglu"),
    "eva02_base_patch16_clip_224": dict(attn_norm=True, pool="token"),
    "eva_giant_patch14_224": dict(rope="none", k_bias=False),
    "vit_pe_core_base_patch16_224": dict(rope="axial", rope_ref_grid=14, rope_offset=1.0, rope_xy=True, pool="map",
                                         pool_heads=8, pre_norm=True, ln_eps=1e-5, class_token=True),
    "vit_pe_core_gigantic_patch14_448": dict(rope_offset=0.0, class_token=False, pool_mlp_dim=256),
    "vit_small_patch16_rope_224": dict(rope="axial", rope_theta=100.0, rope_xy=True, pos_embed="none"),
    "vit_small_patch16_rope_mixed_224": dict(rope="mixed"),
    "vit_small_patch16_rope_mixed_ape_224": dict(rope="mixed", pos_embed="learned", no_embed_class=True),
    "vit_base_patch16_rope_reg1_gap_256": dict(rope="axial", rope_ref_grid=16, class_token=False, reg_tokens=1),
    "aimv2_large_patch14_224": dict(norm="rms", ln_eps=1e-5, patch_norm=True, proj_bias=False, qkv_bias=False,
                                    mlp="swiglu"),
}
# timm computes these at any size (their own rotary tables and resampled position tables).
DYNAMIC = [name for name in ARCHITECTURES if name != "eva_giant_patch14_224"]


def peer(architecture, **kwargs):
    return randomised(timm.create_model(architecture, **{**SMALL, **kwargs}), std=0.1)


def assert_same(model, theirs, x):
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), theirs.forward_features(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(model(x), theirs(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_timm_hub_directories_give_timms_outputs(tmp_path, architecture):
    from timm.models._hub import save_for_hf

    theirs = peer(architecture, num_classes=5, dynamic_img_size=architecture in DYNAMIC)
    save_for_hf(theirs, str(tmp_path / "hub"))
    model = vitkit.load(tmp_path / "hub")
    for field, value in ARCHITECTURES[architecture].items():
        assert getattr(model.config, field) == value, field
    assert model.config.image_size == (32, 32)  # from model_args, also where no position table shows it
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert_same(model, theirs, torch.randn(2, 3, 32, 32))
    if architecture in DYNAMIC:  # another, non-square grid: rotary tables and position tables follow
        assert_same(model, theirs, torch.randn(1, 3, 48, 40))


@pytest.mark.parametrize("architecture", ["vit_small_patch16_dinov3", "eva02_base_patch14_224",
                                          "vit_small_patch16_rope_mixed_ape_224", "vit_small_patch16_rope_224",
                                          "vit_base_patch16_rope_reg1_gap_256", "aimv2_large_patch14_224",
                                          "eva02_base_patch16_clip_224"])
def test_bare_state_dicts_are_read_by_the_family_their_keys_show(tmp_path, architecture):
    """DINOv3's layout is pooled by the patches' mean (timm's vit_*_dinov3) or by [class] (LingBot): told."""
    theirs = peer(architecture, num_classes=3)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "w.safetensors")
    told = dict(pool="gap") if "dinov3" in architecture else {}
    model = vitkit.load(tmp_path / "w.safetensors", num_heads=4, **told)
    assert_same(model, theirs, torch.randn(2, 3, 32, 32))


def test_perception_encoder_is_never_read_as_a_plain_vit(tmp_path):
    """A PE-core state dict holds no rotary buffers, so no key is missing, and its keys are those of a timm ViT
    with a pre-norm and an attention pool: refused naming both, read exactly from its hub directory (8-head pool,
    eps 1e-5, the rotary grid of offset 1, x first, the definition's reference grid), and as a plain ViT when told."""
    from timm.models._hub import save_for_hf

    theirs = peer("vit_pe_core_base_patch16_224", num_classes=7)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "pe.safetensors")
    with pytest.raises(vitkit.CheckpointError, match=r"pe.safetensors: a timm state dict with a pre-norm and an "
                                                     r"attention pool, as both timm's ViT .* and Perception Encoder"):
        vitkit.load(tmp_path / "pe.safetensors", num_heads=4)
    save_for_hf(theirs, str(tmp_path / "hub"))
    model = vitkit.load(tmp_path / "hub")
    assert (model.config.pool_heads, model.config.ln_eps, model.config.rope_ref_grid) == (8, 1e-5, 14)
    assert_same(model, theirs, torch.randn(2, 3, 32, 32))
    vit = randomised(timm.models.vision_transformer.VisionTransformer(**SMALL, pre_norm=True, global_pool="map"))
    save_file({k: v.contiguous() for k, v in vit.state_dict().items()}, tmp_path / "vit.safetensors")
    assert_same(vitkit.load(tmp_path / "vit.safetensors", num_heads=4, rope="none"), vit, torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("architecture,family", [
    ("vit_pe_lang_large_patch14_448", "Perception Encoder's language and spatial towers"),
    ("eva02_enormous_patch14_clip_224", "EVA-02-E's post-norm blocks"),
])
def test_architectures_not_computed_are_refused_naming_them(tmp_path, architecture, family):
    from timm.models._hub import save_for_hf

    save_for_hf(peer("vit_small_patch16_dinov3"), str(tmp_path / "hub"))
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    (tmp_path / "hub" / "config.json").write_text(json.dumps({**config, "architecture": architecture}))
    with pytest.raises(vitkit.CheckpointError, match=f"{architecture}'?: vitkit does not compute {family}"):
        vitkit.load(tmp_path / "hub")


def test_rope_head_widths_are_checked(tmp_path):
    """A head count that leaves a head width not divisible by 4 cannot carry two rotary axes: one line."""
    from timm.models._hub import save_for_hf

    save_for_hf(peer("vit_small_patch16_dinov3"), str(tmp_path / "hub"))
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    config["model_args"]["num_heads"] = 32
    (tmp_path / "hub" / "config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match=r"num_heads: expected a count that leaves a head width "
                                                     r"\(dim=64 / num_heads\) divisible by 4 for rope='axial', got 32"):
        vitkit.load(tmp_path / "hub")
    theirs = peer("vit_small_patch16_rope_mixed_224")
    state = {k: v.contiguous() for k, v in theirs.state_dict().items()}
    state["rope.freqs"] = state["rope.freqs"][:, :1].contiguous()  # frequencies for one block of two
    save_file(state, tmp_path / "mixed.safetensors")
    with pytest.raises(vitkit.CheckpointError, match=r"rope.freqs: checkpoint \(2, 1, 4, 8\) vs model \(2, 2, 4, 8\)"):
        vitkit.load(tmp_path / "mixed.safetensors")


@pytest.mark.parametrize("architecture", ["vit_small_patch16_dinov3", "vit_small_patch16_dinov3_qkvb",
                                          "eva02_base_patch14_224", "eva02_tiny_patch14_224",
                                          "vit_pe_core_base_patch16_224", "vit_small_patch16_rope_mixed_224",
                                          "vit_base_patch16_rope_reg1_gap_256", "aimv2_large_patch14_224"])
def test_timm_writer_gives_timm_a_hub_directory_it_loads(tmp_path, architecture):
    """vitkit's timm export of a family model is a hub directory timm's own ``local-dir:`` loader builds and fills
    strictly, with the same outputs at another size; as a bare state dict, vitkit reads it back the same."""
    from timm.models._hub import save_for_hf
    from vitkit.checkpoints import export

    save_for_hf(peer(architecture, num_classes=5), str(tmp_path / "hub"))
    model = vitkit.load(tmp_path / "hub")
    export(model, tmp_path / "out", "timm")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    assert_same(model, theirs, torch.randn(2, 3, 32, 40))
    if "pe_core" not in architecture:  # a bare PE state dict is refused: its layout is also a plain ViT's
        told = dict(pool=model.config.pool) if "dinov3" in architecture else {}
        again = vitkit.load(export(model, tmp_path / "out.safetensors", "timm"), num_heads=4, **told)
        assert_same(again, theirs, torch.randn(1, 3, 32, 32))


def test_timm_writer_refuses_what_eva_cannot_hold(tmp_path):
    from vitkit.checkpoints import export

    config = vitkit.ViTConfig(image_size=32, patch_size=8, dim=64, depth=1, num_heads=4, mlp_dim=128, num_classes=3,
                              rope="axial", gelu="tanh", patch_norm=True)
    with pytest.raises(vitkit.CheckpointError, match=r"timm's eva02_base cannot hold gelu='tanh', a position table "
                                                     r"resampled otherwise than bicubic with antialias .*, "
                                                     r"proj_bias=False or patch_norm without RMSNorm; write it as "
                                                     r"'native'"):
        export(vitkit.VisionTransformer(config), tmp_path / "out", "timm")
    plain = vitkit.ViTConfig(image_size=32, patch_size=8, dim=64, depth=1, num_heads=4, mlp_dim=128, pool="map",
                             class_token=False, pool_heads=2)
    with pytest.raises(vitkit.CheckpointError, match="VisionTransformer state dict has no pool_heads or pool_mlp_dim"):
        export(vitkit.VisionTransformer(plain), tmp_path / "plain.safetensors", "timm")


def test_a_bare_dinov3_layout_needs_its_pooling_told(tmp_path):
    """timm's vit_*_dinov3 pool the patches' mean, DINOv3's own and LingBot the [class] token: same keys."""
    save_file({k: v.contiguous() for k, v in peer("vit_small_patch16_lingbot").state_dict().items()},
              tmp_path / "w.safetensors")
    with pytest.raises(vitkit.CheckpointError, match=r"w.safetensors: a DINOv3-layout state dict, .* pass "
                                                     r"pool='gap' or pool='token'"):
        vitkit.load(tmp_path / "w.safetensors", num_heads=4)


@pytest.mark.parametrize("architecture,model_args,expected", [
    ("vit_small_patch16_dinov3", dict(rope_temperature="abc"), r"model_args.rope_temperature='abc'; expected a "
                                                                r"positive number"),
    ("vit_small_patch16_dinov3", dict(rope_grid_offset=None), r"model_args.rope_grid_offset=None; expected a "
                                                               r"finite number"),
    ("eva02_tiny_patch14_224", dict(ref_feat_shape=[16, 8]), r"ref_feat_shape=\[16, 8\]; vitkit's rotary grid is "
                                                             r"square"),
    ("vit_small_patch16_dinov3", dict(img_size="x"), r"image_size: expected an int or a \(height, width\) pair of ints, each >= 1, got 'x'"),
    ("vit_pe_core_base_patch16_224", dict(attn_pool_num_heads=0), r"model_args.attn_pool_num_heads=0; expected an "
                                                                   r"integer >= 1"),
])
def test_bad_model_args_of_a_hub_directory_are_one_line_errors(tmp_path, capsys, architecture, model_args, expected):
    from timm.models._hub import save_for_hf

    from vitkit.cli import main

    save_for_hf(peer(architecture), str(tmp_path / "hub"))
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    config["model_args"].update(model_args)
    (tmp_path / "hub" / "config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match=expected):
        vitkit.load(tmp_path / "hub")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "hub")]) == 1  # a checkpoint error: one line, no traceback
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
