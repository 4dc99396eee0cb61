"""MetaCLIP 2's vision tower in transformers (``MetaClip2VisionModel``, ``...WithProjection``, and the whole
``MetaClip2Model``, its text tower left out): made by transformers with random weights, read with its last block's
tokens, its pooled [class] token and its projected image embedding, at the native size and at another; QuickGELU
or the config's hidden_act; the named sizes with transformers' parameter counts; the timm writer's state dict read
by timm's CLIP tower."""

import pytest
import torch
from interop_helpers import randomised

import vitkit

transformers = pytest.importorskip("transformers")

VISION = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
              patch_size=8)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=60)
SIZES = ((32, 32), (16, 48))  # the native size, and another grid: the table resampled bicubically as HF does


def peer_of(kind, act):
    """A MetaCLIP 2 model of ``kind``, the tower inside it, and how to get its image embedding (None without one)."""
    vision = dict(VISION, hidden_act=act)
    if kind == "whole":
        peer = transformers.MetaClip2Model(transformers.MetaClip2Config(vision_config=vision, text_config=TEXT,
                                                                        projection_dim=16))
        return peer, peer.vision_model, lambda x: peer.get_image_features(pixel_values=x,
                                                                          interpolate_pos_encoding=True).pooler_output
    if kind == "projection":
        peer = transformers.MetaClip2VisionModelWithProjection(transformers.MetaClip2VisionConfig(**vision,
                                                                                                  projection_dim=16))
        return peer, peer.vision_model, lambda x: peer(pixel_values=x, interpolate_pos_encoding=True).image_embeds
    peer = transformers.MetaClip2VisionModel(transformers.MetaClip2VisionConfig(**vision))
    return peer, peer, None


@pytest.mark.parametrize("kind,act", [("vision", "quick_gelu"), ("vision", "gelu"), ("projection", "quick_gelu"),
                                      ("whole", "quick_gelu")])
def test_metaclip2_gives_transformers_tokens_pooled_and_projected_outputs(tmp_path, kind, act):
    peer, tower, embed = peer_of(kind, act)
    randomised(peer, std=0.1)
    peer.save_pretrained(tmp_path / "hf")
    transformers.CLIPImageProcessor().save_pretrained(tmp_path / "hf")  # MetaCLIP 2's processor: CLIP's
    if kind == "whole":
        with pytest.warns(UserWarning, match="its image tower is read and its text tower"):
            model = vitkit.load(tmp_path / "hf")
    else:
        model = vitkit.load(tmp_path / "hf")
    c = model.config
    assert (c.pre_norm, c.patch_bias, c.ln_eps, c.provenance.normalization) == (True, False, 1e-5, "clip")
    assert c.gelu == ("quick" if act == "quick_gelu" else "exact")
    assert c.num_classes == (0 if embed is None else 16)
    for size in SIZES:
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            theirs = tower(pixel_values=x, interpolate_pos_encoding=True)
            # HF's last_hidden_state is the last block's output; its pooler the [class] token after the final norm
            torch.testing.assert_close(model.forward_intermediates(x).blocks[-1], theirs.last_hidden_state,
                                       atol=1e-5, rtol=0)
            features = model.forward_features(x)
            torch.testing.assert_close(model.forward_head(features, pre_logits=True), theirs.pooler_output,
                                       atol=1e-5, rtol=0)
            if embed is not None:
                torch.testing.assert_close(model(x), embed(x), atol=1e-5, rtol=0)
        assert theirs.pooler_output.abs().max() > 0.1


def test_metaclip2_classifier_head_is_refused_by_name(tmp_path):
    """MetaClip2ForImageClassification classifies the mean of the patches before the final norm: no vitkit head."""
    config = transformers.MetaClip2Config(vision_config=VISION, text_config=TEXT, num_labels=3)
    transformers.MetaClip2ForImageClassification(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(vitkit.CheckpointError, match="classifier.bias, classifier.weight: this HF head has no "
                                                     "counterpart in vitkit's clip model"):
        vitkit.load(tmp_path / "hf")


# MetaCLIP 2's released towers (facebook/metaclip-2-worldwide-*): vitkit's CLIP of that size with the projection as
# its head.
RELEASED = {"CLIP-B/32": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                              patch_size=32, projection_dim=512),
            "CLIP-L/14": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                              patch_size=14, projection_dim=768),
            "CLIP-H/14": dict(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, intermediate_size=5120,
                              patch_size=14, projection_dim=1024)}


@pytest.mark.parametrize("name", list(RELEASED))
def test_named_sizes_have_transformers_parameter_counts(name):
    with torch.device("meta"):
        peer = transformers.MetaClip2VisionModelWithProjection(transformers.MetaClip2VisionConfig(**RELEASED[name]))
        model = vitkit.create_model(name, num_classes=RELEASED[name]["projection_dim"])
    # vitkit's head has a bias (zero for CLIP's bias-free projection): one per output more
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in peer.parameters()) + model.head.out_features


def test_metaclip2_is_written_for_timm(tmp_path):
    """Back to timm's layout: timm's CLIP tower (pre-norm, eps 1e-5, QuickGELU) loads it strictly, same outputs."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import load_file

    from vitkit.checkpoints import export

    peer, _, embed = peer_of("projection", "quick_gelu")
    randomised(peer, std=0.1).save_pretrained(tmp_path / "hf")
    written = export(vitkit.load(tmp_path / "hf"), tmp_path / "back.safetensors", "timm")
    theirs = timm.create_model("vit_base_patch16_clip_quickgelu_224", img_size=32, patch_size=8, embed_dim=64,
                               depth=2, num_heads=4, mlp_ratio=2, num_classes=16)
    theirs.load_state_dict(load_file(written), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(x), embed(x), atol=1e-5, rtol=0)


def test_info_describes_a_whole_metaclip2(tmp_path, capsys):
    from vitkit.cli import main

    peer, _, _ = peer_of("whole", "quick_gelu")
    peer.save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning, match="text tower"):
        assert main(["info", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "GELU quick, LayerNorm eps 1e-05" in out and "16 classes" in out and "pre_norm=True" in out
