"""`vitkit analyze` end to end: inputs, files written, the HTML page in headless Chromium."""

import json
import shutil
import sys

import numpy as np
import pytest
from browser import CHROMIUM, NO_CHROMIUM, chromium
import torch
from PIL import Image

import vitkit
from vitkit.analysis import attention_maps, attention_rollout, mean_attention_distance
from vitkit.analysis.inputs import dataset_sample, prepare, read_images, sample_photos
from vitkit.analysis.report import analyze
from vitkit.cli import main
from vitkit.data import DatasetError, evaluation_transform
from vitkit.models import Provenance

FIGURES = ["attention_distance.png", "filters.png", "position_similarity.png", "rollout_000.png", "rollout_001.png"]


def checkpoint(path, **overrides):
    base = dict(image_size=32, patch_size=8, dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3)
    model = vitkit.create_model(vitkit.ViTConfig(**{**base, **overrides}))
    return model.save(path)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    torch.manual_seed(0)
    checkpoint(root / "ckpt", image_size=(32, 48))
    assert main(["analyze", str(root / "ckpt"), "--out", str(root / "out"), "--batch-size", "1"]) == 0
    return root


def test_analyze_writes_figures_numbers_and_page(report):
    out = report / "out"
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(FIGURES + ["filter_components.npy", "index.html", "mean_attention_distance.npy",
                                      "position_similarity.npy", "rollout.npy", "summary.json"])
    for name in FIGURES:
        assert Image.open(out / name).format == "PNG"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images"] == 2 and summary["grid"] == [4, 6] and summary["token_stride_px"] == [8, 8]
    assert len(summary["filter_explained_variance"]) == 28

    # The same numbers recomputed from the photos, prepared as the command documents (Google's [-1, 1]).
    model = vitkit.load(report / "ckpt")
    images, _ = prepare(sample_photos(), evaluation_transform((32, 48), 3, [0.5] * 3, [0.5] * 3))
    attn = attention_maps(model, images)
    np.testing.assert_allclose(np.load(out / "rollout.npy"), attention_rollout(attn, (4, 6)).numpy(), atol=1e-6)
    distances = np.load(out / "mean_attention_distance.npy")
    np.testing.assert_allclose(distances, mean_attention_distance(attn, (4, 6), 8).numpy(), rtol=1e-5)
    np.testing.assert_allclose(summary["mean_attention_distance_px"], distances, atol=1e-3)
    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == len(FIGURES) and 'data-figures="5"' in page


class StemThenProject(torch.nn.Module):
    """A hybrid's embedding in miniature: a CNN stem at stride 4, then a 1x1 projection of its features."""

    def __init__(self, dim):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 4, stride=4)
        self.proj = torch.nn.Conv2d(16, dim, 1)

    def forward(self, images):
        features = self.proj(self.stem(images).relu())
        return features.flatten(2).transpose(1, 2), tuple(features.shape[-2:])


def test_analyze_measures_distance_in_pixels_of_the_token_grid_for_hybrids(tmp_path):
    model = vitkit.create_model(vitkit.ViTConfig(image_size=32, patch_size=8, dim=32, depth=2, num_heads=2,
                                                 mlp_dim=64)).eval()
    model.patch_embed = StemThenProject(32)  # 8x8 tokens at stride 4, not the config's 4x4 at stride 8
    pictures = [np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(3)]
    images, shown = prepare(pictures, evaluation_transform((32, 32), 3, [0.5], [0.5]))
    result = analyze(model, images, shown, tmp_path / "out", batch_size=2)
    assert result.summary["grid"] == [8, 8] and result.summary["token_stride_px"] == [4, 4]
    attn = attention_maps(model, images)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "mean_attention_distance.npy"),
                               mean_attention_distance(attn, (8, 8), 4).numpy(), rtol=1e-5)
    assert np.load(tmp_path / "out" / "rollout.npy").shape == (3, 8, 8)
    assert "no pixel patch projection" in result.summary["skipped"]["filter_components"]


def test_prepare_resizes_crops_and_normalises_by_hand():
    grey = np.full((10, 20), 51, dtype=np.uint8)  # 0.2 after /255
    images, shown = prepare([grey], evaluation_transform((8, 8), 3, [0.5], [0.25]))
    assert images.shape == (1, 3, 8, 8) and shown[0].shape == (8, 8, 3)
    torch.testing.assert_close(images, torch.full((1, 3, 8, 8), (0.2 - 0.5) / 0.25))
    stripes = np.zeros((4, 12, 3), dtype=np.uint8)
    stripes[:, 4:8] = 255  # the centre crop keeps the white middle third
    images, _ = prepare([stripes], evaluation_transform((4, 4), 1, [0.0], [1.0]))
    assert torch.equal(images, torch.ones(1, 1, 4, 4))


def test_read_images_from_files_and_directories(tmp_path):
    Image.new("RGB", (5, 3), (10, 20, 30)).save(tmp_path / "a.png")
    Image.new("L", (4, 4), 7).save(tmp_path / "b.bmp")
    (tmp_path / "notes.txt").write_text("not an image")
    images = read_images([tmp_path])
    assert [image.shape for image in images] == [(3, 5, 3), (4, 4)]  # grey stays grey, as in datasets
    assert images[0][0, 0].tolist() == [10, 20, 30] and images[1][0, 0] == 7
    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"broken.png: not a readable image"):
        read_images([tmp_path / "broken.png"])
    with pytest.raises(FileNotFoundError, match="no image file or directory at .*missing.jpg"):
        read_images([tmp_path / "missing.jpg"])


