"""Defaults sized from the data and the checkpoint: `train` and `finetune` without model flags, `--channels`,
a head kept when the classes are the same, conversions said, and one line with what to pass for input that does
not fit; `eval` without `--dataset`, `convert` by extension, warm-up within the run, presets in `--help`."""

import json
import logging
import re

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import build_parser, main
from vitkit.data.transforms import input_conversion
from vitkit.models import Provenance
from vitkit.models.vit import LUMINANCE
from vitkit.train import RECIPE_PRESETS, Recipe
from vitkit.train.run import fitted_warmup
from vitkit.train.sizing import patch_for

CLASSES = ("ant", "bee", "cat")
SMALL = {"dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}  # width and depth only: no geometry
QUICK = ["--steps", "1", "--batch-size", "8", "--log-every", "1", "--threads", "1"]


def rgb_npz(path, height=24, width=40):
    """A 3-class RGB dataset of ``height`` x ``width`` images, as an .npz file."""
    rng = np.random.default_rng(0)
    arrays = {f"x_{split}": rng.integers(0, 256, (n, height, width, 3), dtype=np.uint8)
              for split, n in (("train", 48), ("test", 6))}
    arrays.update(y_train=np.arange(48) % 3, y_test=np.arange(6) % 3, classes=np.array(CLASSES))
    np.savez(path, **arrays)
    return f"npz:{path}"


def checkpoint(path, classes=CLASSES, **config):
    model = vitkit.create_model(vitkit.ViTConfig(**{"image_size": 8, "patch_size": 4, "num_classes": len(classes),
                                                    **SMALL, **config}))
    torch.nn.init.normal_(model.head.weight)
    model.config = model.config.replace(provenance=Provenance(classes=tuple(classes)))
    model.save(path)
    return model


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("size, patch", [((8, 8), 2), ((28, 28), 2), ((32, 32), 4), ((64, 96), 8), ((224, 224), 16),
                                         ((512, 512), 16), ((24, 200), 2)])
def test_the_patch_is_the_largest_that_leaves_an_8x8_grid(size, patch):
    assert patch_for(size) == patch


def test_train_without_model_flags_is_sized_from_the_data(tmp_path, capsys):
    data = rgb_npz(tmp_path / "d.npz")
    assert main(["train", "--dataset", data, "--model-args", json.dumps(SMALL), "--run-dir", str(tmp_path / "run"),
                 *QUICK]) == 0
    config = vitkit.load(tmp_path / "run" / "model").config
    assert (config.in_chans, config.image_size, config.patch_size, config.num_classes) == (3, (24, 40), 2, 3)
    err = capsys.readouterr().err
    assert f"model sized from {data}: 3x24x40 px, patch 2 (12x20 grid), 3 classes, D=16, 1 layers" in err, err
    assert "channel images" not in err and "scaled" not in err  # nothing converted
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["model"]["image_size"] == [24, 40]


def test_finetune_takes_the_checkpoints_patch_at_the_datas_size_and_keeps_a_head_of_the_same_classes(tmp_path, capsys):
    data = rgb_npz(tmp_path / "d.npz")
    source = checkpoint(tmp_path / "same")
    assert main(["finetune", str(tmp_path / "same"), "--dataset", data, "--run-dir", str(tmp_path / "a"), *QUICK,
                 "--lr", "0"]) == 0
    tuned = vitkit.load(tmp_path / "a" / "model")
    assert (tuned.config.image_size, tuned.config.patch_size, tuned.config.in_chans) == ((24, 40), 4, 3)
    torch.testing.assert_close(tuned.head.weight, source.head.weight)  # lr 0: the head as it was
    assert "at 24x40 px, patch 4 (6x10 grid) (the data's size; --preset paper-finetune for the paper's 384 px), " \
           "3-channel input, its head kept (the same classes)" in capsys.readouterr().err
    checkpoint(tmp_path / "other", classes=("x", "y", "z"))
    assert main(["finetune", str(tmp_path / "other"), "--dataset", data, "--run-dir", str(tmp_path / "b"), *QUICK,
                 "--lr", "0"]) == 0
    assert not vitkit.load(tmp_path / "b" / "model").head.weight.any()  # other names: a new zero head
    assert "a new 3-class head" in capsys.readouterr().err


def test_finetune_converts_channels_only_when_told_and_says_so(tmp_path, capsys):
    data = rgb_npz(tmp_path / "d.npz")
    grey = checkpoint(tmp_path / "grey", in_chans=1)
    assert main(["finetune", str(tmp_path / "grey"), "--dataset", data, "--run-dir", str(tmp_path / "a"), *QUICK]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"vitkit finetune: error: {tmp_path / 'grey'} takes 1-channel images and the images of {data} have 3 "
        f"channels; pass --channels rgb (the model's patch kernel mapped to 3) or --channels grey (the images "
        f"converted to 1)")
    assert main(["finetune", str(tmp_path / "grey"), "--dataset", data, "--run-dir", str(tmp_path / "g"), *QUICK,
                 "--channels", "grey"]) == 0
    assert vitkit.load(tmp_path / "g" / "model").config.in_chans == 1
    assert f"{data}: 3-channel images turned grey (luminance) for a 1-channel model" in capsys.readouterr().err
    assert main(["finetune", str(tmp_path / "grey"), "--dataset", data, "--run-dir", str(tmp_path / "c"), *QUICK,
                 "--channels", "rgb", "--lr", "0"]) == 0
    colour = vitkit.load(tmp_path / "c" / "model")
    expected = grey.patch_embed.proj.weight * torch.tensor(LUMINANCE).view(1, 3, 1, 1)
    torch.testing.assert_close(colour.patch_embed.proj.weight, expected)
    assert "channel images" not in capsys.readouterr().err


def test_mapped_channels_see_what_the_model_saw():
    """Hand-made reference: a grey model on grey(x) is the mapped colour model on x; a colour model on a grey
    image repeated is the mapped grey model on the grey image."""
    torch.manual_seed(0)
    grey = vitkit.create_model(vitkit.ViTConfig(image_size=8, patch_size=4, in_chans=1, num_classes=3, **SMALL)).eval()
    colour = vitkit.create_model(vitkit.ViTConfig(image_size=8, patch_size=4, in_chans=1, num_classes=3, **SMALL))
    colour.load_state_dict(grey.state_dict())
    colour.map_channels(3)
    image = torch.rand(2, 3, 8, 8)
    luminance = (image * torch.tensor(LUMINANCE).view(1, 3, 1, 1)).sum(1, keepdim=True)
    torch.testing.assert_close(colour.eval()(image), grey(luminance))
    back = vitkit.create_model(colour.config)
    back.load_state_dict(colour.state_dict())
    back.map_channels(1)
    torch.testing.assert_close(back.eval()(luminance), colour(luminance.expand(-1, 3, -1, -1)))


def test_bad_input_is_one_line_saying_what_to_pass(tmp_path, capsys):
    folder = tmp_path / "mixed"
    for name, mode in (("a", "L"), ("b", "RGB")):
        (folder / name).mkdir(parents=True)
        for index in range(20):
            Image.new(mode, (16, 16)).save(folder / name / f"{index}.png")
    assert main(["train", "--dataset", f"imagefolder:{folder}", "--run-dir", str(tmp_path / "r"), *QUICK]) == 1
    error = one_line(capsys.readouterr().err)
    assert re.search(r"images differ in channels \(.*\.png has 1, .*\.png has 3\); pass --channels rgb \(grey images "
                     r"repeated\) or --channels grey \(colour images turned grey\)$", error), error

    data = rgb_npz(tmp_path / "d.npz", 30, 30)
    checkpoint(tmp_path / "ckpt")
    assert main(["finetune", str(tmp_path / "ckpt"), "--dataset", data, "--run-dir", str(tmp_path / "f"), *QUICK]) == 2
    assert one_line(capsys.readouterr().err).endswith(
        f"{tmp_path / 'ckpt'} has 4 px patches, which do not divide {data}'s 30x30 images; pass --image-size 32x32 "
        f"(or --preset paper-finetune for the paper's 384 px)")
    assert main(["finetune", str(tmp_path / "ckpt"), "--dataset", data, "--run-dir", str(tmp_path / "f"), *QUICK,
                 "--image-size", "2"]) == 2
    assert one_line(capsys.readouterr().err).endswith(
        "--image-size 2x2 is smaller than the patch (4 px); pass --image-size 4 or more, or a smaller --set patch_size")


def test_a_warm_up_as_long_as_the_run_is_scaled_down_and_said(caplog):
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert fitted_warmup(100, 300) == 100 and not caplog.records
        assert fitted_warmup(500, 300) == 30
    assert caplog.messages == ["warm-up of 500 steps in a run of 300: a tenth of the run (30) instead, so that the "
                               "learning rate peaks; set --warmup-steps to choose"]


@pytest.mark.parametrize("have, to, expected", [
    ((3, (32, 32)), (1, (8, 8)), "3-channel images turned grey (luminance) for a 1-channel model; 32x32 images "
                                 "downscaled 4x to 8x8"),
    ((1, (28, 28)), (3, (384, 384)), "1-channel images repeated for a 3-channel model; 28x28 images upscaled 13.7x "
                                     "to 384x384"),
    ((3, (32, 32)), (3, (64, 64)), ""),  # 2x: not beyond it
])
def test_input_conversions_are_put_in_words(have, to, expected):
    assert input_conversion(have[0], have[1], to[0], to[1]) == expected


def test_eval_and_fewshot_without_a_dataset_use_the_runs_and_write_into_the_run(tmp_path, monkeypatch, capsys):
    data = rgb_npz(tmp_path / "d.npz", 8, 8)
    run = tmp_path / "run"
    checkpoint(run / "model", in_chans=3)
    (run / "recipe.json").write_text(json.dumps(Recipe(data={"dataset": data, "val_fraction": 0.5}).to_dict()))
    checkpoint(tmp_path / "lone" / "model", in_chans=3)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["eval", str(run / "model")]) == 0
    captured = capsys.readouterr()
    assert f"dataset {data}, as recorded by the run in {run}" in captured.err
    assert f"(6 images); report and confusion matrix in {run}" in captured.out
    assert (run / "eval-test.json").is_file() and (run / "confusion-test.png").is_file()
    assert main(["fewshot", str(run / "model"), "--shots", "1", "--seeds", "1"]) == 0
    assert f"numbers in {run / 'fewshot.json'}" in capsys.readouterr().out
    assert main(["eval", str(tmp_path / "lone" / "model")]) == 2
    assert one_line(capsys.readouterr().err).endswith("no run beside it records the dataset it was trained on; pass "
                                                      "--dataset (digits, mnist, cifar10, npz:PATH, imagefolder:PATH, "
                                                      "...)")
    assert main(["eval", str(tmp_path / "lone" / "model"), "--dataset", data]) == 0
    assert "pass --out DIR to keep the report and confusion matrix" in capsys.readouterr().out
    assert not list(here.iterdir())  # nothing in the current folder


def test_convert_writes_the_format_of_the_extension(tmp_path, capsys):
    checkpoint(tmp_path / "ckpt", in_chans=3)
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "x.onnx")]) == 0
    assert onnx.load(str(tmp_path / "x.onnx")).graph.input
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "folder")]) == 0
    assert vitkit.load(tmp_path / "folder").config.dim == SMALL["dim"]
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "y.onnx"), "--to", "hf"]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"vitkit convert: error: --to hf and {tmp_path / 'y.onnx'}: a .onnx file holds onnx; pass --to onnx, or a "
        f"folder for hf")
    assert not (tmp_path / "y.onnx").exists()


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_help_shows_every_presets_values(command):
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    text = " ".join(parser.format_help().split())
    for name, values in RECIPE_PRESETS.items():
        shown = re.search(rf" {name}: (.*?)(?= [a-z-]+: |$)", text)
        assert shown, name
        leaves = [(key, value) for fields in values.values() for key, value in fields.items()
                  if not isinstance(value, dict)]  # a preset's fields, by section
        assert leaves, name
        for key, value in leaves:
            assert f"{key}={value}".replace(" ", "") in shown.group(1).replace(" ", ""), (name, key)
