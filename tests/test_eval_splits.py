"""What evaluation measures: a folder the user names is evaluated whole unless it has split folders or a split
is asked for; few-shot on one folder draws its support and query images; shards and parquet files are read by
the split names users give them (``validation`` is ``val``), never one split's files in another."""

import json

import numpy as np
import pytest
from data_helpers import numbered_shards
from PIL import Image

from vitkit import ViTConfig, VisionTransformer
from vitkit.cli import main
from vitkit.data import DatasetError, load_dataset, split_names
from vitkit.data.datasets import default_split
from vitkit.evaluate.fewshot import draw_support

TINY = dict(image_size=8, patch_size=4, dim=8, depth=1, num_heads=1, mlp_dim=8, in_chans=1)


def flat_folder(root, per_class: int, classes: str = "ab"):
    """``root/<class>/NN.png``: ``per_class`` 8x8 grey images of each class, each its own shade."""
    for label, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            Image.new("L", (8, 8), 10 * index + label).save(root / name / f"{index:02d}.png")
    return root


@pytest.fixture
def checkpoint(tmp_path):
    VisionTransformer(ViTConfig(num_classes=2, **TINY)).save(tmp_path / "model")
    return tmp_path / "model"


def test_eval_on_a_flat_folder_counts_every_image_and_says_so(tmp_path, checkpoint, capsys):
    folder = flat_folder(tmp_path / "flat", 10)
    assert main(["eval", str(checkpoint), "--dataset", f"imagefolder:{folder}", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "eval-all.json").read_text())["images"] == 20
    assert f"imagefolder:{folder} names no test or validation split: every one of its 20 images is evaluated" in out
    assert main(["eval", str(checkpoint), "--dataset", f"imagefolder:{folder}", "--split", "test",
                 "--out", str(tmp_path / "o")]) == 0  # the split a training run holds out, as asked
    assert json.loads((tmp_path / "o" / "eval-test.json").read_text())["images"] == 2
    assert "names no test" not in capsys.readouterr().out


def test_a_folder_with_split_folders_is_evaluated_on_its_test_or_val_folder(tmp_path):
    flat_folder(tmp_path / "both" / "train", 3), flat_folder(tmp_path / "both" / "test", 2)
    flat_folder(tmp_path / "imagenet" / "train", 3), flat_folder(tmp_path / "imagenet" / "val", 1)
    assert default_split(f"imagefolder:{tmp_path / 'both'}") == "test"
    assert default_split(f"imagefolder:{tmp_path / 'imagenet'}") == "val"
    assert default_split(f"imagefolder:{tmp_path / 'both' / 'train'}") == "all"
    assert default_split("digits") == "test"
    assert len(load_dataset(f"imagefolder:{tmp_path / 'both'}", "all")) == 10  # train/ and test/ together
    assert len(load_dataset("digits", "all")) == 1797  # scikit-learn's digits, every one


def test_a_corrupt_image_of_a_small_folder_is_named(tmp_path, checkpoint, capsys):
    folder = tmp_path / "flat"
    (folder / "a").mkdir(parents=True)
    Image.new("L", (8, 8)).save(folder / "a" / "good.png")
    (folder / "a" / "bad.png").write_bytes(b"not an image")
    model = VisionTransformer(ViTConfig(num_classes=1, **TINY))
    model.save(tmp_path / "one")
    assert main(["eval", str(tmp_path / "one"), "--dataset", f"imagefolder:{folder}", "--out", str(tmp_path)]) == 1
    assert "bad.png: not a readable image" in capsys.readouterr().err
    assert main(["data", "verify", f"imagefolder:{folder}"]) == 1
    assert "bad.png" in capsys.readouterr().out
    train = ["train", "--model-args", json.dumps({k: v for k, v in TINY.items() if k != "image_size"}), "--image-size", "8", "--steps", "1", "--batch-size", "2",
             "--threads", "1", "--dataset", f"imagefolder:{folder}", "--run-dir"]
    assert main([*train, str(tmp_path / "run"), "--val-fraction", "0"]) == 1  # nothing held out: trained on both
    assert "bad.png: not a readable image" in capsys.readouterr().err
    assert main([*train, str(tmp_path / "run2"), "--val-fraction", "0.1"]) == 1
    assert "flat[train][val]: holding out 0.1 of the 2 image(s)" in capsys.readouterr().err


def test_fewshot_on_a_flat_folder_draws_support_and_query(tmp_path, checkpoint, capsys):
    folder = flat_folder(tmp_path / "flat", 20)
    assert main(["fewshot", str(checkpoint), "--dataset", f"imagefolder:{folder}", "--shots", "2", "--seeds", "2",
                 "--linear-probe", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert ("[all]: support drawn from 12 images of each class (seed 0: 2 shots and 10 to choose "
            "the regulariser), query: the other 16 images") in out
    report = json.loads((tmp_path / "o" / "fewshot.json").read_text())
    assert report["split"] == "all" and set(report["fewshot"]) == {"2"}


def test_support_is_drawn_per_class_and_the_query_is_the_rest():
    labels = np.repeat([0, 1, 2], [15, 20, 14])
    support, query = draw_support(labels, 13, seed=0)
    assert np.bincount(labels[support]).tolist() == [13, 13, 13] and len(query) == 49 - 39
    assert sorted([*support, *query]) == list(range(49))
    again, _ = draw_support(labels, 13, seed=0)
    assert again.tolist() == support.tolist() and draw_support(labels, 13, seed=1)[0].tolist() != support.tolist()
    with pytest.raises(ValueError, match="class 2 has 14 images: 14 support images leave none to query"):
        draw_support(labels, 14, seed=0)


def test_shards_named_validation_are_the_val_split_never_train(tmp_path):
    train = numbered_shards(tmp_path, "train", [3])
    val = numbered_shards(tmp_path, "validation", [2], start=100)
    for spec in (f"{tmp_path}/{{train,validation}}-000000.tar", str(tmp_path)):
        assert len(load_dataset(f"webdataset:{spec}", "train")) == len(train)
        assert len(load_dataset(f"webdataset:{spec}", "val")) == len(val)
        assert split_names(f"webdataset:{spec}") == ("train", "val")
        assert len(load_dataset(f"webdataset:{spec}", "all")) == 5


def test_a_shard_named_for_two_splits_is_refused(tmp_path):
    numbered_shards(tmp_path, "train_val", [2])
    with pytest.raises(DatasetError, match="train_val-000000.tar: names two splits"):
        load_dataset(f"webdataset:{tmp_path}/train_val-000000.tar", "train")