def test_dataset_samples_are_the_files_images(shared_data, tmp_path):
    subset = shared_data / "cifar10-subset" / "cifar10_subset.npz"
    sample, about = dataset_sample(f"npz:{subset}", None, 5, seed=3)
    with np.load(subset) as arrays:
        pixels, labels = arrays["x_test"], arrays["y_test"]
    chosen = np.sort(np.random.default_rng(3).choice(len(pixels), 5, replace=False))
    assert all(np.array_equal(a, pixels[i]) for a, i in zip(sample, chosen))
    cifar = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    assert [(s.name, s.label) for s in about] == [(f"npz:{subset}[test] #{i}", cifar[labels[i]]) for i in chosen]
    assert [a.shape for a in dataset_sample("mnist", shared_data, 3)[0]] == [(28, 28)] * 3
    with pytest.raises(DatasetError, match="cifar10"):
        dataset_sample("cifar10", tmp_path, 3)  # absent, and nothing can be downloaded here


def test_analyze_a_grey_model_on_mnist(tmp_path, shared_data):
    checkpoint(tmp_path / "ckpt", image_size=28, patch_size=7, in_chans=1, pool="gap", class_token=False,
               pos_embed="none")
    args = ["analyze", str(tmp_path / "ckpt"), "--dataset", "mnist", "--data-dir", str(shared_data),
            "--num-images", "12", "--overlays", "1", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["images"] == 12 and summary["rollout"]["readout"] == "mean"
    assert np.load(tmp_path / "out" / "rollout.npy").shape == (12, 4, 4)
    assert np.load(tmp_path / "out" / "filter_components.npy").shape == (28, 1, 7, 7)
    assert "pos_embed='none'" in summary["skipped"]["position_similarity"]
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'data-figures="3"' in page and "position_similarity skipped: the model has no position" in page


def test_analyze_normalises_as_the_checkpoint_was_trained(tmp_path):
    model = vitkit.create_model(vitkit.ViTConfig(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2,
                                                 mlp_dim=32, num_classes=3))
    model.config = model.config.replace(provenance=Provenance(normalization="imagenet"))
    model.save(tmp_path / "ckpt")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "a.png")

    def rollout(*flags):
        out = tmp_path / f"out{len(flags)}{flags[:2]}"
        assert main(["analyze", str(tmp_path / "ckpt"), "--images", str(tmp_path / "a.png"), "--overlays", "0",
                     "--filters", "4", "--out", str(out), *flags]) == 0
        return np.load(out / "rollout.npy")

    trained = rollout()
    np.testing.assert_array_equal(trained, rollout("--mean", "0.485", "0.456", "0.406", "--std", "0.229", "0.224",
                                                   "0.225"))
    assert not np.allclose(trained, rollout("--mean", "0.5", "--std", "0.5"), atol=1e-6)


def test_analyze_reports_bad_input_clearly(tmp_path, capsys):
    checkpoint(tmp_path / "ckpt")
    assert main(["analyze", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o"), "--mean", "0.1", "0.2"]) == 2
    assert "expected 1 or 3 values for the normalisation, got [0.1, 0.2]" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 1
    assert "no checkpoint at" in capsys.readouterr().err


def test_missing_plotting_and_photo_libraries_are_named(tmp_path, monkeypatch, capsys):
    checkpoint(tmp_path / "ckpt")
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # as if scikit-learn were not installed
    assert main(["analyze", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o")]) == 1
    assert "pip install 'vitkit[analysis]' (or scikit-learn), or pass image files" in capsys.readouterr().err
    Image.new("RGB", (32, 32)).save(tmp_path / "x.png")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main(["analyze", str(tmp_path / "ckpt"), "--images", str(tmp_path / "x.png"), "--out",
                 str(tmp_path / "o")]) == 1
    assert "vitkit's figures need matplotlib: pip install 'vitkit[analysis]'" in capsys.readouterr().err






@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_page_renders_every_figure_in_headless_chromium(report, tmp_path):
    page = (report / "out" / "index.html").as_uri()
    dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", page)
    assert '<body data-figures="5" data-shown="5">' in dom  # every figure decoded, with a size
    chromium(tmp_path, "--window-size=1200,1800", f"--screenshot={tmp_path / 'page.png'}", page)
    shot = np.asarray(Image.open(tmp_path / "page.png").convert("RGB"))
    assert shot.shape == (1800, 1200, 3)
    assert len(np.unique(shot.reshape(-1, 3), axis=0)) > 1000  # photos and colour maps, not a blank page

    # The check can fail: a page whose figure is corrupt reports one figure fewer.
    broken = report / "broken"
    shutil.copytree(report / "out", broken)
    html = (broken / "index.html").read_text()
    start = html.index("data:image/png;base64,") + len("data:image/png;base64,")
    (broken / "index.html").write_text(html[:start] + "AAAA" + html[start + 4:])
    assert 'data-shown="4"' in chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom",
                                        (broken / "index.html").as_uri())
