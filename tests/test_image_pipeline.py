"""One evaluation geometry for every command (cover size / crop_pct, centre-crop; stretch when asked), its
crop fraction read from each checkpoint family and written out again, against torchvision, timm and HF."""

import json

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F
from interop_helpers import randomised
from PIL import Image
from torchvision.transforms import v2

import vitkit
from vitkit.analysis.inputs import prepare, read_images
from vitkit.checkpoints.onnx import _metadata
from vitkit.cli import build_parser, main
from vitkit.data import build_transform
from vitkit.data.transforms import ToChannels
from vitkit.evaluate import predict
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models import Provenance

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

TINY = dict(patch_size=8, dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=4)


def config(size=32, crop_pct=1.0, normalization="imagenet"):
    return vitkit.ViTConfig(image_size=size, **TINY, provenance=Provenance(normalization=normalization,
                                                                          crop_pct=crop_pct))


def photo(height, width, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (3, height, width), dtype=np.uint8))


def test_a_non_square_image_is_cropped_as_torchvision_resizes_and_centre_crops_it():
    image = photo(50, 80)
    ours = checkpoint_transform(config(crop_pct=0.875))(image)
    by_hand = F.center_crop(F.resize(image, [36], antialias=True), [32, 32])  # 36 = floor(32 / 0.875)
    reference = F.normalize(by_hand.float() / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)


def test_a_non_square_size_is_covered_as_timm_does():
    from timm.data import create_transform

    image = photo(61, 45)
    theirs = create_transform((3, 32, 48), crop_pct=0.9, interpolation="bilinear", use_prefetcher=True)(image)
    ours = checkpoint_transform(config(crop_pct=0.9), image_size=(32, 48)).per_image(image)
    assert ours.shape == theirs.shape == (3, 32, 48)
    # timm resizes uint8 through torchvision's v1 functional (via floats), vitkit through v2's uint8 kernel
    torch.testing.assert_close(ours.int(), theirs.int(), atol=1, rtol=0)


def test_stretch_resizes_straight_to_the_size_and_crop_1_of_a_square_image_is_unchanged():
    image = photo(50, 80)
    stretched = checkpoint_transform(config(crop_pct=0.875), "stretch").per_image(image)
    assert torch.equal(stretched, v2.Resize([32, 32], antialias=True)(image))
    digit = photo(28, 28)[:1]  # what training on MNIST evaluated before: a plain resize
    for transform in (checkpoint_transform(config(normalization="google")), build_transform("eval", (32, 32), 3)):
        assert torch.equal(transform.per_image(digit), v2.Resize([32, 32], antialias=True)(digit).expand(3, -1, -1))


def test_colour_becomes_grey_for_a_one_channel_model_by_pils_luminance():
    image = photo(6, 7)
    grey = np.asarray(Image.fromarray(image.permute(1, 2, 0).numpy()).convert("L"))
    np.testing.assert_allclose(ToChannels(1)(image)[0].numpy(), grey, atol=1)
    assert ToChannels(1)(torch.full((3, 1, 1), 255, dtype=torch.uint8)).item() == 255


def test_predict_and_analyze_see_the_same_pixels(tmp_path):
    model = randomised(vitkit.create_model(config(crop_pct=0.875)))
    Image.fromarray(photo(45, 70).permute(1, 2, 0).numpy()).save(tmp_path / "wide.png")
    [predicted] = predict(model, [tmp_path / "wide.png"], top_k=4)
    images, shown = prepare(read_images([tmp_path / "wide.png"]), checkpoint_transform(model.config))
    with torch.no_grad():
        probabilities = model(images).softmax(-1)[0]
    order = probabilities.argsort(descending=True)
    assert predicted.labels == [str(i) for i in order.tolist()]
    assert predicted.probabilities == probabilities[order].tolist()  # bit for bit: the same tensor went in
    assert shown[0].shape == (32, 32, 3)


