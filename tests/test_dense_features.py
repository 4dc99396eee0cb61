"""Dense patch features at any image size (vitkit.analysis.patch_features, vitkit predict --features) against
timm's own models: the patch tokens of timm's forward_features laid on the grid, and timm's pooled pre-logits,
for the same weights and the same pixels prepared by hand."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import safe_open

import vitkit
from vitkit.analysis import feature_colours, patch_features
from vitkit.cli import main
from vitkit.evaluate.predict import aspect_size

timm = pytest.importorskip("timm")


def timm_peer(architecture, **kwargs):
    torch.manual_seed(0)
    model = timm.create_model(architecture, img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                              dynamic_img_size=True, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


def saved(theirs, tmp_path):
    from timm.models._hub import save_for_hf

    save_for_hf(theirs, str(tmp_path / "hub"))
    return tmp_path / "hub"


def timm_grid(theirs, images):
    """timm's patch tokens after its final norm, (B, D, rows, cols), prefix tokens dropped."""
    tokens = theirs.forward_features(images)[:, theirs.num_prefix_tokens:]
    rows, cols = images.shape[-2] // 8, images.shape[-1] // 8
    return tokens.reshape(len(images), rows, cols, -1).permute(0, 3, 1, 2)


@pytest.mark.parametrize("architecture", ["vit_small_patch16_dinov3", "vit_medium_patch16_rope_reg1_gap_256",
                                          "eva02_tiny_patch14_224", "aimv2_large_patch14_224"])
@pytest.mark.parametrize("size", [(32, 32), (40, 64), (56, 24)])
def test_patch_features_equal_timms_patch_tokens_on_the_grid(tmp_path, architecture, size):
    theirs = timm_peer(architecture)
    model = vitkit.load(saved(theirs, tmp_path)).eval()
    images = torch.randn(2, 3, *size)
    with torch.no_grad():
        ours = patch_features(model, images)
        expected = timm_grid(theirs, images)
    assert ours.shape == (2, 64, size[0] // 8, size[1] // 8)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_aspect_sizes_keep_the_ratio_rounded_to_the_patch():
    assert aspect_size(427, 640, 224, 16) == (224, 336)  # 640 * 224 / 427 = 335.7
    assert aspect_size(300, 200, 224, 8) == (336, 224)
    assert aspect_size(10, 1000, 16, 16) == (16, 1600)
    assert aspect_size(1000, 3, 16, 16) == (5328, 16)  # 5333.3 -> 333 patches
    assert aspect_size(64, 64, 20, 16) == (16, 16)  # 20 rounds to 16, never below one patch


def prepared_by_hand(file, size, mean, std):
    """The file's pixels (PIL) resized as uint8 (bilinear, antialiased) to ``size`` and normalised."""
    pixels = torch.from_numpy(np.array(Image.open(file).convert("RGB"))).permute(2, 0, 1)[None]
    resized = F.interpolate(pixels, size=size, mode="bilinear", antialias=True, align_corners=False).float()
    return (resized / 255 - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


def test_predict_writes_dense_features_and_embeddings_of_images_of_any_size(tmp_path, capsys):
    theirs = timm_peer("vit_small_patch16_dinov3", num_classes=5)
    hub = saved(theirs, tmp_path)
    cfg = json.loads((hub / "config.json").read_text())["pretrained_cfg"]
    rng = np.random.default_rng(0)
    files = [tmp_path / "wide.png", tmp_path / "tall.png"]
    Image.fromarray(rng.integers(0, 256, (45, 70, 3), dtype=np.uint8)).save(files[0])
    Image.fromarray(rng.integers(0, 256, (90, 50, 3), dtype=np.uint8)).save(files[1])
    args = ["predict", str(hub), *map(str, files), "--keep-aspect", "--set", "image_size=32"]
    assert main([*args, "--features", str(tmp_path / "f.npz")]) == 0
    assert main([*args, "--features", str(tmp_path / "f.safetensors")]) == 0
    out = capsys.readouterr().out
    assert f"{files[0]}: features 64x4x6;" in out and f"{files[1]}: features 64x7x4;" in out  # 32 x 49.8, 57.6 x 32

    saved_npz = np.load(tmp_path / "f.npz")
    assert list(saved_npz["paths"]) == [str(f) for f in files]
    with safe_open(tmp_path / "f.safetensors", "pt") as handle:
        assert json.loads(handle.metadata()["paths"]) == [str(f) for f in files]
        from_safetensors = {key: handle.get_tensor(key) for key in handle.keys()}
    for index, (file, size) in enumerate(zip(files, [(32, 48), (56, 32)])):
        image = prepared_by_hand(file, size, cfg["mean"], cfg["std"])
        with torch.no_grad():
            tokens = theirs.forward_features(image)
            embedding = theirs.forward_head(tokens, pre_logits=True)[0]
            dense = timm_grid(theirs, image)[0]
        key = f"features_{index:04d}"
        torch.testing.assert_close(torch.from_numpy(saved_npz[key]), dense, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.from_numpy(saved_npz["embeddings"][index]), embedding, atol=1e-5, rtol=0)
        assert torch.equal(from_safetensors[key], torch.from_numpy(saved_npz[key]))
    assert torch.equal(from_safetensors["embeddings"], torch.from_numpy(saved_npz["embeddings"]))


def test_headless_models_give_features_and_bad_requests_one_line(tmp_path, capsys):
    hub = saved(timm_peer("vit_small_patch16_dinov3", num_classes=0), tmp_path)
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(tmp_path / "a.png")
    assert main(["predict", str(hub), str(tmp_path / "a.png")]) == 2
    assert "the model has no classification head (num_classes=0): ask for its features instead" in \
        capsys.readouterr().err
    assert main(["predict", str(hub), str(tmp_path / "a.png"), "--features", str(tmp_path / "f.npz")]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path / 'a.png'}: features 64x4x4\n")  # the 32 px the hub names
    assert main(["predict", str(hub), str(tmp_path / "a.png"), "--features", str(tmp_path / "f.pt")]) == 2
    assert f"{tmp_path / 'f.pt'}: dense features are written to a file ending in .npz or .safetensors" in \
        capsys.readouterr().err


def test_feature_colours_are_the_principal_components_scaled_to_unit_range():
    """Features built from three orthogonal directions with uncorrelated, centred scores of decreasing spread
    (so these are the principal components): the colours recover the scores in order, up to sign."""
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(16, 3, generator=generator, dtype=torch.float64))[0]
    centred = torch.randn(24, 3, generator=generator, dtype=torch.float64)
    scores = torch.linalg.qr(centred - centred.mean(0))[0] * torch.tensor([9.0, 3.0, 1.0])
    features = (scores @ basis.T + 5.0).T.reshape(16, 4, 6)
    colours = feature_colours(features.float()).reshape(24, 3).double()
    for component in range(3):
        expected = scores[:, component]
        expected = (expected - expected.min()) / (expected.max() - expected.min())
        assert torch.allclose(colours[:, component], expected, atol=1e-5) or \
            torch.allclose(colours[:, component], 1 - expected, atol=1e-5)
