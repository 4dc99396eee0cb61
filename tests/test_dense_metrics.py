"""Segmentation and depth metrics: cases worked by hand, mmsegmentation's mIoU written out literally (a loop over
images and classes in NumPy) on random maps with ignored pixels, absent classes and predictions out of range, the
per-image Eigen metrics of BTS written out per image, and the inputs refused."""

import json
import math

import numpy as np
import pytest
import torch

from vitkit.evaluate.depth import METRICS, DepthMeter, depth_metrics
from vitkit.evaluate.segmentation import SegmentationMeter, json_ready, miou

IGNORE = 255


def mmseg_reference(preds, targets, num_classes, ignore_index=IGNORE):
    """mmseg's ``intersect_and_union`` per image (a histogram over the classes, so a predicted id outside them
    is in no class's prediction area), summed over the set, then ``total_area_to_metrics``."""
    intersect, union, area_pred, area_label = (np.zeros(num_classes) for _ in range(4))
    for pred, target in zip(preds, targets):
        kept = target != ignore_index
        pred, target = np.asarray(pred)[kept], np.asarray(target)[kept]
        for c in range(num_classes):
            i = np.sum((pred == c) & (target == c))
            p = np.sum(pred == c)
            t = np.sum(target == c)
            intersect[c] += i
            area_pred[c] += p
            area_label[c] += t
            union[c] += p + t - i
    iou = [intersect[c] / union[c] if union[c] else math.nan for c in range(num_classes)]
    acc = [intersect[c] / area_label[c] if area_label[c] else math.nan for c in range(num_classes)]
    present = [value for value in iou if not math.isnan(value)]
    return {"mIoU": sum(present) / len(present) if present else math.nan,
            "aAcc": intersect.sum() / area_label.sum(), "IoU": iou, "Acc": acc}


def assert_same_metrics(got, expected):
    assert set(got) == set(expected)
    for key in expected:
        np.testing.assert_allclose(np.asarray(got[key], dtype=float), np.asarray(expected[key], dtype=float),
                                   rtol=1e-12, atol=0, equal_nan=True, err_msg=key)


def random_maps(rng, shape, num_classes, ignore_fraction=0.1, outside_fraction=0.05):
    """A target with some ignored pixels, and a prediction right on about half the pixels, with some ids out of
    range (negative or too large)."""
    target = rng.integers(0, num_classes, shape)
    target[rng.random(shape) < ignore_fraction] = IGNORE
    pred = np.where(rng.random(shape) < 0.5, target, rng.integers(0, num_classes, shape))
    pred[pred == IGNORE] = 0
    outside = rng.random(shape) < outside_fraction
    pred[outside] = rng.choice([-1, num_classes, num_classes + 3], int(outside.sum()))
    return pred, target


def test_a_case_worked_by_hand():
    """Three classes; the bottom-right pixel is ignored (its prediction 0 counts nowhere) and the prediction 5 is
    outside the classes. The (target, prediction) pairs kept: (0,0) (0,1) (1,1) (1,5) (2,1).
    Class 0: intersection 1, prediction area 1, label area 2, union 2: IoU 1/2, Acc 1/2.
    Class 1: intersection 1, prediction area 3, label area 2 (the pixel predicted 5 among them), union 4: IoU 1/4,
    Acc 1/2. Class 2: intersection 0, label area 1, union 1: IoU 0, Acc 0.
    mIoU (1/2 + 1/4 + 0) / 3 = 1/4; aAcc 2 right of 5 = 0.4. A fourth class, in neither map, has IoU and Acc NaN
    (null in JSON) and leaves the mean alone."""
    target = np.array([[0, 0, 1], [1, 2, IGNORE]])
    pred = np.array([[0, 1, 1], [5, 1, 0]])
    expected = {"mIoU": 0.25, "aAcc": 0.4, "IoU": [0.5, 0.25, 0.0], "Acc": [0.5, 0.5, 0.0]}
    assert miou(pred, target, 3) == expected
    assert miou(torch.as_tensor(pred), torch.as_tensor(target, dtype=torch.uint8), 3) == expected
    four = miou(pred, target, 4)
    assert four["mIoU"] == 0.25 and four["aAcc"] == 0.4 and math.isnan(four["IoU"][3]) and math.isnan(four["Acc"][3])
    ready = json_ready(four)
    assert ready == {"mIoU": 0.25, "aAcc": 0.4, "IoU": [0.5, 0.25, 0.0, None], "Acc": [0.5, 0.5, 0.0, None]}
    assert json.loads(json.dumps(ready, allow_nan=False))["IoU"][3] is None
    assert four["IoU"][3] != four["IoU"][3]  # json_ready copied: the metrics keep their NaN


