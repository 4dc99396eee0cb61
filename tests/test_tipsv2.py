"""Google's TIPSv2 (DINOv2 with one register, LayerScale, [0, 1] pixels as they are) from timm's hub directories
(``vit_*_patch14_reg1_tipsv2``) and transformers' directories (``Tipsv2VisionModel``, the whole ``Tipsv2Model``),
made by the peers' own code with random weights: the peers' tokens, pooled vector and logits at the native size
and at another, the "unit" statistics recorded without a warning, and the timm writer's state dict loaded by timm."""

import warnings

import pytest
import torch
from interop_helpers import assert_timms_outputs, randomised

import vitkit

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

SIZES = ((28, 28), (14, 42))  # the native size, and 16x48 pixels scaled to the 14-pixel patch


def pooled(model, x):
    return model.forward_head(model.forward_features(x), pre_logits=True)


def quietly_loaded(path):
    """vitkit.load(path), failing on any warning (an unknown normalisation among them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return vitkit.load(path)


@pytest.mark.parametrize("architecture", ["vit_base_patch14_reg1_tipsv2", "vit_giant_patch14_reg1_tipsv2"])
def test_timm_tipsv2_hub_directories_give_timms_outputs(tmp_path, architecture):
    from timm.models._hub import save_for_hf

    swiglu = dict(mlp_ratio=4) if "giant" in architecture else {}  # an even width for its packed gate and value
    peer = randomised(timm.create_model(architecture, img_size=28, embed_dim=64, depth=2, num_heads=4, num_classes=5,
                                        dynamic_img_size=True, **swiglu), std=0.1)
    save_for_hf(peer, str(tmp_path / "hub"))
    model = quietly_loaded(tmp_path / "hub")
    c = model.config
    assert (c.reg_tokens, c.no_embed_class, c.layer_scale, c.provenance.normalization) == (1, True, 1e-5, "unit")
    assert c.mlp == ("swiglu" if "giant" in architecture else "gelu")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in peer.parameters())
    for size in SIZES:
        assert assert_timms_outputs(model, peer, torch.rand(2, 3, *size)).abs().max() > 0.1


VISION = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=14, mlp_ratio=2)
TEXT = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50)


@pytest.mark.parametrize("variant", ["vision", "swiglu", "whole"])
def test_transformers_tipsv2_gives_its_tokens_and_pooled_class_token(tmp_path, variant):
    if variant == "whole":
        peer = transformers.Tipsv2Model(transformers.Tipsv2Config(vision_config=VISION, text_config=TEXT))
        tower = peer.vision_model
    else:
        config = transformers.Tipsv2VisionConfig(**VISION, use_swiglu_ffn=variant == "swiglu", layer_norm_eps=1e-5)
        peer = tower = transformers.Tipsv2VisionModel(config)
    randomised(peer, std=0.1)
    peer.save_pretrained(tmp_path / "hf")
    transformers.Tipsv2ImageProcessor().save_pretrained(tmp_path / "hf")
    if variant == "whole":
        with pytest.warns(UserWarning, match="a whole TIPSv2 model; its image tower is read and its text tower"):
            model = vitkit.load(tmp_path / "hf")
    else:
        model = quietly_loaded(tmp_path / "hf")
    c = model.config
    assert (c.reg_tokens, c.pos_interp, c.provenance.normalization) == (1, "bilinear", "unit")
    assert c.ln_eps == (1e-6 if variant == "whole" else 1e-5)
    for size in SIZES:
        x = torch.rand(2, 3, *size)  # TIPSv2's [0, 1] pixels, given to both
        with torch.no_grad():
            theirs = tower(pixel_values=x)
            torch.testing.assert_close(model.forward_features(x), theirs.last_hidden_state, atol=1e-5, rtol=0)
            torch.testing.assert_close(pooled(model, x), theirs.pooler_output, atol=1e-5, rtol=0)
        assert theirs.pooler_output.abs().max() > 0.1


def test_a_tipsv2_directory_without_a_processor_takes_unnormalised_pixels(tmp_path):
    transformers.Tipsv2VisionModel(transformers.Tipsv2VisionConfig(**VISION)).save_pretrained(tmp_path / "hf")
    assert quietly_loaded(tmp_path / "hf").config.provenance.normalization == "unit"


def test_tipsv2_is_written_for_timm_and_refused_by_formats_that_resample_otherwise(tmp_path):
    """Back to timm's layout (a bare state dict that timm's own TIPSv2 loads strictly); HF's DINOv2 format, which
    resamples its table bicubically, refuses an HF TIPSv2 model (bilinear) by name."""
    from safetensors.torch import load_file

    from vitkit.checkpoints import export

    peer = randomised(timm.create_model("vit_base_patch14_reg1_tipsv2", img_size=28, embed_dim=64, depth=2,
                                        num_heads=4), std=0.1)
    from timm.models._hub import save_for_hf
    save_for_hf(peer, str(tmp_path / "hub"))
    written = export(vitkit.load(tmp_path / "hub"), tmp_path / "back.safetensors", "timm")
    fresh = timm.create_model("vit_base_patch14_reg1_tipsv2", img_size=28, embed_dim=64, depth=2, num_heads=4)
    fresh.load_state_dict(load_file(written), strict=True)
    x = torch.rand(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(x), peer(x), atol=0, rtol=0)
    transformers.Tipsv2VisionModel(transformers.Tipsv2VisionConfig(**VISION)).save_pretrained(tmp_path / "hf")
    with pytest.raises(vitkit.CheckpointError, match="HF's dinov2 model cannot hold .*table resampled bilinear"):
        export(vitkit.load(tmp_path / "hf"), tmp_path / "out", "hf")


def test_info_says_tipsv2_takes_unnormalised_pixels(tmp_path, capsys):
    from vitkit.cli import main

    transformers.Tipsv2VisionModel(transformers.Tipsv2VisionConfig(**VISION)).save_pretrained(tmp_path / "hf")
    assert main(["info", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "normalised 'unit': mean [0.0, 0.0, 0.0], std [1.0, 1.0, 1.0]" in out and "reg_tokens=1" in out
