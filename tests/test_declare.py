"""One way to declare a config: Recipe and ViTConfig fields declared once (vitkit.declare), read from YAML/JSON,
the command line and Python through the same code, refused with one shape of message:
``<source>: <section>.<field>: expected <what>, got <value>``."""

import json
import logging
import re

import pytest

import vitkit
from vitkit.cli import build_parser, main
from vitkit.declare import declared
from vitkit.declare_flags import FLAG_PREFIX, flag_defaults
from vitkit.errors import ConfigError
from vitkit.train.presets import read_config_file, resolve
from vitkit.train.recipes import FLAT, SECTIONS, Optim, Recipe


def refused(source: str, where: str, rest: str) -> str:
    """The whole message, as a regex: nothing before the source, nothing after the value."""
    return f"^{re.escape(f'{source}: {where}: {rest}')}$"


# (where, bad value in a file or Python, its text on the command line, the expectation)
RECIPE_CASES = [
    ("optim.lr", "abc", "abc", "expected a number >= 0, got 'abc'"),  # wrong type
    ("schedule.batch_size", 0, "0", "expected an int >= 1, got 0"),  # out of range
    ("objective.mpp_bits", 9, "9", "expected an int in [1, 8], got 9"),
    ("optim.optimizer", "adam", "adam", "expected one of ['adamw', 'sgd'], got 'adam'"),
]


@pytest.mark.parametrize("where,value,text,expected", RECIPE_CASES)
def test_a_recipe_field_is_refused_alike_from_yaml_python_and_the_command_line(tmp_path, capsys, where, value, text,
                                                                             expected):
    section, name = where.split(".")
    path = tmp_path / "recipe.yaml"
    path.write_text(f"{section}:\n  {name}: {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match=refused(str(path), where, expected)):
        resolve(config_file=path)
    with pytest.raises(ConfigError, match=refused("Recipe", where, expected)):
        Recipe(**{section: {name: value}})
    flag = "--" + next(alias for alias, at in FLAT.items() if at == (section, name)).replace("_", "-")
    with pytest.raises(SystemExit) as stopped:
        main(["train", flag, text])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}" in err, err
    assert err.endswith(f": {where}: {expected.rsplit(', got ', 1)[0]}, got {text!r}"), err


def test_unknown_recipe_keys_name_the_nearest_field(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("optim:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError, match=refused(str(path), "optim.lrr", "unknown key; did you mean optim.lr?")):
        resolve(config_file=path)
    path.write_text("lrr: 0.1\n")  # a flat key misspelt: the section is found too
    with pytest.raises(ConfigError, match=refused(str(path), "lrr", "unknown key; did you mean optim.lr?")):
        resolve(config_file=path)
    path.write_text("optimizer:\n  lr: 0.1\n")  # a section misspelt (a mapping where a flat field's value goes)
    with pytest.raises(ConfigError, match=refused(str(path), "optim.optimizer",
                                                  "expected one of ['adamw', 'sgd'], got {'lr': 0.1}")):
        resolve(config_file=path)
    with pytest.raises(ConfigError, match=refused("Recipe", "optim.lrr", "unknown key; did you mean optim.lr?")):
        Recipe(optim={"lrr": 0.1})
    with pytest.raises(ConfigError, match=refused("recipe", "model.args.dpeth",
                                                  "unknown key; did you mean model.args.depth?")):
        main_recipe(["train", "--set", "dpeth=3"])


def main_recipe(argv):
    from vitkit.train.presets import recipe_from_args
    return recipe_from_args(build_parser().parse_args(argv))


def test_rules_between_fields_take_the_same_shape():
    with pytest.raises(ConfigError, match=refused("Recipe", "schedule.batch_size",
                                                  "expected a multiple of schedule.accum_steps=3, got 128")):
        Recipe(schedule={"accum_steps": 3})
    with pytest.raises(ConfigError, match=refused("Recipe", "objective.mpp_random_prob",
                                                  "expected at most 1 - objective.mpp_mask_prob = 0.2, got 0.3")):
        Recipe(objective={"mpp_mask_prob": 0.8, "mpp_random_prob": 0.3})


@pytest.mark.parametrize("field,value,expected", [
    ("depth", "deep", "expected an int in [1, 4096], got 'deep'"),  # wrong type
    ("depth", 0, "expected an int in [1, 4096], got 0"),  # out of range
    ("pool", "max", "expected one of ['token', 'gap', 'map', 'soft', 'merge'], got 'max'"),
])
def test_a_model_field_is_refused_alike_from_config_json_python_and_the_command_line(tmp_path, capsys, field, value,
                                                                                   expected):
    config = vitkit.ViTConfig(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
    path = tmp_path / "model"
    vitkit.create_model(config).save(path)
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**data, field: value}))
    with pytest.raises(ConfigError, match=refused(str(path / "config.json"), field, expected)):
        vitkit.ViTConfig.from_json((path / "config.json").read_text(), str(path / "config.json"))
    with pytest.raises(vitkit.CheckpointError, match=re.escape(f"{path / 'config.json'}: {field}: {expected}")):
        vitkit.load(path)
    with pytest.raises(ConfigError, match=refused("ViTConfig", field, expected)):
        config.replace(**{field: value})
    (path / "config.json").write_text(json.dumps(data))
    assert main(["eval", str(path), "--dataset", "digits", "--set", f"{field}={value}"]) == 1  # a bad override
    assert capsys.readouterr().err.strip().endswith(f"(ViTConfig: {field}: {expected})")


