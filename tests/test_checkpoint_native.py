import json

import pytest
import torch

import vitkit
from vitkit.cli import main


def tiny(**overrides):
    config = vitkit.ViTConfig(image_size=32, patch_size=8, dim=32, depth=2, num_heads=2, mlp_dim=64,
                              num_classes=7, **overrides)
    model = vitkit.create_model(config)
    torch.nn.init.normal_(model.head.weight)
    return model.eval()


@pytest.mark.parametrize("pos_embed", ["learned", "learned-2d", "sincos-2d", "relative", "none"])
def test_save_then_load_gives_identical_logits(tmp_path, pos_embed):
    model = tiny(pos_embed=pos_embed, representation_size=16)
    model.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors"]
    loaded = vitkit.load(tmp_path / "ckpt")
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model(x), loaded(x))
    assert loaded.config == model.config
    assert not loaded.training


def test_load_overrides_resize_and_new_head(tmp_path):
    model = tiny()
    model.save(tmp_path / "c")
    loaded = vitkit.load(tmp_path / "c", image_size=48, num_classes=3, dropout=0.1)
    assert loaded.config.image_size == (48, 48) and loaded.pos_embed.weight.shape[1] == 1 + 36
    assert loaded.config.dropout == 0.1 and loaded.head.out_features == 3 and not loaded.head.weight.any()
    x = torch.randn(1, 3, 48, 48)
    torch.testing.assert_close(loaded.forward_features(x), model.forward_features(x))


def test_save_replaces_an_existing_checkpoint_atomically(tmp_path):
    first, second = tiny(), tiny()
    first.save(tmp_path / "c")
    second.save(tmp_path / "c")
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(vitkit.load(tmp_path / "c")(x), second(x))
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # no staging or backup left behind


def test_a_failed_save_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    model = tiny()
    model.save(tmp_path / "c")
    before = (tmp_path / "c" / "model.safetensors").read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("vitkit.models.vit.save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        tiny().save(tmp_path / "c")
    assert (tmp_path / "c" / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_save_refuses_to_replace_an_unrelated_directory(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="does not look like a checkpoint"):
        tiny().save(tmp_path / "photos")
    assert (tmp_path / "photos" / "cat.jpg").exists()


def test_missing_and_corrupt_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(vitkit.CheckpointError, match="no checkpoint at"):
        vitkit.load(tmp_path / "nope")
    tiny().save(tmp_path / "c")
    weights = tmp_path / "c" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(vitkit.CheckpointError, match="corrupt or unreadable safetensors"):
        vitkit.load(tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text("{not json")
    with pytest.raises(vitkit.CheckpointError, match="config.json: not a valid vitkit config"):
        vitkit.load(tmp_path / "c")


def test_weights_that_do_not_fit_list_every_problem(tmp_path):
    tiny().save(tmp_path / "c")
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    config["depth"], config["num_classes"] = 3, 9
    (tmp_path / "c" / "config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError) as error:
        vitkit.load(tmp_path / "c")
    message = str(error.value)
    assert "missing keys" in message and "blocks.2.attn.qkv.weight" in message
    assert "shape conflicts" in message and "head.weight: checkpoint (7, 32) vs model (9, 32)" in message


def test_cli_models_and_info(tmp_path, capsys):
    assert main(["models", "ViT-B/16", "vit-ti/16"]) == 0
    out = capsys.readouterr().out
    assert "86,567,656" in out and "5,717,416" in out and "35.13" in out
    tiny().save(tmp_path / "c")
    assert main(["info", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "3x32x32 (grid 4x4)" in out and "7 classes" in out
    assert main(["info", str(tmp_path / "c"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["depth"] == 2


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 1
    assert "vitkit info: error: no checkpoint at" in capsys.readouterr().err
    assert main(["models", "ViT-Q/16"]) == 2
    assert "unknown model 'ViT-Q/16'" in capsys.readouterr().err


def test_written_files_get_the_usual_permissions(tmp_path):
    import os
    import stat

    from vitkit.atomic import atomic_file

    mask = os.umask(0o022)
    try:
        tiny().save(tmp_path / "c")
        with atomic_file(tmp_path / "f.txt") as handle:
            handle.write("x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "f.txt").stat().st_mode) == 0o644
