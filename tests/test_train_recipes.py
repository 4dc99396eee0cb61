"""Recipes: presets < config file (YAML/JSON) < command line; the CLI's recipe flags and resume."""

import json

import pytest

import vitkit
from vitkit.cli import build_parser, main, recipe_from_args
from vitkit.errors import ConfigError
from vitkit.train import RECIPE_PRESETS, Recipe, resolve
from vitkit.train.presets import read_config_file
from vitkit.train.recipes import Optim


def test_preset_then_yaml_then_overrides(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("preset: mnist\noptim:\n  lr: 0.01\nmodel:\n  args:\n    depth: 2\naugment:\n"
                    "  crop_scale: [0.3, 1.0]\n")
    recipe = resolve(config_file=path, overrides={"optim": {"lr": 0.02}, "model": {"args": {"dim": 32}}})
    assert recipe.data.dataset == "mnist" and recipe.optim.lr == 0.02 and recipe.augment.crop_scale == (0.3, 1.0)
    assert recipe.model.args == {**RECIPE_PRESETS["mnist"]["model"]["args"], "depth": 2, "dim": 32}
    json_path = tmp_path / "recipe.json"
    json_path.write_text(json.dumps({"schedule": {"steps": 7}}))
    assert resolve("paper-finetune", json_path).schedule.steps == 7


def test_paper_presets_hold_the_papers_hyper_parameters():
    pre, fine = resolve("paper-pretrain"), resolve("paper-finetune")
    assert (pre.optim.optimizer, pre.optim.betas, pre.schedule.batch_size, pre.schedule.warmup_steps,
            pre.optim.clip_norm) == ("adamw", (0.9, 0.999), 4096, 10_000, 1.0)
    assert (fine.optim.optimizer, fine.optim.momentum, fine.optim.weight_decay, fine.schedule.batch_size,
            fine.schedule.decay, fine.model.image_size) == ("sgd", 0.9, 0.0, 512, "cosine", 384)


def test_bad_recipes_are_named():
    with pytest.raises(ValueError, match=r"^overrides: optim.learning_rate: unknown key$"):
        resolve(overrides={"optim": {"learning_rate": 1.0}})
    with pytest.raises(ValueError, match="unknown preset 'imagenet'"):
        resolve("imagenet")


def test_command_line_flags_become_recipe_fields():
    args = build_parser().parse_args(["train", "--preset", "mnist", "--lr", "0.5", "--no-hflip", "--crop-scale",
                                      "0.3", "1", "--model-args", '{"depth": 1}', "--ema-decay", "0.99"])
    recipe = recipe_from_args(args)
    assert (recipe.data.dataset, recipe.optim.lr, recipe.augment.hflip, recipe.augment.crop_scale,
            recipe.optim.ema_decay) == ("mnist", 0.5, False, (0.3, 1.0), 0.99)
    assert recipe.model.args["depth"] == 1
    assert recipe.model.args["dim"] == RECIPE_PRESETS["mnist"]["model"]["args"]["dim"]
    finetune = recipe_from_args(build_parser().parse_args(["finetune", "runs/x/model", "--dataset", "mnist"]))
    assert finetune.model.init == "runs/x/model" and finetune.optim.optimizer == "sgd"


def test_short_and_timm_style_flag_names(capsys):
    recipe = recipe_from_args(build_parser().parse_args(["train", "-b", "64", "-j", "3", "--smoothing", "0.1",
                                                         "--opt", "sgd", "--sched", "linear"]))
    assert (recipe.schedule.batch_size, recipe.data.num_workers, recipe.objective.label_smoothing,
            recipe.optim.optimizer, recipe.schedule.decay) == (64, 3, 0.1, "sgd", "linear")
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out.startswith(f"vitkit {vitkit.__version__} ")


def test_resume_reads_the_runs_recipe(tmp_path, capsys):
    (tmp_path / "recipe.json").write_text(json.dumps(Recipe(optim={"lr": 0.123}, schedule={"steps": 5}).to_dict()))
    args = build_parser().parse_args(["train", "--resume", "--run-dir", str(tmp_path)])
    assert recipe_from_args(args).optim.lr == 0.123
    saved = Recipe(model={"args": {"dim": 32, "depth": 2}}).to_dict()
    (tmp_path / "recipe.json").write_text(json.dumps(saved))
    args = build_parser().parse_args(["train", "--resume", "--run-dir", str(tmp_path), "--model-args", '{"depth": 3}'])
    assert recipe_from_args(args).model.args == {"dim": 32, "depth": 3}
    assert main(["train", "--resume", "--run-dir", str(tmp_path / "nothing")]) == 2
    assert "--resume needs --run-dir" in capsys.readouterr().err


def test_a_run_from_a_checkpoint_keeps_the_checkpoints_architecture():
    assert resolve("fashion-mnist").model.args["dim"] == 96
    tuned = resolve("fashion-mnist", overrides={"model": {"init": "runs/x/model", "args": {"drop_path": 0.1}}})
    assert tuned.model.args == {"drop_path": 0.1} and tuned.model.name == "" and tuned.data.dataset == "fashion-mnist"
    assert resolve("paper-pretrain", overrides={"model": {"init": "runs/x/model"}}).model.name == ""


def test_recipes_are_checked_when_built():
    with pytest.raises(ConfigError, match=r"^Recipe: optim.optimizer: expected one of \['adamw', 'sgd'\], got 'adam'$"):
        Recipe(optim={"optimizer": "adam"})
    with pytest.raises(ValueError, match=r"^Recipe: optim.lr: expected a number >= 0, got 'fast'$"):  # a ValueError
        Recipe(optim=Optim(lr="fast"))
    with pytest.raises(ConfigError, match="^Recipe: schedule.steps: expected an int >= 0, got True$"):
        Recipe(schedule={"steps": True})
    recipe = Recipe.from_dict({"optim": {"lr": 1, "betas": [0.8, 0.9]}, "augment": {"crop_scale": [0.5, 1]}})
    assert (recipe.optim.lr, recipe.optim.betas, recipe.augment.crop_scale) == (1.0, (0.8, 0.9), (0.5, 1.0))
    assert isinstance(recipe.optim.lr, float)
    assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe


def test_layer_decay_from_flag_file_and_resume(tmp_path, capsys):
    """Off (null) unless set; a number in (0, 1] from --layer-decay or a recipe file, kept in recipe.json."""
    assert Recipe().optim.layer_decay is None
    args = build_parser().parse_args(["finetune", "runs/x/model", "--layer-decay", "0.65"])
    assert recipe_from_args(args).optim.layer_decay == 0.65
    (tmp_path / "r.yaml").write_text("optim:\n  layer_decay: 0.75\n")
    assert resolve(config_file=tmp_path / "r.yaml").optim.layer_decay == 0.75
    (tmp_path / "r.yaml").write_text("optim:\n  layer_decay: null\n")
    assert resolve(config_file=tmp_path / "r.yaml").optim.layer_decay is None
    (tmp_path / "recipe.json").write_text(json.dumps(Recipe(optim={"layer_decay": 1}).to_dict()))
    resumed = recipe_from_args(build_parser().parse_args(["train", "--resume", "--run-dir", str(tmp_path)]))
    assert resumed.optim.layer_decay == 1.0 and isinstance(resumed.optim.layer_decay, float)
    for bad in (0.0, 1.5, -0.5):
        with pytest.raises(ConfigError, match=rf"^Recipe: optim.layer_decay: expected a number in \(0, 1\], or null "
                                              rf"\(off\), got {bad}$"):
            Recipe(optim={"layer_decay": bad})
    with pytest.raises(ConfigError, match="^Recipe: optim.layer_decay: expected a number in .*, got 'fast'$"):
        Recipe(optim={"layer_decay": "fast"})
    with pytest.raises(ConfigError, match="^Recipe: optim.layer_decay: expected null with objective.kind='mpp'"):
        Recipe(optim={"layer_decay": 0.75}, objective={"kind": "mpp"})
    with pytest.raises(SystemExit) as stopped:
        main(["finetune", "runs/x/model", "--layer-decay", "2"])
    assert stopped.value.code == 2
    assert "argument --layer-decay: optim.layer_decay: expected a number in (0, 1], or null (off), got '2'" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["finetune", "runs/x/model", "--layer-decay", "steep"])
    assert "argument --layer-decay: optim.layer_decay: expected a number in (0, 1], or null (off), got 'steep'" in \
        capsys.readouterr().err


