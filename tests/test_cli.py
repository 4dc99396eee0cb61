"""One command-line vocabulary: CHECKPOINT and --set on every command that reads a checkpoint, --out a
folder, sizes as H or HxW, the recipe flags in help groups, library messages through logging, and
progress bars on a terminal only."""

import argparse
import ast
import collections
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import torch

import vitkit
from launch import child_env, launch
from vitkit.cli import build_parser, load_checkpoint, main
from vitkit.errors import ConfigError
from vitkit.declare import declared
from vitkit.declare_flags import FLAG_PREFIX, flag_values
from vitkit.models.config import pair
from vitkit.train.presets import MODEL_ARGS_FLAG, resolve
from vitkit.train.recipes import IMAGE_SIZE_FORMS, SECTIONS

TINY = dict(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2, mlp_dim=32, in_chans=1, num_classes=3)
TINY_ARGS = {key: value for key, value in TINY.items() if key not in ("image_size", "num_classes")}
# Every command that reads a checkpoint, with the rest of a command line it accepts.
READERS = {"info": [], "convert": ["out"], "analyze": ["--out", "out"], "eval": [], "fewshot": [],
           "predict": ["x.png"], "serve": [], "bench": []}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "ckpt"
    vitkit.create_model(vitkit.ViTConfig(**TINY)).save(path)
    return path


def test_every_checkpoint_command_takes_checkpoint_and_set(checkpoint):
    parsers = subcommands()
    for command, rest in READERS.items():
        assert "CHECKPOINT" in parsers[command].format_usage(), command
        args = build_parser().parse_args([command, str(checkpoint), *rest, "--set", "ln_eps=1e-12",
                                          "--set", "num_classes=5", "--set", "image_size=8x12"])
        model = load_checkpoint(args)
        assert (model.config.ln_eps, model.config.num_classes, model.config.image_size) == (1e-12, 5, (8, 12))
        assert model.head.weight.shape == (5, TINY["dim"]) and not model.head.weight.any()  # a new zero head
    assert "CHECKPOINT" in parsers["finetune"].format_usage()


def test_set_changes_what_the_commands_run(checkpoint, tmp_path, capsys):
    assert main(["info", str(checkpoint), "--json", "--set", "ln_eps=1e-12", "--set", 'gelu="tanh"']) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert (config["ln_eps"], config["gelu"]) == (1e-12, "tanh")
    assert main(["convert", str(checkpoint), str(tmp_path / "wide"), "--set", "num_classes=7"]) == 0
    converted = vitkit.load(tmp_path / "wide")
    original = vitkit.load(checkpoint)
    assert converted.config.num_classes == 7
    assert torch.equal(converted.patch_embed.proj.weight, original.patch_embed.proj.weight)
    # A 3-class checkpoint evaluated on the 10 digits: refused as it is, run with a 10-class head.
    assert main(["eval", str(checkpoint), "--dataset", "digits", "--out", str(tmp_path / "eval")]) == 2
    assert main(["eval", str(checkpoint), "--dataset", "digits", "--set", "num_classes=10", "--out",
                 str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "eval-test.json").read_text())["images"] == 359
    assert main(["bench", str(checkpoint), "--set", "image_size=8x16", "--runtimes", "eager", "--precision", "fp32",
                 "--repeats", "1", "--peak-size", "64", "-b", "2", "--out", str(tmp_path / "bench")]) == 0
    assert "at 8x16" in capsys.readouterr().out
    written = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert written["image_size"] == [8, 16] and {row["phase"] for row in written["rows"]} == {"inference", "train_step"}


def test_set_and_model_args_are_one_mechanism_on_the_training_commands():
    args = build_parser().parse_args(["train", "--set", "depth=2", "--model-args", '{"dim": 8, "depth": 3}',
                                      "--drop-path", "0.1", "--set", "pool=gap"])
    assert flag_values(args)["model"]["args"] == {"depth": 3, "dim": 8, "drop_path": 0.1, "pool": "gap"}  # later wins
    assert MODEL_ARGS_FLAG not in vars(build_parser().parse_args(["train"]))  # unset: the preset's stand


