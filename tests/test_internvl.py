"""InternViT-300M as transformers holds it (issue 37): InternVLVisionModel and the vision tower of a whole InternVL
model, made tiny by transformers' own code with every weight random, saved as it saves them and read by vitkit: every
token's last state within 1e-5 at the native size and at a non-square one (the table resized as transformers resizes
it), the [class] token as the pooled output."""

import pytest
import torch
from interop_helpers import randomised

import vitkit

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=0)


def vision_config(**kwargs):
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, image_size=[32, 32],
                patch_size=[8, 8], attention_bias=True, layer_scale_init_value=0.1)
    return transformers.InternVLVisionConfig(**{**base, **kwargs})


def check(model, peer):
    for size in ((32, 32), (16, 48)):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            tokens = peer(pixel_values=images).last_hidden_state
            features = model.forward_features(images)
            torch.testing.assert_close(features, tokens, **TOL)
            torch.testing.assert_close(model.forward_head(features, pre_logits=True), tokens[:, 0], **TOL)
        assert tokens.abs().max() > 0.5


@pytest.mark.parametrize("options", [dict(), dict(use_mean_pooling=False, attention_bias=False)])
def test_internvl_vision_model_gives_its_tokens(tmp_path, options):
    torch.manual_seed(0)
    peer = randomised(transformers.InternVLVisionModel(vision_config(**options)), std=0.3)
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    c = model.config
    assert (c.layer_scale is not None, c.final_norm, c.qkv_bias, c.class_token, c.pos_interp_antialias) == (
        True, "use_mean_pooling" in options, options.get("attention_bias", True), True, False)
    assert c.provenance.format == "hf-internvl" and c.provenance.normalization == "imagenet"
    check(model, peer)


def test_the_vision_tower_of_a_whole_internvl_model_is_read(tmp_path):
    text = dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1)
    whole = transformers.InternVLForConditionalGeneration(transformers.InternVLConfig(
        vision_config=vision_config().to_dict(), text_config=text, image_token_id=1))
    torch.manual_seed(0)
    tower = randomised(whole.model.vision_tower, std=0.3)
    whole.save_pretrained(tmp_path / "whole", max_shard_size="20KB")
    with pytest.warns(UserWarning, match=r"a whole InternVL model; its vision tower \((model\.)?vision_tower\.\*\)"):
        model = vitkit.load(tmp_path / "whole")
    check(model, tower)


@pytest.mark.parametrize("model_type, family", [("internvl", "an InternVL"), ("qwen2_5_vl", "a Qwen2.5-VL")])
def test_a_whole_model_without_a_vision_tower_is_refused(tmp_path, model_type, family):
    import json

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(model_type=model_type, vision_config=None)))
    with pytest.raises(vitkit.CheckpointError, match=f"^{tmp_path / 'm' / 'config.json'}: {family} model without a "
                                                     f"vision_config; vitkit reads its vision tower$"):
        vitkit.load(tmp_path / "m")