def test_predict_on_the_command_line_stretches_only_when_asked(tmp_path, capsys):
    randomised(vitkit.create_model(config(crop_pct=0.875))).save(tmp_path / "ckpt")
    image = photo(45, 70)
    Image.fromarray(image.permute(1, 2, 0).numpy()).save(tmp_path / "wide.png")
    model = vitkit.load(tmp_path / "ckpt").eval()
    by_hand = {"crop": F.center_crop(F.resize(image, [36], antialias=True), [32, 32]),
               "stretch": F.resize(image, [32, 32], antialias=True)}
    for resize, pixels in by_hand.items():
        assert main(["predict", str(tmp_path / "ckpt"), str(tmp_path / "wide.png"), "--resize", resize]) == 0
        with torch.no_grad():
            inputs = F.normalize(pixels.float() / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
            best = model(inputs[None]).softmax(-1)[0].max(0)
        assert capsys.readouterr().out.startswith(f"{tmp_path / 'wide.png'}: {best.indices} {100 * best.values:.1f}%")


def test_the_resize_flag_reaches_every_command_that_evaluates():
    parser = build_parser()
    for command in (["eval", "ckpt"], ["predict", "ckpt", "a.png"], ["analyze", "ckpt", "--out", "o"],
                    ["fewshot", "ckpt"]):
        assert parser.parse_args(command).resize == "crop"
        assert parser.parse_args([*command, "--resize", "stretch"]).resize == "stretch"


def test_a_timm_hub_directory_carries_its_crop_pct(tmp_path):
    from timm.models._hub import save_for_hf

    peer = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                             num_classes=3)
    peer.pretrained_cfg = {**peer.pretrained_cfg, "crop_pct": 0.9, "crop_mode": "center"}
    save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=True)
    assert vitkit.load(tmp_path / "hub").config.provenance.crop_pct == 0.9

    hub = json.loads((tmp_path / "hub" / "config.json").read_text())
    hub["pretrained_cfg"]["crop_mode"] = "squash"
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    with pytest.warns(UserWarning, match=r"config.json: pretrained_cfg.crop_mode='squash'"):
        vitkit.load(tmp_path / "hub")
    hub["pretrained_cfg"]["crop_pct"] = 1.2
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    with pytest.raises(vitkit.CheckpointError, match=r"config.json: pretrained_cfg.crop_pct=1.2"):
        vitkit.load(tmp_path / "hub")


@pytest.mark.parametrize("processor, crop_pct", [
    (dict(do_center_crop=True, size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}), 0.8),  # BiT's
    (dict(do_center_crop=True, size={"height": 256, "width": 256}, crop_size={"height": 224, "width": 224}),
     0.875),  # DeiT's
    (dict(do_center_crop=True, size=36, crop_size=32, crop_pct=0.9), 0.9),  # named outright
    (dict(do_center_crop=False, size={"height": 32, "width": 32}), 1.0),  # HF stretches the whole image
])
def test_an_hf_directory_carries_its_crop(tmp_path, processor, crop_pct):
    peer = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
        patch_size=8, num_labels=3))
    peer.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(processor))
    assert vitkit.load(tmp_path / "hf").config.provenance.crop_pct == crop_pct


def test_hf_and_onnx_exports_carry_the_crop(tmp_path):
    model = vitkit.create_model(config(crop_pct=0.875))
    vitkit.checkpoints.export(model, tmp_path / "hf", "hf")
    assert vitkit.load(tmp_path / "hf").config.provenance.crop_pct == 0.875
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    image = photo(36, 50)  # shorter side already 32 / 0.875: no resampling, so the crops must agree exactly
    theirs = processor(image.permute(1, 2, 0).numpy(), return_tensors="pt").pixel_values[0]
    torch.testing.assert_close(checkpoint_transform(model.config)(image), theirs, atol=1e-6, rtol=0)
    assert json.loads(_metadata(model.config)["crop_pct"]) == 0.875


def test_registry_families_record_timms_crop():
    from timm.models import get_pretrained_cfg

    for name, architecture in (("DeiT-B/16", "deit_base_patch16_224"), ("DeiT3-B/16", "deit3_base_patch16_224"),
                               ("DINOv2-B/14", "vit_base_patch14_dinov2")):
        assert vitkit.models.model_config(name).provenance.crop_pct == get_pretrained_cfg(architecture).crop_pct
    assert vitkit.models.model_config("ViT-B/16").provenance.crop_pct == 1.0  # Google's: big_vision resizes
