"""HF transformers directories, written by transformers itself, load with HF's logits (also at a larger
input with interpolated position embeddings); vitkit's HF export is read back by transformers; the
hub path runs offline against a local cache built here."""

import json

import pytest
import torch
from interop_helpers import randomised
from safetensors.torch import save_file

import vitkit
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models import Provenance

transformers = pytest.importorskip("transformers")


def hf_model(cls=None, **kwargs):
    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, image_size=32, patch_size=8, num_labels=10,
                                    **kwargs)
    return randomised((cls or transformers.ViTForImageClassification)(config))


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh"])
def test_save_pretrained_directories_give_hfs_logits(tmp_path, hidden_act):
    peer = hf_model(hidden_act=hidden_act)
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert model.config.ln_eps == 1e-12 and model.config.gelu == ("exact" if hidden_act == "gelu" else "tanh")
    x = torch.randn(2, 3, 32, 32)
    big = torch.randn(2, 3, 56, 48)  # another grid: bicubic resampling without antialias, like HF
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(model(big), peer(big, interpolate_pos_encoding=True).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_in_memory_names_of_transformers_5(tmp_path, weights):
    peer = hf_model()
    state = peer.state_dict()
    assert any(".layers.0.attention.q_proj." in k for k in state)  # 5.x names, unlike the saved files
    (tmp_path / "hf").mkdir()
    peer.config.to_json_file(tmp_path / "hf" / "config.json")
    if weights.endswith(".bin"):
        torch.save(state, tmp_path / "hf" / weights)
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "hf" / weights)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vitkit.load(tmp_path / "hf")(x), peer(x).logits, atol=1e-5, rtol=0)


def test_vit_model_pooler_is_the_pre_logits_layer(tmp_path):
    peer = hf_model(transformers.ViTModel)
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert model.config.representation_size == 64 and model.config.num_classes == 0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = peer(x)
        torch.testing.assert_close(model(x), out.pooler_output, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.forward_features(x), out.last_hidden_state, atol=1e-5, rtol=0)


def test_export_is_read_by_transformers_and_round_trips_bit_identically(tmp_path):
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=2, num_classes=7)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.eval()
    vitkit.checkpoints.export(model, tmp_path / "hf", "hf")
    peer = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(peer(x).logits, model(x), atol=1e-5, rtol=0)
    back = vitkit.load(tmp_path / "hf")
    ours, theirs = model.state_dict(), back.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert back.config.ln_eps == model.config.ln_eps and back.config.gelu == model.config.gelu
    assert torch.equal(back(x), model(x))


def test_export_refuses_what_hf_cannot_express(tmp_path):
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1, pool="gap", fc_norm=True)
    with pytest.raises(vitkit.CheckpointError, match="HF's ViT has no pool='gap', fc_norm"):
        vitkit.checkpoints.export(model, tmp_path / "hf", "hf")
    assert not (tmp_path / "hf").exists()


