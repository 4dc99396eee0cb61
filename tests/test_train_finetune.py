"""Fine-tuning as section 3.2 / B.1.1: new resolution, 2-D interpolated position embeddings, pre-logits
dropped, a new zero-initialised head, SGD with momentum and no weight decay."""

import json

import torch

import vitkit
from vitkit.models import Provenance
from vitkit.models.position import resample_with_prefix
from vitkit.cli import main
from vitkit.data.survey import Geometry
from vitkit.train import resolve
from vitkit.train.run import build_model, prepare, run


DIGITS = Geometry((8, 8), {1: "digits #0"})  # what the digits' images are: the data a model is sized from


def _pretrained(path):
    model = vitkit.create_model(vitkit.ViTConfig(image_size=8, patch_size=2, dim=16, depth=2, num_heads=2,
                                                 mlp_dim=32, in_chans=1, num_classes=7, representation_size=16))
    model.save(path)
    return model


def test_checkpoint_prepared_for_finetuning(tmp_path):
    source = _pretrained(tmp_path / "pre")
    recipe = resolve("paper-finetune", overrides=dict(model=dict(init=str(tmp_path / "pre"), image_size=16),
                                                      data=dict(dataset="digits")))
    model = build_model(recipe, [str(d) for d in range(10)], DIGITS)
    assert model.config.image_size == (16, 16) and model.config.grid_size == (8, 8)
    expected = resample_with_prefix(source.pos_embed.weight, 1, (4, 4), (8, 8), "bicubic")
    torch.testing.assert_close(model.pos_embed.weight, expected)
    assert isinstance(model.pre_logits, torch.nn.Identity) and model.config.representation_size is None
    assert model.head.out_features == 10 and not model.head.weight.any() and not model.head.bias.any()
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, source.blocks[1].mlp.fc2.weight)

    trainer = prepare(recipe.replace(schedule=dict(steps=1000, batch_size=16),
                                     run=dict(dir=str(tmp_path / "ft")))).trainer
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    assert all(group["weight_decay"] == 0.0 and group["momentum"] == 0.9 for group in trainer.optimizer.param_groups)
    assert trainer.lr_at(500) == recipe.optim.lr and trainer.lr_at(250) == recipe.optim.lr / 2  # 500 warm-up steps


def test_finetuned_model_is_saved_at_the_new_resolution(tmp_path):
    _pretrained(tmp_path / "pre")
    recipe = resolve("paper-finetune", overrides=dict(
        model=dict(init=str(tmp_path / "pre"), image_size=16), data=dict(dataset="digits"),
        schedule=dict(steps=3, batch_size=16, warmup_steps=1), optim=dict(lr=0.01),
        run=dict(dir=str(tmp_path / "ft"), threads=1)))
    summary = run(recipe)
    saved = vitkit.load(tmp_path / "ft" / "model")
    assert saved.config.image_size == (16, 16) and saved.pos_embed.weight.shape == (1, 1 + 64, 16)
    assert saved.config.provenance.classes == tuple(str(d) for d in range(10))
    assert json.loads((tmp_path / "ft" / "summary.json").read_text())["test/accuracy"] == summary["test/accuracy"]


def test_finetune_from_a_preset_made_for_another_architecture(tmp_path):
    _pretrained(tmp_path / "pre")  # dim 16; the digits preset's fresh model has dim 64
    assert main(["finetune", str(tmp_path / "pre"), "--preset", "digits", "--steps", "2", "--batch-size", "16",
                 "--image-size", "16", "--run-dir", str(tmp_path / "ft")]) == 0
    assert vitkit.load(tmp_path / "ft" / "model").config.dim == 16


def test_finetuning_normalises_as_the_checkpoint_was_trained(tmp_path):
    source = _pretrained(tmp_path / "pre")
    source.config = source.config.replace(provenance=Provenance(normalization="imagenet"))  # as torchvision's
    source.save(tmp_path / "pre")
    recipe = resolve("paper-finetune", overrides=dict(model=dict(init=str(tmp_path / "pre"), image_size=16),
                                                      data=dict(dataset="digits")))
    classes = [str(d) for d in range(10)]
    assert build_model(recipe, classes, DIGITS).config.provenance.normalization == "imagenet"
    google = recipe.replace(augment={"normalization": "google"})
    assert build_model(google, classes, DIGITS).config.provenance.normalization == "google"
    assert build_model(resolve("digits"), classes, DIGITS).config.provenance.normalization == "google"  # a fresh model
