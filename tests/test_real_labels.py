"""ReaL top-1 (Beyer et al. 2020) against hand computations, its label file's checks, and `vitkit eval
--real-labels`."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit import ViTConfig, create_model
from vitkit.cli import main
from vitkit.errors import DatasetError
from vitkit.evaluate.metrics import read_real_labels, real_accuracy, real_labels_in_order


def test_real_accuracy_by_hand():
    # image 2 has no label set: left out; right: image 0 (0 in {0}) and image 3 (3 in {3, 5}) -> 2 of 4
    predictions = torch.tensor([0, 1, 2, 3, 4])
    assert real_accuracy(predictions, [[0], [0, 2], [], [3, 5], [1]]) == (0.5, 4)
    assert real_accuracy([7], [[]]) == (0.0, 0)


def test_real_labels_follow_the_validation_file_numbers():
    real = [[10], [11], [12], [13]]
    names = ["ILSVRC2012_val_00000003.JPEG", "ILSVRC2012_val_00000001.JPEG", "ILSVRC2012_val_00000004.png"]
    assert real_labels_in_order(real, names) == [[12], [10], [13]]
    assert real_labels_in_order(real, ["a.png", "b.png", "c.png", "d.png"]) == real  # no numbers: file order
    with pytest.raises(DatasetError, match="validation image 9 has no ReaL label set"):
        real_labels_in_order(real, ["ILSVRC2012_val_00000009.JPEG"])


@pytest.mark.parametrize("content, message", [
    ([[1], [0]], "holds 2 label sets for a validation set of 3 images"),
    ({"a": 1}, "holds a JSON dict"),
    ([[1], [0], ["x"]], "entry 2 is"),
    ([[1], [0], [4]], "entry 2 is"),
    ([[1], [0], 3], "entry 2 is"),
])
def test_bad_real_label_files_are_one_line_naming_the_file(tmp_path, content, message):
    path = tmp_path / "real.json"
    path.write_text(json.dumps(content))
    with pytest.raises(DatasetError, match=message) as caught:
        read_real_labels(path, images=3, num_classes=4)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    path.write_text("[[1], [0")
    with pytest.raises(DatasetError, match="not a ReaL label file"):
        read_real_labels(path, images=3, num_classes=4)


def constant_model(tmp_path, predicted: int):
    """A tiny 2-class model whose head always predicts ``predicted`` (zero weights, a bias), saved."""
    model = create_model(ViTConfig(image_size=8, patch_size=4, dim=16, depth=1, num_heads=2, mlp_dim=32,
                                   in_chans=3), num_classes=2)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([0.0, 0.0]).index_fill(0, torch.tensor(predicted), 5.0))
    model.save(tmp_path / "model")
    return tmp_path / "model"


def test_eval_reports_real_top1_beside_top1(tmp_path, capsys):
    checkpoint = constant_model(tmp_path, predicted=1)
    folders = {"0": [3, 4], "1": [1, 2]}  # ILSVRC2012_val_<n>: listed class by class, not in file order
    for label, numbers in folders.items():
        (tmp_path / "val" / label).mkdir(parents=True)
        for number in numbers:
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "val" / label / f"ILSVRC2012_val_{number:08d}.png")
    # by file number: 1 -> {1} right, 2 -> {0} wrong, 3 -> {} left out, 4 -> {0, 1} right: 2 of 3
    (tmp_path / "real.json").write_text(json.dumps([[1], [0], [], [0, 1]]))
    assert main(["eval", str(checkpoint), "--dataset", f"imagefolder:{tmp_path / 'val'}", "--split", "all",
                 "--real-labels", str(tmp_path / "real.json"), "--out", str(tmp_path / "out")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "top-1 50.00%" in line and "ReaL top-1 66.67% (3 images with labels)" in line
    report = json.loads((tmp_path / "out" / "eval-all.json").read_text())
    assert report["real_top1"] == pytest.approx(2 / 3) and report["real_images"] == 3
    (tmp_path / "real.json").write_text(json.dumps([[1], [0], []]))
    assert main(["eval", str(checkpoint), "--dataset", f"imagefolder:{tmp_path / 'val'}", "--split", "all",
                 "--real-labels", str(tmp_path / "real.json")]) != 0
    assert "holds 3 label sets for a validation set of 4 images" in capsys.readouterr().err