def test_out_is_a_folder_on_every_command(checkpoint, tmp_path, capsys):
    having = {name: action for name, parser in subcommands().items() for action in parser._actions
              if "--out" in action.option_strings}
    assert set(having) >= {"eval", "analyze", "fewshot", "bench"}
    assert all(action.metavar == "DIR" for action in having.values())
    assert main(["fewshot", str(checkpoint), "--dataset", "digits", "--set", "num_classes=10", "--shots", "1",
                 "--seeds", "1", "--out", str(tmp_path / "fs")]) == 0
    assert json.loads((tmp_path / "fs" / "fewshot.json").read_text())["fewshot"]["1"]["per_seed"]


def test_image_size_is_h_or_hxw_everywhere(tmp_path):
    sized = {(name, tuple(action.option_strings), action.dest) for name, parser in subcommands().items()
             for action in parser._actions if "--image-size" in action.option_strings}
    assert {name for name, _, _ in sized} >= {"models", "analyze", "bench", "train", "finetune", "pretrain"}
    for name, flags, dest in sized:
        positional = ["ckpt", *READERS[name]] if name in READERS else ["ckpt"] if name == "finetune" else []
        for text, size in (("8x12", (8, 12)), ("16", (16, 16))):
            args = build_parser().parse_args([name, *positional, flags[0], text])
            assert pair(getattr(args, dest)) == size, (name, text)
    for text, size in (("[8, 12]", (8, 12)), ("8x12", (8, 12)), ("8 X 12", (8, 12)), ("16", 16), ("'16'", 16)):
        (tmp_path / "r.yaml").write_text(f"model:\n  image_size: {text}\n")  # the flag's forms read as they are
        assert resolve(config_file=tmp_path / "r.yaml").model.image_size == size, text


# (not "0x8": YAML reads it as the hexadecimal integer 8)
@pytest.mark.parametrize("text", ["8y", "8x0", "8x12x3", "x12", "-8", "8.5", "[8]", "[8, 0]", "[8, true]",
                                  "[8, 12.0]", "true", "²"])
def test_image_size_forms_are_refused_alike_by_flag_and_recipe_file(tmp_path, text, capsys):
    """One parser: a size that the flag refuses, a recipe file refuses too, with the same expectation."""
    (tmp_path / "r.yaml").write_text(f"model:\n  image_size: {text}\n")
    expected = re.escape(f"model.image_size: expected {IMAGE_SIZE_FORMS}, or null (the data's), got ")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'r.yaml'))}: {expected}"):
        resolve(config_file=tmp_path / "r.yaml")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--image-size", text])
    assert (f"argument --image-size: model.image_size: expected {IMAGE_SIZE_FORMS}, or null (the data's), got "
            f"{text!r}") in capsys.readouterr().err


def test_recipe_help_groups_hold_every_field_once_with_typed_choices():
    train = subcommands()["train"]
    assert all(action.help for action in train._actions), [a.dest for a in train._actions if not a.help]
    grouped = collections.Counter()
    for group in train._action_groups:
        if group.title.startswith("recipe: "):
            grouped.update({action.dest for action in group._group_actions})  # --set, --model-args: one field
    declarations = {FLAG_PREFIX + f"{section}.{name}": declaration for section, cls in SECTIONS.items()
                    for name, declaration, _ in declared(cls)}
    assert grouped == collections.Counter(list(declarations))
    titles = [group.title for group in train._action_groups if group.title.startswith("recipe: ")]
    assert titles == [f"recipe: {section}" for section in ("model", "data", "augment", "objective", "peft",
                                                             "optim", "schedule", "run")]
    for action in train._actions:  # written once, in the declaration
        if action.dest in declarations and action.option_strings[0] not in ("--model-args", "--drop-path"):
            assert action.help == declarations[action.dest].help, action.dest
            choices = getattr(declarations[action.dest].kind, "choices", None)
            assert action.choices == choices, action.dest
    offered = {action.dest.removeprefix(FLAG_PREFIX): tuple(action.choices) for action in train._actions
               if action.dest.startswith(FLAG_PREFIX) and action.choices}
    assert offered == RECIPE_CHOICES
    with pytest.raises(SystemExit):  # a precision of inference, not of training: fp16 has no loss scaling
        build_parser().parse_args(["train", "--precision", "fp16"])


