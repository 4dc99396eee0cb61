"""The named variants of 2022-25 (DINOv3, EVA-02, Perception Encoder, SigLIP 2, AIMv2, FlexiViT) against timm's own
definitions: each name's parameter count, sizes, image size and head equal those of timm's model of it (built on the
meta device); a small model of each name, given the weights of a small timm model of the same definition, computes
timm's outputs, so that what a count cannot show (rotary coordinates and frequencies, norms, activation, pooling)
is timm's too; `vitkit models` lists them."""

import pytest
import torch
from interop_helpers import randomised

import vitkit
from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.models.registry import GEMMA4_VARIANTS, QWEN_VARIANTS, RECENT_VARIANTS

timm = pytest.importorskip("timm")

# Each name and timm's architecture of it, built with timm's defaults (head, image size).
TIMM_NAMES = {
    "DINOv3-S/16": "vit_small_patch16_dinov3", "DINOv3-S+/16": "vit_small_plus_patch16_dinov3",
    "DINOv3-B/16": "vit_base_patch16_dinov3", "DINOv3-L/16": "vit_large_patch16_dinov3",
    "DINOv3-H+/16": "vit_huge_plus_patch16_dinov3",
    "EVA02-Ti/14": "eva02_tiny_patch14_224", "EVA02-S/14": "eva02_small_patch14_224",
    "EVA02-B/14": "eva02_base_patch14_224", "EVA02-L/14": "eva02_large_patch14_224",
    "PE-core-T/16": "vit_pe_core_tiny_patch16_384", "PE-core-S/16": "vit_pe_core_small_patch16_384",
    "PE-core-B/16": "vit_pe_core_base_patch16_224", "PE-core-L/14": "vit_pe_core_large_patch14_336",
    "SigLIP2-B/16": "vit_base_patch16_siglip_224", "AIMv2-L/14": "aimv2_large_patch14_224",
    "FlexiViT-S/16": "flexivit_small", "FlexiViT-B/16": "flexivit_base", "FlexiViT-L/16": "flexivit_large",
    "TIPSv2-B/14": "vit_base_patch14_reg1_tipsv2", "TIPSv2-L/14": "vit_large_patch14_reg1_tipsv2",
    "TIPSv2-So400m/14": "vit_so400m_patch14_reg1_tipsv2", "TIPSv2-g/14": "vit_giant_patch14_reg1_tipsv2",
    "C-RADIOv3-B/16": "vit_base_patch16_radio_v3", "C-RADIOv3-L/16": "vit_large_patch16_radio_v3",
    "C-RADIOv3-H/16": "vit_huge_patch16_radio_v3", "C-RADIOv3-g/16": "vit_giant_patch16_radio_v3",
    "C-RADIOv4-So400m/16": "vit_so400m_patch16_radio_v4", "C-RADIOv4-H/16": "vit_huge_patch16_radio_v4",
}
SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)


def parameters(model):
    return sum(p.numel() for p in model.parameters())


def test_every_recent_variant_has_a_timm_twin():
    assert sorted(TIMM_NAMES) == sorted(RECENT_VARIANTS)
    # Gemma 4's and the Qwen towers' come last (tests/test_interop_gemma4.py, tests/test_qwen.py)
    recent = vitkit.list_models()[:-len(GEMMA4_VARIANTS) - len(QWEN_VARIANTS)]
    assert recent[-len(RECENT_VARIANTS):] == list(RECENT_VARIANTS)


@pytest.mark.parametrize("name", list(TIMM_NAMES))
def test_parameter_counts_and_sizes_equal_timms(name):
    with torch.device("meta"):
        peer = timm.create_model(TIMM_NAMES[name], pretrained=False)
        model = vitkit.create_model(name)
    c = model.config
    assert parameters(model) == parameters(peer)
    block = peer.blocks[0]
    assert (c.depth, c.dim, c.num_heads, c.mlp_dim) == (len(peer.blocks), peer.embed_dim, block.attn.num_heads,
                                                        block.mlp.fc2.in_features)
    assert (c.image_size, c.num_classes) == (tuple(peer.patch_embed.img_size), peer.num_classes)
    if peer.attn_pool is not None:
        assert model.attn_pool.num_heads == peer.attn_pool.num_heads