def test_nothing_to_score():
    """All pixels ignored: every class absent, so every metric NaN."""
    result = miou(np.full((2, 2), IGNORE), np.full((2, 2), IGNORE), 2)
    assert all(math.isnan(value) for value in [result["mIoU"], result["aAcc"], *result["IoU"], *result["Acc"]])
    assert json_ready(result) == {"mIoU": None, "aAcc": None, "IoU": [None, None], "Acc": [None, None]}


@pytest.mark.parametrize("seed", range(4))
def test_equals_mmsegs_definition_on_random_maps(seed):
    rng = np.random.default_rng(seed)
    num_classes = 7
    pred, target = random_maps(rng, (3, 17, 13), num_classes)
    target[target == 4] = IGNORE  # class 4 absent from the targets, still predicted: IoU 0, Acc NaN
    pred[pred == 6] = 0
    target[target == 6] = IGNORE  # class 6 absent from both: IoU NaN
    expected = mmseg_reference([pred], [target], num_classes)
    assert expected["IoU"][4] == 0 and math.isnan(expected["Acc"][4]) and math.isnan(expected["IoU"][6])
    assert_same_metrics(miou(pred, target, num_classes), expected)
    assert_same_metrics(miou(torch.as_tensor(pred), torch.as_tensor(target), num_classes), expected)