def test_hf_hub_ids_resolve_through_the_local_cache(tmp_path, monkeypatch):
    """The real huggingface_hub code path, offline, on a cache laid out as huggingface_hub lays it out."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    peer = hf_model()
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--org--tiny-vit"
    peer.save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(vitkit.load("hf-hub:org/tiny-vit")(x), peer(x).logits, atol=1e-5, rtol=0)
    with pytest.raises(vitkit.CheckpointError, match="hf-hub:org/missing: not in the local cache"):
        vitkit.load("hf-hub:org/missing")


def test_google_bucket_names_download_once_into_the_cache(tmp_path, monkeypatch):
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1, gelu="tanh")
    mirror = tmp_path / "mirror" / "vit_models" / "augreg"
    vitkit.checkpoints.export(model, mirror / "Ti_16.npz", "npz")
    monkeypatch.setenv("VITKIT_GS_URL", (tmp_path / "mirror").as_uri())
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    loaded = vitkit.load("gs://vit_models/augreg/Ti_16.npz")
    assert (tmp_path / "cache" / "gs" / "vit_models" / "augreg" / "Ti_16.npz").exists()
    (mirror / "Ti_16.npz").unlink()  # the second load needs no download
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(vitkit.load("gs://vit_models/augreg/Ti_16.npz")(x), loaded(x))
    assert torch.equal(loaded(x), model.eval()(x))
    with pytest.raises(vitkit.CheckpointError, match="download from .* failed"):
        vitkit.load("gs://vit_models/augreg/missing.npz")


def test_hf_config_of_another_model_type_is_a_clear_error(tmp_path):
    hf_model().save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["model_type"] = "swin"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match="model_type='swin'"):
        vitkit.load(tmp_path / "hf")


def test_input_normalisation_travels_with_the_directory(tmp_path):
    """An HF directory's preprocessor_config.json names the input statistics; vitkit's export writes one
    that transformers' own image processor turns into the pixels vitkit's evaluation transform makes."""
    peer = hf_model()
    peer.save_pretrained(tmp_path / "hf")
    assert vitkit.load(tmp_path / "hf").config.provenance.normalization == "google"  # no processor: HF's default
    imagenet = transformers.ViTImageProcessor(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    imagenet.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert model.config.provenance.normalization == "imagenet"

    vitkit.checkpoints.export(model, tmp_path / "out", "hf")
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "out")
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)  # at the model's size: no resampling
    theirs = processor(image.permute(1, 2, 0).numpy(), return_tensors="pt").pixel_values[0]
    ours = checkpoint_transform(vitkit.load(tmp_path / "out").config)(image)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_processor_statistics_are_read_whatever_their_form(tmp_path):
    peer = hf_model()
    peer.save_pretrained(tmp_path / "hf")
    processor = tmp_path / "hf" / "preprocessor_config.json"
    for stats, family in [({"image_mean": 0.5, "image_std": 0.5}, "google"), ({}, "google"),
                          ({"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}, "imagenet")]:
        processor.write_text(json.dumps(stats))
        assert vitkit.load(tmp_path / "hf").config.provenance.normalization == family
    processor.write_text(json.dumps({"image_mean": [0.1, 0.2, 0.3], "image_std": [1, 1, 1]}))
    with pytest.warns(UserWarning, match="match no known normalisation"):
        assert vitkit.load(tmp_path / "hf").config.provenance.normalization == "google"
    processor.write_text(json.dumps({"image_mean": "half", "image_std": 0.5}))
    with pytest.raises(vitkit.CheckpointError, match=r"preprocessor_config.json: image_mean='half'"):
        vitkit.load(tmp_path / "hf")


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    """A small HF ViT directory as transformers saves it (config.json + model.safetensors)."""
    directory = tmp_path_factory.mktemp("hf") / "hf"
    hf_model().save_pretrained(directory)
    return directory


def hf_copy(source, target, config=None, processor=None):
    """A copy of ``source`` whose config.json fields are updated by ``config`` (None values remove them) and
    whose preprocessor_config.json is ``processor``."""
    target.mkdir()
    (target / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    fields = {**json.loads((source / "config.json").read_text()), **(config or {})}
    (target / "config.json").write_text(json.dumps({k: v for k, v in fields.items() if v is not None}))
    if processor is not None:
        (target / "preprocessor_config.json").write_text(json.dumps(processor))
    return target


@pytest.mark.parametrize("field, value, expected", [
    ("num_channels", "3", "an integer >= 1"), ("num_channels", 0, "an integer >= 1"),
    ("hidden_size", True, "an integer >= 1"), ("num_hidden_layers", -2, "an integer >= 1"),
    ("num_attention_heads", 4.0, "an integer >= 1"), ("intermediate_size", [128], "an integer >= 1"),
    ("patch_size", False, "an integer >= 1"), ("image_size", "32", "an integer >= 1 or a [height, width] pair"),
    ("image_size", [32], "an integer >= 1 or a [height, width] pair"), ("layer_norm_eps", -1e-12, "a positive number"),
    ("hidden_dropout_prob", 1.0, "a number in [0, 1)"), ("attention_probs_dropout_prob", "0", "a number in [0, 1)"),
    ("qkv_bias", 1, "true or false"),
])
def test_a_number_of_the_wrong_kind_in_an_hf_config_is_named(hf_directory, tmp_path, field, value, expected):
    """With a processor beside it, whose statistics are checked against num_channels."""
    directory = hf_copy(hf_directory, tmp_path / "hf", {field: value}, {"image_mean": [0.5] * 3, "image_std": 0.5})
    with pytest.raises(vitkit.CheckpointError) as error:
        vitkit.load(directory)
    assert str(error.value) == f"{directory / 'config.json'}: {field}={value!r}; expected {expected}"


def test_missing_and_nested_hf_fields_are_named(hf_directory, tmp_path):
    directory = hf_copy(hf_directory, tmp_path / "vit", {"hidden_size": None})
    with pytest.raises(vitkit.CheckpointError, match=r"config.json: no hidden_size; expected an integer >= 1$"):
        vitkit.load(directory)
    clip = hf_copy(hf_directory, tmp_path / "clip", {"model_type": "clip", "vision_config": {
        "num_attention_heads": 4, "num_channels": "3"}})
    with pytest.raises(vitkit.CheckpointError, match=r"config.json: vision_config.num_channels='3'; expected an "):
        vitkit.load(clip)
    dino = hf_copy(hf_directory, tmp_path / "dino", {"model_type": "dinov2", "num_attention_heads": None})
    with pytest.raises(vitkit.CheckpointError, match=r"config.json: no num_attention_heads; expected"):
        vitkit.load(dino)


@pytest.mark.parametrize("processor, expected", [
    ({"do_center_crop": True, "size": {"shortest_edge": 40}},
     "do_center_crop with crop_size=None; expected crop_size as a number of pixels, or an object with "
     "'shortest_edge' or 'height'"),
    ({"do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "size": {"width": 40}},
     "do_center_crop with size={'width': 40}; expected size as a number of pixels"),
    ({"do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "size": {"shortest_edge": 24}},
     "do_center_crop with crop_size={'height': 32, 'width': 32} larger than size={'shortest_edge': 24}; expected "
     "a crop within the resized image (vitkit does not pad)"),
])
def test_a_centre_crop_vitkit_cannot_reproduce_is_refused_by_field(hf_directory, tmp_path, processor, expected):
    """transformers takes a missing size from its processor class's defaults and pads a crop larger than the
    resized image with black; vitkit's evaluation does neither, so it says which field is at fault."""
    directory = hf_copy(hf_directory, tmp_path / "hf", processor=processor)
    with pytest.raises(vitkit.CheckpointError) as error:
        vitkit.load(directory)
    assert str(error.value).startswith(f"{directory / 'preprocessor_config.json'}: {expected}")
    assert "\n" not in str(error.value)