# The values of the recipe fields that take one of a few, written out.
RECIPE_CHOICES = {"data.corrupt": ("fail", "skip"), "data.train_split": ("train", "trainval", "train800", "train800val200"), "model.channels": ("", "rgb", "grey"),
                  "objective.kind": ("classification", "mpp", "distill", "segmentation", "depth"),
                  "peft.method": ("none", "lora", "dora", "vpt-shallow", "vpt-deep", "adaptformer", "bitfit", "linear"),
                  "objective.mpp_target": ("mean-colour", "downsized", "pixels"),
                  "augment.transform": ("pretrain", "finetune", "eval"),
                  "augment.aug_level": ("none", "light1", "light2", "medium1", "medium2", "strong1", "strong2"),
                  "augment.normalization": ("", "google", "imagenet", "clip", "unit"), "optim.optimizer": ("adamw", "sgd"),
                  "schedule.decay": ("cosine", "linear", "constant"), "run.precision": ("fp32", "bf16", "auto"),
                  "run.parallel": ("ddp", "fsdp")}


def test_library_code_logs_rather_than_prints():
    package = Path(vitkit.__file__).parent
    printing = [f"{path.relative_to(package)}:{node.lineno}" for path in package.rglob("*.py")
                if path.relative_to(package).parts[0] != "cli"
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name) and node.func.id == "print"]
    assert printing == []


TRAIN = ["train", "--model-args", json.dumps(TINY_ARGS), "--steps", "4", "--log-every", "2", "--batch-size", "16",
         "--threads", "1"]


def test_training_progress_is_plain_lines_when_not_on_a_terminal(tmp_path, capsys):
    assert main([*TRAIN, "--image-size", "8x12", "--run-dir", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("step ")]
    assert [line.split(" |")[0] for line in lines] == ["step 2/4  50%", "step 4/4 100%"]
    assert "\r" not in err and "img/s | ETA" in lines[0]
    assert vitkit.load(tmp_path / "run" / "model").config.image_size == (8, 12)


def test_training_progress_is_a_bar_on_a_terminal(tmp_path):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a bar needs a width
    process = subprocess.Popen([sys.executable, "-m", "vitkit", *TRAIN, "--run-dir", str(tmp_path / "run")],
                               stdout=subprocess.DEVNULL, stderr=follower,
                               env=child_env())
    os.close(follower)
    shown = b""
    while chunk := _read(leader):
        shown += chunk
    os.close(leader)
    assert process.wait(timeout=120) == 0, shown[-2000:]
    text = shown.decode()
    assert "train: 100%|" in text and "4/4 [" in text and "\r" in text
    assert "step 2/4" not in text  # the lines are for logs; a terminal has the bar


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # the other end closed (Linux reports EIO)
        return b""


def test_loops_draw_a_bar_on_a_terminal_and_nothing_elsewhere(tmp_path):
    from vitkit.progress import track

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with open(follower, "w", closefd=True) as terminal:
        assert list(track(range(7), "verify", stream=terminal)) == list(range(7))
    drawn = b""
    while chunk := _read(leader):
        drawn += chunk
    os.close(leader)
    assert "verify:" in drawn.decode() and "/7 [" in drawn.decode()
    with open(tmp_path / "log", "w") as log:
        assert list(track(range(7), "verify", stream=log)) == list(range(7))
    assert (tmp_path / "log").read_text() == ""


def test_commands_start_without_the_training_machinery():
    """The parser needs the recipes' fields, not torch's distributed state-dict helpers (0.3 s to import): those
    load when a sharded model is saved or resumed."""
    loaded = launch([sys.executable, "-c", "import sys, vitkit.cli, vitkit.train; "
                                           "print('torch.distributed.checkpoint' in sys.modules)"])
    assert loaded.strip() == "False"