def siglip2_peer(**kwargs):
    """timm's SigLIP tower at 224 with the activation of timm's own SigLIP 2 definition (NaFlex): the tanh GELU
    that SigLIP 2 was trained with, where timm's 224 definition (older than SigLIP 2) runs the exact one."""
    with torch.device("meta"):
        naflex = timm.create_model("naflexvit_base_patch16_siglip")
    assert isinstance(naflex.blocks[0].mlp.act, timm.layers.GELUTanh)
    return timm.create_model("vit_base_patch16_siglip_224", act_layer="gelu_tanh", **kwargs)


def small_peer(name):
    """A small timm model of ``name``'s definition with every weight random; sizes another grid where timm does."""
    architecture = TIMM_NAMES[name]
    if name.startswith("SigLIP2"):
        return randomised(siglip2_peer(**SMALL, dynamic_img_size=True), std=0.3)
    even = dict(mlp_ratio=4) if name == "TIPSv2-g/14" else {}  # SwiGLUPacked needs an even width at 64 wide
    return randomised(timm.create_model(architecture, **SMALL, dynamic_img_size=True, **even), std=0.3)


@pytest.mark.parametrize("name", list(TIMM_NAMES))
def test_a_small_model_of_each_name_computes_timms_outputs(tmp_path, name):
    from timm.models._hub import save_for_hf

    theirs = small_peer(name)
    save_for_hf(theirs, str(tmp_path / "hub"))
    weights = vitkit.load(tmp_path / "hub").state_dict()  # timm's weights in vitkit's layout; its config unused
    model = vitkit.create_model(name, image_size=32, patch_size=8, dim=64, depth=2, num_heads=4, num_classes=5,
                                mlp_dim=theirs.blocks[0].mlp.fc2.in_features).eval()
    model.load_state_dict(weights)
    # FlexiViT's and C-RADIO's tables are resized bilinear, as timm loads their weights; timm resizes them bicubic
    # when it runs another size, so only the native one is compared (test_radio compares timm's loading path).
    sizes = [(32, 32)] if name.startswith(("FlexiViT", "C-RADIO")) else [(32, 32), (48, 40)]
    for height, width in sizes:
        images = torch.randn(2, 3, height, width)
        with torch.no_grad():
            features = theirs.forward_features(images)
            torch.testing.assert_close(model.forward_features(images), features, atol=1e-5, rtol=0)
            torch.testing.assert_close(model(images), theirs(images), atol=1e-5, rtol=0)
        assert features.abs().max() > 0.2  # the comparison is of real, non-zero outputs


@pytest.mark.parametrize("name,canonical", [("dinov3-h+/16", "DINOv3-H+/16"), (" pe-core-t/16 ", "PE-core-T/16"),
                                            ("SIGLIP2-B/16", "SigLIP2-B/16"), ("eva02-l/14", "EVA02-L/14")])
def test_names_are_case_insensitive_and_canonical(name, canonical):
    assert vitkit.models.model_config(name).provenance.name == canonical


@pytest.mark.parametrize("name,sizes", [("DINOv3-H/16", "S, S\\+, B, L, H\\+"), ("PE-core-Ti/16", "T, S, B, L"),
                                        ("AIMv2-B/14", "L"), ("DeiT-T/16", "Ti, S, B, L, H, M, So400m, g")])
def test_a_size_a_family_does_not_have_is_refused_naming_its_sizes(name, sizes):
    with pytest.raises(ConfigError, match=f"unknown model '{name}': .* comes in sizes {sizes}$"):
        vitkit.models.model_config(name)


def test_the_models_table_lists_them(capsys):
    assert main(["models", "DINOv3-H+/16", "PE-core-L/14", "AIMv2-L/14"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    got = {row[0]: row[1:] for row in rows if row and row[0] in TIMM_NAMES}
    assert got["DINOv3-H+/16"][:7] == ["32", "1280", "5120", "20", "256x256", "0", "840,509,440"]
    assert got["PE-core-L/14"][:7] == ["24", "1024", "4096", "16", "336x336", "1024", "317,152,256"]
    assert got["AIMv2-L/14"][:7] == ["24", "1024", "2816", "8", "224x224", "0", "309,197,824"]
