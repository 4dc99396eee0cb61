"""Masked patch prediction through the one training loop: checkpoints, exact resume, fine-tuning, CLI."""

import json

import pytest
import torch
from test_train_loop import crash_at, state, tiny_recipe

import vitkit
from vitkit.cli import main
from vitkit.train.checkpointing import OBJECTIVE_FILE, list_checkpoints
from vitkit.train import RECIPE_PRESETS
from vitkit.train.mpp import MaskedPatchPrediction
from vitkit.train.run import prepare


def mpp_recipe(run_dir, **changes):
    return tiny_recipe(run_dir, objective={"kind": "mpp"}, augment={"aug_level": "none"}, run={"eval_every": 0},
                       **changes)


def test_mpp_resume_is_bit_exact_and_checkpoints_are_plain_vits(tmp_path):
    straight = prepare(mpp_recipe(tmp_path / "straight")).trainer
    assert isinstance(straight.model, MaskedPatchPrediction)
    straight.fit()
    interrupted = prepare(mpp_recipe(tmp_path / "resumed")).trainer
    crash_at(interrupted, 5)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    checkpoint = list_checkpoints(tmp_path / "resumed")[-1]
    assert (checkpoint / OBJECTIVE_FILE).is_file()
    assert vitkit.load(checkpoint).config.num_classes == 0  # the encoder alone, ready to fine-tune
    resumed = prepare(mpp_recipe(tmp_path / "resumed")).trainer
    resumed.fit(resume=True)
    ours, theirs = state(resumed), state(straight)
    assert ours.keys() == theirs.keys() and any(k.startswith("model.mask_token") for k in ours)
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def test_cli_pretrain_then_finetune(tmp_path, capsys):
    run_dir = tmp_path / "mpp"
    common = ["--image-size", "8", "--model-args", json.dumps({"patch_size": 2, "dim": 16, "depth": 1,
              "num_heads": 2, "mlp_dim": 32, "in_chans": 1}), "--batch-size", "32", "--threads", "1"]
    assert main(["pretrain", "--steps", "6", "--run-dir", str(run_dir), *common]) == 0
    out = capsys.readouterr().out
    assert "train/accuracy" in out and "pre-trained encoder saved" in out
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [6]
    encoder = vitkit.load(run_dir / "model")
    assert encoder.config.num_classes == 0 and encoder.config.pos_embed == "learned"
    assert main(["finetune", str(run_dir / "model"), "--dataset", "digits", "--steps", "4", "--image-size", "16",
                 "--run-dir", str(tmp_path / "ft"), "--batch-size", "32", "--threads", "1"]) == 0
    assert "test accuracy" in capsys.readouterr().out
    tuned = vitkit.load(tmp_path / "ft" / "model")
    assert tuned.config.num_classes == 10 and tuned.config.image_size == (16, 16)


def test_cli_fewshot_reports_every_shot(tmp_path, capsys):
    model = vitkit.create_model(vitkit.ViTConfig(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2,
                                                 mlp_dim=32, in_chans=1, num_classes=10))
    model.save(tmp_path / "m")
    assert main(["fewshot", str(tmp_path / "m"), "--dataset", "digits", "--shots", "1", "5", "--seeds", "2",
                 "--linear-probe", "--out", str(tmp_path / "fs")]) == 0
    out = capsys.readouterr().out
    assert "shots" in out and "all" in out
    report = json.loads((tmp_path / "fs" / "fewshot.json").read_text())
    assert set(report["fewshot"]) == {"1", "5"} and len(report["fewshot"]["5"]["per_seed"]) == 2
    # Even random features of 8x8 digits are far above chance with a linear probe on every image.
    assert report["linear_probe"]["accuracy"] > 0.3


def test_pretrain_starts_from_the_default_preset_not_the_fine_tuning_one():
    from vitkit.cli import build_parser, recipe_from_args

    recipe = recipe_from_args(build_parser().parse_args(["pretrain"]))
    assert recipe.objective.kind == "mpp" and recipe.data.dataset == "digits"
    assert recipe.optim.lr == RECIPE_PRESETS["digits"]["optim"]["lr"]
    assert recipe.model.image_size is None  # sized from the data