def test_export_names_labels_only_when_they_fit_the_head(tmp_path):
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1, num_classes=3)
    model.config = model.config.replace(provenance=Provenance(classes=("cat", "dog", "fox")))
    vitkit.checkpoints.export(model, tmp_path / "named", "hf")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "named").id2label == {0: "cat", 1: "dog", 2: "fox"}
    model.reset_head(5)  # a new head: the old names no longer apply
    vitkit.checkpoints.export(model, tmp_path / "renamed", "hf")
    peer = transformers.ViTForImageClassification.from_pretrained(tmp_path / "renamed")
    assert peer.config.num_labels == 5 and peer.config.id2label[4] == "LABEL_4"


def test_label_names_of_config_json_become_the_class_names_and_round_trip(tmp_path):
    names = {0: "tench", 1: "goldfish", 2: "great white shark"}
    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128,
                                    image_size=32, patch_size=8, id2label=names, label2id={v: k for k, v in names.items()})
    randomised(transformers.ViTForImageClassification(config)).save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert model.config.provenance.classes == ("tench", "goldfish", "great white shark")
    vitkit.checkpoints.export(model, tmp_path / "out", "hf")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "out").id2label == names
    assert vitkit.load(tmp_path / "out").config.provenance.classes == model.config.provenance.classes

    hf_model().save_pretrained(tmp_path / "placeholders")  # LABEL_0 ... LABEL_9: no names
    assert vitkit.load(tmp_path / "placeholders").config.provenance.classes is None
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["id2label"] = {"0": "tench", "1": "goldfish"}  # two names for a head of three
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match=r"config.json: id2label=.*for each of the head's 3 outputs"):
        vitkit.load(tmp_path / "hf")


def test_deit_label_names_round_trip_through_transformers(tmp_path):
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1, num_classes=2, dist_token=True)
    model.config = model.config.replace(provenance=Provenance(classes=("cat", "dog")))
    vitkit.checkpoints.export(model, tmp_path / "deit", "hf")
    peer = transformers.DeiTForImageClassificationWithTeacher.from_pretrained(tmp_path / "deit")
    assert peer.config.id2label == {0: "cat", 1: "dog"}
    assert vitkit.load(tmp_path / "deit").config.provenance.classes == ("cat", "dog")