def test_yaml_exponents_are_numbers(tmp_path):
    """YAML 1.1 reads 1e-3 as the string '1e-3'; a recipe means the number, as JSON does."""
    (tmp_path / "r.yaml").write_text("optim:\n  lr: 1e-3\n  weight_decay: 5E-2\nmodel:\n  name: ViT-B/16\n")
    assert read_config_file(tmp_path / "r.yaml") == {"optim": {"lr": 1e-3, "weight_decay": 5e-2},
                                                     "model": {"name": "ViT-B/16"}}


def test_threads_zero_gives_torch_its_own_count_back_whatever_a_run_before_set(tmp_path):
    """In one process (a notebook, a benchmark running presets in turn) a run's thread count must not leak
    into the next run that asks for torch's default (threads=0)."""
    import torch
    from vitkit.train.run import TORCH_THREADS, prepare
    before = torch.get_num_threads()
    try:
        prepare(resolve("digits").replace(run={"threads": TORCH_THREADS + 1, "dir": str(tmp_path / "a")}))
        assert torch.get_num_threads() == TORCH_THREADS + 1
        prepare(resolve("digits").replace(run={"threads": 0, "dir": str(tmp_path / "b")}))
        assert torch.get_num_threads() == TORCH_THREADS
    finally:
        torch.set_num_threads(before)