def test_unknown_model_keys_name_the_nearest_field(tmp_path):
    data = vitkit.ViTConfig().to_dict()
    data["dpeth"] = data.pop("depth")
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=refused("config.json", "dpeth", "unknown key; did you mean depth?")):
        vitkit.ViTConfig.from_json((tmp_path / "config.json").read_text())
    with pytest.raises(ConfigError, match=refused("ViTConfig", "dpeth", "unknown key; did you mean depth?")):
        vitkit.ViTConfig().replace(dpeth=3)


def test_a_flat_recipe_file_of_earlier_versions_loads_with_one_line_naming_the_new_names(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text("lr: 0.01\nmodel: ViT-Ti/16\nschedule: linear\nbatch_size: 64\nmodel_args:\n  depth: 2\n")
    with caplog.at_level(logging.INFO, logger="vitkit"):
        recipe = resolve(config_file=path)
    assert (recipe.optim.lr, recipe.model.name, recipe.schedule.decay, recipe.schedule.batch_size,
            recipe.model.args) == (0.01, "ViT-Ti/16", "linear", 64, {"depth": 2})
    notes = [record.getMessage() for record in caplog.records if "flat recipe keys" in record.getMessage()]
    assert notes == [f"{path}: flat recipe keys read as the fields of their sections: lr -> optim.lr, model -> "
                     f"model.name, schedule -> schedule.decay, batch_size -> schedule.batch_size, model_args -> "
                     f"model.args"]
    assert "\n" not in notes[0]


def test_a_run_folder_of_earlier_versions_resumes_from_its_flat_recipe_json(tmp_path):
    (tmp_path / "recipe.json").write_text(json.dumps({"lr": 0.123, "steps": 5, "model_args": {"dim": 32},
                                                      "run_dir": str(tmp_path)}))
    resumed = main_recipe(["train", "--resume", "--run-dir", str(tmp_path), "--set", "depth=2"])
    assert (resumed.optim.lr, resumed.schedule.steps, resumed.model.args, resumed.run.dir) == (
        0.123, 5, {"dim": 32, "depth": 2}, str(tmp_path))


def test_a_sectioned_file_loads_and_the_recipe_round_trips(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("model:\n  name: ViT-Ti/16\n  image_size: 32x48\ndata:\n  dataset: mnist\n"
                    "augment:\n  crop_scale: [0.5, 1]\noptim:\n  lr: 1e-3\n  betas: [0.8, 0.9]\n"
                    "schedule:\n  decay: linear\nrun:\n  dir: somewhere\n")
    recipe = resolve(config_file=path)
    assert (recipe.model.name, recipe.model.image_size, recipe.data.dataset, recipe.augment.crop_scale,
            recipe.optim.lr, recipe.optim.betas, recipe.schedule.decay, recipe.run.dir) == (
        "ViT-Ti/16", (32, 48), "mnist", (0.5, 1.0), 0.001, (0.8, 0.9), "linear", "somewhere")
    again = Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))
    assert again == recipe and again.to_dict() == recipe.to_dict()
    assert list(recipe.to_dict()) == ["model", "data", "augment", "objective", "peft", "optim", "schedule", "run"]
    (tmp_path / "saved.json").write_text(json.dumps(recipe.to_dict()))
    assert Recipe.from_dict(read_config_file(tmp_path / "saved.json")) == recipe


def test_each_flag_is_its_declaration():
    """help, choices and the default an unset flag leaves are the declaration's: nothing to drift."""
    train = {action.dest: action for action in build_parser()._subparsers._group_actions[0].choices["train"]._actions}
    defaults = flag_defaults(SECTIONS.items())
    blank = Recipe()
    for section, cls in SECTIONS.items():
        for name, declaration, default in declared(cls):
            action = train[FLAG_PREFIX + f"{section}.{name}"]
            if name != "args":  # --set/--model-args/--drop-path: the model config's fields, by hand
                assert action.help == declaration.help, name
                assert action.choices == getattr(declaration.kind, "choices", None), name
            assert defaults[action.dest] == default == getattr(getattr(blank, section), name), name
    assert train[FLAG_PREFIX + "optim.lr"].option_strings == ["--lr"]
    assert train[FLAG_PREFIX + "schedule.batch_size"].option_strings == ["--batch-size", "-b"]
    assert train[FLAG_PREFIX + "model.name"].option_strings == ["--model"]


def test_flat_python_names_still_work_and_say_their_new_name():
    with pytest.warns(DeprecationWarning, match=r"use optim\.lr"):
        recipe = Recipe(lr=0.5)
    assert recipe.optim == Optim(lr=0.5)
    with pytest.warns(DeprecationWarning, match=r"use recipe\.optim\.lr"):
        assert recipe.lr == 0.5
    with pytest.warns(DeprecationWarning, match=r"use model\.name"):
        assert Recipe(model="ViT-Ti/16").model.name == "ViT-Ti/16"
    with pytest.warns(DeprecationWarning, match=r"use schedule\.steps"):
        assert recipe.replace(steps=3).schedule.steps == 3
    assert recipe.replace(optim={"momentum": 0.5}).optim == Optim(lr=0.5, momentum=0.5)
