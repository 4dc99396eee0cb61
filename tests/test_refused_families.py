"""Families issue 37 names that vitkit does not read yet (InternViT-6B, video towers such as V-JEPA 2), made and
saved by transformers: refused in one line naming the family and the nearest family vitkit reads."""

import pytest

import vitkit

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("make,family,nearest", [
    (lambda: transformers.VJEPA2Model(transformers.VJEPA2Config(hidden_size=64, num_hidden_layers=1,
                                                                num_attention_heads=4, pred_hidden_size=32,
                                                                pred_num_hidden_layers=1, pred_num_attention_heads=2,
                                                                crop_size=32, frames_per_clip=4)),
     "V-JEPA 2, a video tower", "DINOv3's rotary ViT"),
    (lambda: transformers.InternVLVisionModel(transformers.InternVLVisionConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, image_size=[28, 28],
        patch_size=[14, 14], use_qk_norm=True, norm_type="rms_norm")),
     "InternViT-6B", "InternViT-300M"),
])
def test_families_not_read_yet_are_refused_naming_the_nearest_one_read(tmp_path, make, family, nearest):
    """Issue 37's refusals by name: InternViT-6B (transformers' InternVL vision tower with QK-norm) and video towers
    such as V-JEPA 2, each in one line naming the family and the nearest family vitkit reads."""
    make().save_pretrained(tmp_path / "hf")
    with pytest.raises(vitkit.CheckpointError) as refused:
        vitkit.load(tmp_path / "hf")
    message = str(refused.value)
    assert family in message and nearest in message and "\n" not in message