def test_a_set_of_differently_sized_maps_sums_its_areas():
    """Areas are summed over the set, so the result is the reference's over the set, not the mean of per-image
    scores; numpy and torch members mix, and the meter takes them one at a time or as a batch."""
    rng = np.random.default_rng(10)
    num_classes = 5
    maps = [random_maps(rng, shape, num_classes) for shape in [(9, 11), (4, 30), (1, 1), (16, 5)]]
    preds, targets = [pred for pred, _ in maps], [target for _, target in maps]
    expected = mmseg_reference(preds, targets, num_classes)
    mixed = [torch.as_tensor(pred) if i % 2 else pred for i, pred in enumerate(preds)]
    assert_same_metrics(miou(mixed, tuple(targets), num_classes), expected)
    per_image = np.mean([miou(pred, target, num_classes)["mIoU"] for pred, target in maps])
    assert abs(per_image - expected["mIoU"]) > 1e-3

    meter = SegmentationMeter(num_classes)
    for pred, target in maps[:2]:
        meter.update(torch.as_tensor(pred), torch.as_tensor(target))
    meter.update(np.stack([maps[3][0]] * 2), np.stack([maps[3][1]] * 2))  # a batch (B, H, W)
    expected = mmseg_reference(preds[:2] + [preds[3]] * 2, targets[:2] + [targets[3]] * 2, num_classes)
    assert_same_metrics(meter.compute(), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_counts_on_the_device_of_the_maps():
    rng = np.random.default_rng(3)
    pred, target = random_maps(rng, (2, 40, 30), 6)
    meter = SegmentationMeter(6)
    meter.update(torch.as_tensor(pred).cuda(), torch.as_tensor(target).cuda())
    assert meter.counts.device.type == "cpu"
    assert_same_metrics(meter.compute(), mmseg_reference([pred], [target], 6))


def test_bad_inputs_are_refused_naming_what_was_expected():
    good = np.zeros((2, 3), dtype=np.int64)
    with pytest.raises(ValueError, match=r"same shape.*\(2, 3\).*\(3, 2\)"):
        miou(good, np.zeros((3, 2), dtype=np.int64), 3)
    with pytest.raises(ValueError, match=r"class id\(s\) -1, 3, 9: expected ids in \[0, 3\) or the ignore_index 255"):
        miou(good, np.array([[0, 3, 9], [-1, 255, 3]]), 3)
    with pytest.raises(ValueError, match=r"class id\(s\) 255: expected ids in \[0, 3\) or the ignore_index -1"):
        miou(good, torch.tensor([[0, 1, 2], [0, 1, 255]], dtype=torch.uint8), 3, ignore_index=-1)  # 255 is not -1
    with pytest.raises(ValueError, match="integer class ids, got torch.float32"):
        miou(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="as many target as pred maps, got 2 pred and 1 target"):
        miou([good, good], [good], 3)
    with pytest.raises(ValueError, match="both arrays or both lists"):
        miou([good], good, 3)
    with pytest.raises(ValueError, match="num_classes must be at least 1"):
        SegmentationMeter(0)


LOG2 = math.log(2)


def test_depth_of_two_pixels_worked_by_hand():
    """gt (2, 4), pred (1, 4): the ratios max(gt/pred, pred/gt) are 2 and 1, so one pixel of two is within 1.25,
    1.25² = 1.5625 and 1.25³ = 1.953; abs_rel (1/2 + 0) / 2; sq_rel (1/2 + 0) / 2; rmse sqrt(1/2);
    d = log pred - log gt = (-ln 2, 0): rmse_log sqrt(ln²2 / 2), log10 log10(2) / 2,
    silog sqrt(ln²2 / 2 - ln²2 / 4) * 100 = 50 ln 2."""
    expected = {"a1": 0.5, "a2": 0.5, "a3": 0.5, "abs_rel": 0.25, "sq_rel": 0.25, "rmse": math.sqrt(0.5),
                "rmse_log": LOG2 / math.sqrt(2), "log10": math.log10(2) / 2, "silog": 50 * LOG2,
                "images": 1, "images_without_depth": 0}
    assert depth_metrics(np.array([[1.0, 4.0]]), np.array([[2.0, 4.0]])) == pytest.approx(expected, rel=1e-12)
    # A batch of two one-row images, min_depth 0.5 and max_depth 10. Out of the count: true depth 0 (none), 12
    # (above max_depth), and the whole second image (outside the valid mask). The predictions 50 and 0 are clamped
    # to 10 and 0.5, so three pixels score: gt 2 / pred 1, gt 4 / pred 10, gt 1 / pred 0.5 (ratios 2, 2.5, 2).
    pred = torch.tensor([[[1.0, 7.0, 3.0, 50.0, 0.0]], [[7.0, 7.0, 7.0, 7.0, 7.0]]])
    target = torch.tensor([[[2.0, 0.0, 12.0, 4.0, 1.0]], [[1.0, 1.0, 1.0, 1.0, 1.0]]])
    valid = torch.tensor([[[True] * 5], [[False] * 5]])
    clamped = depth_metrics(pred, target, min_depth=0.5, max_depth=10.0, valid=valid)
    assert clamped["images"] == 1 and clamped["images_without_depth"] == 1
    assert clamped["abs_rel"] == pytest.approx((1 / 2 + 6 / 4 + 0.5 / 1) / 3, rel=1e-12)
    assert clamped["rmse"] == pytest.approx(math.sqrt((1 + 36 + 0.25) / 3), rel=1e-12)
    assert clamped["a3"] == 0.0


def test_depth_averages_images_not_pixels():
    """The hand case beside an image of four exact pixels: a1 is (1/2 + 1) / 2, not 5 / 6."""
    result = depth_metrics([np.array([[1.0, 4.0]]), np.ones((2, 2))], [np.array([[2.0, 4.0]]), np.ones((2, 2))])
    assert result["a1"] == 0.75 and result["abs_rel"] == 0.125 and result["silog"] == pytest.approx(25 * LOG2)
    assert result["images"] == 2


def bts_reference(preds, targets, min_depth, max_depth, valids):
    """BTS's evaluation, image by image: predictions clamped, true depths kept within (min_depth, max_depth) and
    the mask, ``compute_errors`` on the pixels left, the errors averaged over the images that have any."""
    scores = []
    for pred, gt, valid in zip(preds, targets, valids):
        pred = np.clip(pred.astype(np.float64), min_depth, max_depth)
        gt = gt.astype(np.float64)
        mask = (gt > min_depth) & (gt < max_depth) & valid
        if not mask.any():
            continue
        gt, pred = gt[mask], pred[mask]
        thresh = np.maximum(gt / pred, pred / gt)
        err = np.log(pred) - np.log(gt)
        scores.append({
            "a1": (thresh < 1.25).mean(), "a2": (thresh < 1.25 ** 2).mean(), "a3": (thresh < 1.25 ** 3).mean(),
            "abs_rel": np.mean(np.abs(gt - pred) / gt), "sq_rel": np.mean((gt - pred) ** 2 / gt),
            "rmse": np.sqrt(np.mean((gt - pred) ** 2)), "rmse_log": np.sqrt(np.mean(err ** 2)),
            "log10": np.mean(np.abs(np.log10(gt) - np.log10(pred))),
            "silog": np.sqrt(np.mean(err ** 2) - np.mean(err) ** 2) * 100})
    return {name: np.mean([score[name] for score in scores]) for name in METRICS}, len(scores)


def test_depth_equals_bts_image_by_image():
    rng = np.random.default_rng(0)
    min_depth, max_depth = 1e-3, 80.0
    targets = rng.uniform(0.5, 90.0, (5, 12, 16)).astype(np.float32)
    targets[rng.random(targets.shape) < 0.3] = 0  # no depth measured (LiDAR holes)
    targets[2] = 0  # an image without depth
    preds = (targets * rng.uniform(0.6, 1.6, targets.shape) + rng.uniform(-1, 1, targets.shape)).astype(np.float32)
    preds[0, 0, :4] = [0.0, -3.0, 200.0, 1e-6]  # clamped to min_depth or max_depth
    valids = np.zeros(targets.shape, dtype=bool)
    valids[:, 2:10, 1:15] = True  # a crop
    expected, images = bts_reference(preds, targets, min_depth, max_depth, valids)

    result = depth_metrics(preds, targets, min_depth, max_depth, valids)
    assert result["images"] == images == 4 and result["images_without_depth"] == 1
    for name in METRICS:
        assert result[name] == pytest.approx(expected[name], rel=1e-9), name

    meter = DepthMeter(min_depth, max_depth)  # images added one at a time, as tensors, and a batch of two
    meter.update(torch.as_tensor(preds[0]), torch.as_tensor(targets[0]), torch.as_tensor(valids[0]))
    meter.update(preds[1], targets[1], valids[1])
    meter.update(torch.as_tensor(preds[2:4]), torch.as_tensor(targets[2:4]), torch.as_tensor(valids[2:4]))
    meter.update(preds[4], targets[4], valids[4])
    assert meter.compute() == pytest.approx(result, rel=1e-12)

    listed = depth_metrics(list(preds), list(targets), min_depth, max_depth, list(valids))
    assert listed == pytest.approx(result, rel=1e-12)


def test_depth_without_any_valid_pixel_is_nan():
    result = depth_metrics(np.ones((2, 3, 3)), np.zeros((2, 3, 3)))
    assert result["images"] == 0 and result["images_without_depth"] == 2
    assert all(math.isnan(result[name]) for name in METRICS)
    assert json_ready(result)["rmse"] is None


def test_depth_bad_inputs_are_refused():
    with pytest.raises(ValueError, match=r"same shape.*\(2, 4, 4\).*\(2, 4, 5\)"):
        depth_metrics(np.ones((2, 4, 4)), np.ones((2, 4, 5)))
    with pytest.raises(ValueError, match=r"pred and valid of the same shape.*\(4, 4\).*\(4, 3\)"):
        depth_metrics(np.ones((4, 4)), np.ones((4, 4)), valid=np.ones((4, 3), dtype=bool))
    with pytest.raises(ValueError, match=r"\(batch, height, width\) or \(height, width\), got \(1, 1, 4, 4\)"):
        depth_metrics(np.ones((1, 1, 4, 4)), np.ones((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="max_depth must exceed min_depth"):
        DepthMeter(min_depth=1.0, max_depth=0.5)
