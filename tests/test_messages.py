"""Messages that say what to do next: the closest flag, dataset name or field for a typo, a bare path's prefix,
the fields a resume differs in, a format that can hold the model, the exit codes README documents; and the
help and `vitkit info` lines a newcomer reads first. (`predict` on folders and globs: test_analysis_readable.)"""

import numpy as np
import pytest
import torch

import vitkit
from vitkit.cli import build_parser, main
from vitkit.data import DatasetError, load_dataset
from vitkit.data.datasets import dataset_name
from vitkit.errors import ConfigError

TINY = dict(image_size=8, patch_size=4, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)


def usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv,usage,hint", [
    (["train", "--learning-rate", "1e-3"], "usage: vitkit train", "--learning-rate: did you mean --lr?"),
    (["train", "--weight_decay", "0.1"], "usage: vitkit train", "--weight_decay: did you mean --weight-decay?"),
    (["eval", "ckpt", "--batchsize", "8"], "usage: vitkit eval", "--batchsize: did you mean --batch-size"),
    (["data", "info", "digits", "--jsn"], "usage: vitkit data info", "--jsn: did you mean --json?"),
])
def test_unknown_flags_get_the_subcommands_usage_and_the_closest_flag(argv, usage, hint, capsys):
    err = usage_error(argv, capsys)
    assert err.startswith(usage) and hint in err
    assert f"vitkit {' '.join(argv[:2] if argv[0] == 'data' else argv[:1])}: error: unrecognized arguments" in err


def test_a_flag_with_nothing_close_is_refused_without_a_guess(capsys):
    err = usage_error(["predict", "ckpt", "x.png", "--zzzzzz"], capsys)
    assert err.splitlines()[-1] == "vitkit predict: error: unrecognized arguments: --zzzzzz"


@pytest.mark.parametrize("spelling,name", [
    ("cifar10", "cifar10"), ("cifar-10", "cifar10"), ("CIFAR_10", "cifar10"), ("cifar-100", "cifar100"),
    ("fashion-mnist", "fashion-mnist"), ("fashion_mnist", "fashion-mnist"), ("fashionmnist", "fashion-mnist"),
    ("FashionMNIST", "fashion-mnist"), ("MNIST", "mnist"), ("npz:a-b_c.npz", "npz:a-b_c.npz"),
])
def test_dataset_names_in_any_spelling(spelling, name):
    assert dataset_name(spelling) == name


def test_a_named_dataset_in_another_spelling_loads(shared_data):
    assert len(load_dataset("fashion_mnist", "test", shared_data)) == 10_000


def test_unknown_datasets_name_what_was_meant(tmp_path):
    np.savez(tmp_path / "data.npz", x_test=np.zeros((2, 4, 4), np.uint8), y_test=np.zeros(2, np.int64))
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "train-000000.tar").write_bytes(b"")
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    for text, meant in [(str(tmp_path / "data.npz"), f"npz:{tmp_path / 'data.npz'}"),
                        ("missing.npz", "npz:missing.npz"),
                        (str(tmp_path / "shards"), f"webdataset:{tmp_path / 'shards'}"),
                        (str(tmp_path / "photos"), f"imagefolder:{tmp_path / 'photos'}"),
                        ("cifar", "cifar10"), ("fasion-mnist", "fashion-mnist")]:
        with pytest.raises(DatasetError) as error:
            load_dataset(text, "test")
        assert str(error.value).endswith(f"; did you mean {meant}?"), str(error.value)
    with pytest.raises(DatasetError, match=r"^unknown dataset 'qqq': expected digits, mnist, .* or depthfolder:DIR$"):
        load_dataset("qqq", "test")


def test_unknown_model_keywords_are_config_errors_naming_the_close_field():
    with pytest.raises(ConfigError, match=r"^ViTConfig: dpeth: unknown key; did you mean depth\?$"):
        vitkit.create_model("ViT-Ti/16", dpeth=3)
    with pytest.raises(ConfigError, match=r"^ViTConfig: num_head: unknown key; did you mean num_heads or dense_head\?$"):
        vitkit.create_model(vitkit.ViTConfig(**TINY), num_head=4)


def test_resume_refusal_names_each_differing_field_with_both_values(tmp_path):
    from vitkit.train.checkpointing import load_checkpoint, save_checkpoint

    saved = vitkit.create_model(vitkit.ViTConfig(**TINY))
    path = save_checkpoint(tmp_path, 3, saved, saved.state_dict(), {"step": 3}, keep_last=0)
    other = vitkit.create_model(vitkit.ViTConfig(**{**TINY, "depth": 2, "ln_eps": 1e-5}))
    with pytest.raises(ConfigError) as error:
        load_checkpoint(path, other, torch.optim.SGD(other.parameters(), lr=0.1))
    assert ("(depth: 1 in the checkpoint, 2 in the recipe; ln_eps: 1e-06 in the checkpoint, 1e-05 in the recipe)"
            in str(error.value))


def test_an_export_format_that_cannot_hold_the_model_is_a_usage_error_naming_one_that_can(tmp_path, capsys):
    vitkit.create_model(vitkit.ViTConfig(**{**TINY, "pool": "gap"})).save(tmp_path / "gap")
    assert main(["convert", str(tmp_path / "gap"), str(tmp_path / "hf"), "--to", "hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"vitkit convert: error: cannot write {tmp_path / 'hf'}: HF's ViT has no pool='gap'; write it as "
                   "'native' (vitkit's own format holds every model) or, to run it elsewhere, as 'onnx'")
    assert main(["convert", str(tmp_path / "gap"), str(tmp_path / "native")]) == 0
    assert vitkit.load(tmp_path / "native").config.pool == "gap"  # the format named holds it


def test_dataset_and_top_k_flags_have_help():
    parsers = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices and "eval" in a.choices)
    for command, flag in [("eval", "--dataset"), ("fewshot", "--dataset"), ("analyze", "--dataset"),
                          ("predict", "--top-k"), ("predict", "--json")]:
        action = next(a for a in parsers.choices[command]._actions if flag in a.option_strings)
        assert action.help, (command, flag)
    eval_help = parsers.choices["eval"].format_help()
    assert "cifar10" in eval_help and "npz:PATH" in eval_help


def test_info_names_a_timm_folder_by_its_architecture(tmp_path, capsys):
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    peer = timm.create_model("vit_small_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=5)
    save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=True)
    assert main(["info", str(tmp_path / "hub")]) == 0
    assert "model        vit_small_patch16_224: 1 layers, D=384" in capsys.readouterr().out
