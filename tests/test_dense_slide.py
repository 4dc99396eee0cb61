"""Sliding-window evaluation of dense models (``vitkit eval --slide``, ``evaluate_dense(..., slide=...)``): the
windows laid out as mmseg's slide inference lays them, the outputs equal to the windows' average computed here by
hand, the whole-image evaluation where the image already has the model's size, and the report and refusals of the
command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from PIL import Image

from vitkit.cli import main
from vitkit.data import evaluation_loader, load_dataset
from vitkit.data.transforms import KeepRatioResize, dense_transform, kept_ratio_size
from vitkit.errors import ConfigError
from vitkit.evaluate.dense import dense_outputs, evaluate_dense
from vitkit.evaluate.segmentation import miou
from vitkit.evaluate.slide import Slide, slide_for, slide_windows, window_spans
from vitkit.models import ViTConfig, VisionTransformer

CPU = torch.device("cpu")
TINY = dict(patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=4, dense_head="linear")
SIZES = [(40, 56), (30, 30), (60, 10)]  # a landscape, a square, a strip narrower than the 16 px model


def tiny_model(image_size=16, **options) -> VisionTransformer:
    """A 16 px model of 8 px patches with a linear head, its BatchNorm away from the identity."""
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(image_size=image_size, **{**TINY, **options})).eval()
    bn = model.dense_head.decoder.bn
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return model


def mask_folder(root, sizes=SIZES, seed=0):
    """A ``maskfolder:`` of random pictures and random masks of four classes (some pixels ignored), split val."""
    rng = np.random.default_rng(seed)
    (root / "val" / "images").mkdir(parents=True)
    (root / "val" / "masks").mkdir(parents=True)
    (root / "classes.txt").write_text("a\nb\nc\nd\n")
    for number, (height, width) in enumerate(sizes):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        mask = rng.integers(0, 4, (height, width), dtype=np.uint8)
        mask[0, :] = 255
        Image.fromarray(image).save(root / "val" / "images" / f"{number}.png")
        Image.fromarray(mask).save(root / "val" / "masks" / f"{number}.png")
    return root


def test_windows_follow_mmseg_slide_layout():
    assert window_spans(512, 512, 341) == [(0, 512)]
    assert window_spans(683, 512, 341) == [(0, 512), (171, 683)]
    assert window_spans(300, 512, 341) == [(0, 300)]  # smaller than the window: one, padded
    assert window_spans(2048, 512, 341) == [(0, 512), (341, 853), (682, 1194), (1023, 1535), (1364, 1876),
                                            (1536, 2048)]
    assert window_spans(853, 512, 341) == [(0, 512), (341, 853)]  # the second fits exactly: not shifted
    assert window_spans(22, 16, 11) == [(0, 16), (6, 22)]
    slide = Slide((512, 512), (341, 341))
    assert slide_windows(683, 300, slide) == [(0, 512, 0, 300), (171, 683, 0, 300)]
    assert slide_windows(20, 30, Slide((16, 24), (8, 12))) == [(0, 16, 0, 24), (0, 16, 6, 30), (4, 20, 0, 24),
                                                              (4, 20, 6, 30)]  # row by row


def test_the_default_stride_is_two_thirds_of_the_window_and_a_bad_one_is_refused():
    assert slide_for((512, 512)) == Slide((512, 512), (341, 341))
    assert slide_for((518, 1036)).stride == (345, 691)
    assert slide_for((16, 16), 16).stride == (16, 16)
    for bad in (0, 17):
        with pytest.raises(ConfigError, match=r"--slide \d+: expected a stride of 1 to 16 pixels"):
            slide_for((16, 16), bad)


def test_the_resize_keeps_the_ratio_with_the_longer_side_capped():
    assert kept_ratio_size(683, 1024, 512, 2048) == (512, 768)  # shorter side 512
    assert kept_ratio_size(256, 256, 512, 2048) == (512, 512)  # enlarged too
    assert kept_ratio_size(100, 1000, 512, 2048) == (205, 2048)  # the longer side stops at 4x
    assert kept_ratio_size(40, 56, 16, 64) == (16, 22) and kept_ratio_size(60, 10, 16, 64) == (64, 11)
    image = torch.randint(0, 256, (3, 40, 56), dtype=torch.uint8)
    torch.testing.assert_close(KeepRatioResize(16)(image), TF.resize(image, [16, 22], antialias=True))
    preset = dense_transform("segmentation", False, (16, 16), 3, keep_ratio=True)
    mask = torch.zeros(40, 56, dtype=torch.uint8)
    seen, target = preset.per_image(image, mask)
    assert seen.shape == (3, 16, 22) and target is mask


def by_hand(model, image: torch.Tensor, crop: int, stride: int) -> torch.Tensor:
    """mmseg's slide inference written out with plain loops: the (K, H, W) average of the windows' logits over
    ``image`` (C, H, W, normalised)."""
    height, width = image.shape[-2:]
    total = None
    counts = torch.zeros(height, width)
    rows = (max(height - crop + stride - 1, 0)) // stride + 1
    columns = (max(width - crop + stride - 1, 0)) // stride + 1
    for row in range(rows):
        for column in range(columns):
            y2, x2 = min(row * stride + crop, height), min(column * stride + crop, width)
            y1, x1 = max(y2 - crop, 0), max(x2 - crop, 0)
            window = torch.zeros(image.shape[0], crop, crop)
            window[:, :y2 - y1, :x2 - x1] = image[:, y1:y2, x1:x2]
            logits = F.interpolate(model(window[None]), size=(crop, crop), mode="bilinear", align_corners=False)[0]
            if total is None:
                total = torch.zeros(logits.shape[0], height, width)
            for y in range(y1, y2):
                for x in range(x1, x2):
                    total[:, y, x] += logits[:, y - y1, x - x1]
                    counts[y, x] += 1
    return total / counts


def hand_inputs(data, model):
    """Each val image resized by hand to its expected kept-ratio size and normalised, with its mask."""
    expected = {(40, 56): (16, 22), (30, 30): (16, 16), (60, 10): (64, 11)}
    normalise = dense_transform("segmentation", False, (16, 16), 3, model.config.provenance.normalization).per_batch
    pairs = []
    for image, mask in load_dataset(f"maskfolder:{data}", "val"):
        resized = TF.resize(image, list(expected[tuple(image.shape[-2:])]), antialias=True)
        pairs.append((normalise(resized[None])[0], mask.as_subclass(torch.Tensor)))
    return pairs


@torch.no_grad()
def test_slide_equals_the_windows_averaged_by_hand(tmp_path):
    model = tiny_model()
    data = mask_folder(tmp_path / "data")
    pairs = hand_inputs(data, model)
    predictions = []
    for image, mask in pairs:
        expected = F.interpolate(by_hand(model, image, 16, 11)[None], size=mask.shape, mode="bilinear",
                                 align_corners=False)[0]
        (ours,) = dense_outputs(model, image[None], [mask.shape], "segmentation", CPU, torch.float32,
                                slide=slide_for((16, 16)), windows_per_pass=2)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
        predictions.append(expected.argmax(0))
    reference = miou(predictions, [mask for _, mask in pairs], 4)

    dataset = load_dataset(f"maskfolder:{data}", "val")
    loader = evaluation_loader(dataset, dense_transform("segmentation", False, (16, 16), 3,
                                                        model.config.provenance.normalization, keep_ratio=True), 1)
    evaluation = evaluate_dense(model, loader, "segmentation", 4, slide=True)
    assert evaluation.views == {"slide": {"crop": [16, 16], "stride": [11, 11]}} and evaluation.images == 3
    assert evaluation.metrics["mIoU"] == pytest.approx(reference["mIoU"], abs=1e-12)
    assert evaluation.metrics["aAcc"] == pytest.approx(reference["aAcc"], abs=1e-12)


@torch.no_grad()
@pytest.mark.parametrize("task", ["segmentation", "depth"])
def test_slide_runs_in_each_scaled_and_mirrored_view(task):
    """With scales and flip, each view (the image rescaled, mirrored) is slid over, then averaged as class
    probabilities (segmentation) or as depth."""
    model = tiny_model(dense_output="depth" if task == "depth" else "classes")
    image, size = torch.randn(3, 16, 22), torch.Size((30, 41))
    (ours,) = dense_outputs(model, image[None], [size], task, CPU, torch.float32, (1.0, 1.5), True,
                            slide=slide_for((16, 16), 8))
    views = []
    for side in ((16, 22), (24, 33)):
        scaled = image if side == (16, 22) else \
            F.interpolate(image[None], size=side, mode="bilinear", align_corners=False)[0]
        for mirrored in (False, True):
            output = by_hand(model, scaled.flip(-1) if mirrored else scaled, 16, 8)
            output = output.flip(-1) if mirrored else output
            output = F.interpolate(output[None], size=size, mode="bilinear", align_corners=False)[0]
            views.append(output.softmax(0) if task == "segmentation" else output)
    torch.testing.assert_close(ours, torch.stack(views).mean(0), atol=1e-5, rtol=1e-5)


def test_an_image_of_the_models_size_and_aspect_slides_as_it_is_stretched(tmp_path):
    """One window, its output brought to the window's size (the mask's), then left as it is: the whole image's
    output brought to the mask at once. (A mask of another size is reached in two steps by the window, one by
    the whole image: the same up to interpolation.)"""
    model = tiny_model(image_size=(16, 24))
    image, size = torch.randn(1, 3, 16, 24), [torch.Size((16, 24))]
    with torch.no_grad():
        sliding = dense_outputs(model, image, size, "segmentation", CPU, torch.float32, slide=slide_for((16, 24)))
        whole = dense_outputs(model, image, size, "segmentation", CPU, torch.float32)
    torch.testing.assert_close(sliding[0], whole[0])

    model.save(tmp_path / "model")
    data = mask_folder(tmp_path / "data", sizes=[(16, 24), (16, 24)])
    reports = []
    for extra in ([], ["--slide"]):
        assert main(["eval", str(tmp_path / "model"), "--dataset", f"maskfolder:{data}", "--split", "val",
                     "--out", str(tmp_path / f"eval{len(extra)}"), *extra]) == 0
        reports.append(json.loads((tmp_path / f"eval{len(extra)}" / "eval-val.json").read_text()))
    assert reports[1].pop("slide") == {"crop": [16, 24], "stride": [11, 16]}
    assert reports[0] == reports[1]


def test_eval_slide_is_recorded_and_bad_uses_are_refused_in_one_line(tmp_path, capsys):
    tiny_model().save(tmp_path / "model")
    data = mask_folder(tmp_path / "data")
    spec = f"maskfolder:{data}"
    assert main(["eval", str(tmp_path / "model"), "--dataset", spec, "--split", "val", "--slide", "8", "--scales",
                 "1", "1.5", "--flip", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval-val.json").read_text())
    assert report["slide"] == {"crop": [16, 16], "stride": [8, 8]} and report["images"] == 3
    assert report["scales"] == [1.0, 1.5] and report["flip"] is True

    torch.manual_seed(0)
    VisionTransformer(ViTConfig(image_size=16, **{**TINY, "dense_head": "none"})).save(tmp_path / "classifier")
    for argv, says in [(["eval", str(tmp_path / "model"), "--dataset", spec, "--slide", "17"],
                        "--slide 17: expected a stride of 1 to 16 pixels"),
                       (["eval", str(tmp_path / "model"), "--dataset", spec, "--slide", "0"],
                        "--slide 0: expected a stride of 1 to 16 pixels"),
                       (["eval", str(tmp_path / "classifier"), "--dataset", "digits", "--slide"],
                        "is a classifier: --slide")]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        error = capsys.readouterr().err.strip()
        assert says in error and "\n" not in error, error


def test_a_dense_run_validates_by_sliding_windows_and_a_classifier_run_refuses_them(tmp_path, capsys):
    """``finetune --eval-slide 8``: the run's final report records the window, with the numbers ``vitkit eval
    --slide 8`` measures on the saved model; a run without a dense objective, or a stride beyond the model's size,
    is refused in one line."""
    data = mask_folder(tmp_path / "data", sizes=SIZES)
    (data / "val").rename(data / "train")
    mask_folder(tmp_path / "data-val", sizes=[(20, 36), (30, 30)], seed=1)
    (tmp_path / "data-val" / "val").rename(data / "val")
    torch.manual_seed(0)
    VisionTransformer(ViTConfig(image_size=16, **{**TINY, "dense_head": "none"})).save(tmp_path / "backbone")
    base = ["finetune", str(tmp_path / "backbone"), "--dataset", f"maskfolder:{data}", "--steps", "1",
            "--batch-size", "2", "--threads", "1"]
    assert main([*base, "--objective", "segmentation", "--peft", "linear", "--eval-slide", "8",
                 "--run-dir", str(tmp_path / "run")]) == 0
    trained = json.loads((tmp_path / "run" / "eval-val.json").read_text())
    assert trained["slide"] == {"crop": [16, 16], "stride": [8, 8]} and trained["images"] == 2
    assert main(["eval", str(tmp_path / "run" / "model"), "--dataset", f"maskfolder:{data}", "--split", "val",
                 "--slide", "8", "--out", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "eval-val.json").read_text()) == trained

    classifier = [*base[:2], "--dataset", "digits", "--channels", "rgb", *base[4:]]
    for argv, says in [([*classifier, "--eval-slide", "8"],
                        "--eval-slide 8: sliding-window evaluation is for --objective"),
                       ([*base, "--objective", "segmentation", "--eval-slide", "17"],
                        "--eval-slide 17: expected a stride of 1 to 16 pixels")]:
        capsys.readouterr()
        assert main([*argv, "--run-dir", str(tmp_path / "refused")]) == 2
        error = capsys.readouterr().err.strip().splitlines()  # the run's plan logged first, then the refusal
        assert says in error[-1] and "error:" not in "".join(error[:-1]), error


@torch.no_grad()
def test_predict_slide_writes_the_classes_of_the_windows_averaged_by_hand(tmp_path, capsys):
    """``vitkit predict --slide 11 --out``: each image's mask is the argmax of the windows' average computed by
    hand over the image resized at its aspect ratio, brought to the image's size; a classifier refuses --slide."""
    model = tiny_model()
    model.save(tmp_path / "model")
    data = mask_folder(tmp_path / "data")
    images = sorted((data / "val" / "images").iterdir(), key=lambda path: int(path.stem))
    assert main(["predict", str(tmp_path / "model"), *map(str, images), "--slide", "11", "--out",
                 str(tmp_path / "pred"), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    for record, (image, mask) in zip(records, hand_inputs(data, model)):
        average = by_hand(model, image, 16, 11)
        expected = F.interpolate(average[None], size=mask.shape, mode="bilinear", align_corners=False)[0].argmax(0)
        written = np.array(Image.open(record["mask"]))
        assert np.array_equal(written, expected.numpy())

    torch.manual_seed(0)
    VisionTransformer(ViTConfig(image_size=16, **{**TINY, "dense_head": "none"})).save(tmp_path / "classifier")
    for argv, says in [([str(tmp_path / "classifier"), str(images[0]), "--slide"], "is a classifier: --slide"),
                       ([str(tmp_path / "model"), str(images[0]), "--slide", "17", "--out", str(tmp_path / "x")],
                        "--slide 17: expected a stride of 1 to 16 pixels")]:
        capsys.readouterr()
        assert main(["predict", *argv]) == 2, argv
        error = capsys.readouterr().err.strip()
        assert says in error and "\n" not in error, error
