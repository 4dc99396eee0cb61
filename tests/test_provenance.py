"""Typed provenance: where weights come from and how their inputs are prepared, saved with the config."""

import json

import pytest
import torch

import vitkit
from vitkit.errors import ConfigError
from vitkit.models import Provenance

TINY = dict(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)


def test_a_checkpoint_saved_with_the_untyped_extra_dict_still_loads(tmp_path):
    """config.json as vitkit wrote it before provenance was typed: the same keys under ``extra``."""
    model = vitkit.create_model(vitkit.ViTConfig(**TINY))
    model.save(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["provenance"]
    config["extra"] = {"name": "ViT-Ti/16", "format": "timm", "source": "/x/model.safetensors",
                       "normalization": "imagenet", "classes": ["cat", "dog", "fox"]}
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))

    loaded = vitkit.load(tmp_path / "old")
    assert loaded.config.provenance == Provenance(name="ViT-Ti/16", format="timm", source="/x/model.safetensors",
                                                  normalization="imagenet", classes=("cat", "dog", "fox"))
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(loaded.eval()(images), model.eval()(images), rtol=0, atol=0)
    loaded.save(tmp_path / "new")  # written again in the typed layout, read back the same
    saved = json.loads((tmp_path / "new" / "config.json").read_text())
    assert "extra" not in saved and saved["provenance"]["classes"] == ["cat", "dog", "fox"]
    assert vitkit.load(tmp_path / "new").config == loaded.config


@pytest.mark.parametrize("provenance, expected", [
    ({"colour": "red"}, r"provenance\.colour: unknown key"),
    ({"normalization": "cifar"}, r"provenance\.normalization: expected one of \['google', 'imagenet', 'clip', 'unit'\], got 'cifar'"),
    ({"classes": "abc"}, r"provenance\.classes: expected a list of strings, or null, got 'abc'"),
    ({"classes": [1, 2, 3]}, "expected a list of strings"),
    ({"crop_pct": 0}, r"provenance\.crop_pct: expected a number in \(0, 1\], got 0"),
    ({"crop_pct": 1.5}, r"provenance\.crop_pct: expected a number in \(0, 1\], got 1\.5"),
    ({"name": 7}, r"provenance\.name: expected a string, or null, got 7"),
    ("imagenet", r"provenance: expected a Provenance or a JSON object, got 'imagenet'"),
])
def test_every_provenance_field_is_checked(provenance, expected):
    with pytest.raises(ConfigError, match=expected):
        vitkit.ViTConfig.from_dict({**TINY, "provenance": provenance})
    with pytest.raises(ConfigError, match=expected):  # the old spelling is checked as strictly
        vitkit.ViTConfig.from_dict({**TINY, "extra": provenance})


def test_class_names_match_the_head_and_a_new_head_forgets_them():
    with pytest.raises(ConfigError, match=r"provenance\.classes: expected 3 names, one per class \(num_classes\), got \('a', 'b'\)"):
        vitkit.ViTConfig(**TINY, provenance=Provenance(classes=("a", "b")))
    model = vitkit.create_model(vitkit.ViTConfig(**TINY, provenance=Provenance(classes=("a", "b", "c"))))
    model.reset_head(5)
    assert (model.config.num_classes, model.config.provenance.classes) == (5, None)


def test_a_new_num_classes_drops_the_old_heads_names_unless_new_ones_come_with_it():
    config = vitkit.ViTConfig(**TINY, provenance=Provenance(classes=("a", "b", "c"), normalization="imagenet"))
    assert config.replace(num_classes=5).provenance == Provenance(normalization="imagenet")
    assert config.replace(num_classes=0).provenance.classes is None
    assert config.replace(num_classes=3).provenance.classes == ("a", "b", "c")  # the same head keeps its names
    assert config.replace(dim=32).provenance.classes == ("a", "b", "c")
    renamed = config.replace(num_classes=2, provenance=config.provenance.replace(classes=("x", "y")))
    assert renamed.provenance.classes == ("x", "y")
    with pytest.raises(ConfigError, match=r"provenance\.classes: expected 2 names, one per class \(num_classes\), got \('x',\)"):
        config.replace(num_classes=2, provenance=config.provenance.replace(classes=("x",)))


@pytest.mark.parametrize("key", ["provenance", "extra"])
def test_a_saved_config_whose_names_do_not_fit_its_head_loads_without_them(tmp_path, key):
    """Versions before ``replace`` dropped them saved an earlier head's names beside a new head."""
    model = vitkit.create_model(vitkit.ViTConfig(**TINY))
    model.save(tmp_path / "old")
    config_file = tmp_path / "old" / "config.json"
    config = json.loads(config_file.read_text())
    config[key] = {**config.pop("provenance"), "classes": ["cat", "dog"]}
    config_file.write_text(json.dumps(config))
    with pytest.warns(UserWarning) as warned:
        loaded = vitkit.load(tmp_path / "old")
    assert [str(w.message) for w in warned] == [
        f"{config_file}: 2 class names in provenance.classes for num_classes=3; they belonged to an earlier head "
        f"and are dropped"]
    assert loaded.config.provenance.classes is None and loaded.config.num_classes == 3
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(loaded(images), model.eval()(images), rtol=0, atol=0)


def test_named_variants_and_families_record_name_and_normalisation():
    assert vitkit.create_model("ViT-Ti/16", num_classes=0).config.provenance == Provenance(name="ViT-Ti/16")
    clip = vitkit.models.model_config("CLIP-B/32")
    assert (clip.provenance.name, clip.provenance.normalization) == ("CLIP-B/32", "clip")
