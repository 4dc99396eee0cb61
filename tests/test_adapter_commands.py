"""``--adapter DIR`` on the commands that read a checkpoint: each runs the base with the adapter folder applied,
as ``vitkit.load(BASE, adapter=DIR)`` builds it; ``convert`` writes it with its LoRA merged, and refuses prompts
to a format that cannot hold them."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.checkpoints.adapters import AdapterSpec, adapt, save_adapter
from vitkit.checkpoints.runnable import source_config
from vitkit.cli import main
from vitkit.data.images import read_image
from vitkit.evaluate.predict import image_transform
from vitkit.train import Recipe
from vitkit.train.recipes import Data

# The embedded digits' size: 8 x 8 grey, 10 classes.
TINY = dict(image_size=8, patch_size=2, dim=16, depth=2, num_heads=2, mlp_dim=32, in_chans=1, num_classes=10)
BENCH = ["--precision", "fp32", "--repeats", "1", "--peak-size", "32", "-b", "2"]


def saved_adapter(base, directory, spec):
    """An adapter folder of ``spec`` on ``base`` whose trained tensors are random, so that it changes the logits."""
    model = vitkit.load(base)
    adapt(model, spec)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.normal_(0, 0.3)
    return save_adapter(model, directory, base=str(base))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    torch.manual_seed(0)
    model = vitkit.create_model(vitkit.ViTConfig(**TINY))
    with torch.no_grad():
        model.head.weight.normal_()  # the zero-initialised head would make every logit 0
    return model.save(tmp_path_factory.mktemp("adapters") / "base")


@pytest.fixture(scope="module")
def lora(base, tmp_path_factory):
    """A LoRA adapter in the folder a fine-tuning run writes (beside its recipe: the digits)."""
    pytest.importorskip("peft")
    torch.manual_seed(1)
    run = tmp_path_factory.mktemp("run")
    (run / "recipe.json").write_text(json.dumps(Recipe(data=Data(dataset="digits")).to_dict()))
    return saved_adapter(base, run / "adapter", AdapterSpec("lora", lora_rank=4))


@pytest.fixture(scope="module")
def vpt(base, tmp_path_factory):
    torch.manual_seed(2)
    return saved_adapter(base, tmp_path_factory.mktemp("vpt") / "adapter", AdapterSpec("vpt-deep", prompt_tokens=3))


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("images") / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8)).save(path)
    return path


def test_eval_measures_the_adapted_model_on_the_adapters_run_dataset(base, lora, capsys):
    """Without --dataset, eval takes the dataset of the run the adapter lies in, and writes its report there."""
    assert main(["eval", str(base), "--adapter", str(lora)]) == 0
    assert "digits [test]" in capsys.readouterr().out
    written = json.loads((lora.parent / "eval-test.json").read_text())
    adapted = vitkit.evaluate_dataset(vitkit.load(base, adapter=lora), "digits", "test")
    plain = vitkit.evaluate_dataset(vitkit.load(base), "digits", "test")
    assert written["top1"] == adapted.report["top1"] and written["confusion"] == adapted.report["confusion"]
    assert written["loss"] == pytest.approx(adapted.report["loss"], rel=1e-5)
    assert written["loss"] != pytest.approx(plain.report["loss"], rel=1e-3)


def test_predict_gives_the_adapted_models_probabilities(base, lora, image, capsys):
    assert main(["predict", str(base), str(image), "--adapter", str(lora), "--json", "--top-k", "10"]) == 0
    given = {entry["label"]: entry["probability"] for entry in json.loads(capsys.readouterr().out)[0]["top_k"]}
    pixels = read_image(image)

    def probabilities(model):
        with torch.no_grad():
            logits = model(image_transform(model, pixels, "crop", False)(pixels)[None])
        return logits.softmax(-1)[0].numpy()

    adapted, plain = probabilities(vitkit.load(base, adapter=lora)), probabilities(vitkit.load(base))
    np.testing.assert_allclose([given[str(k)] for k in range(10)], adapted, atol=1e-5, rtol=0)
    assert np.abs(adapted - plain).max() > 1e-2


def test_onnx_export_of_an_adapted_model_gives_its_logits(base, lora, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    assert main(["convert", str(base), str(tmp_path / "m.onnx"), "--to", "onnx", "--adapter", str(lora)]) == 0
    adapted = vitkit.load(base, adapter=lora)  # LoRA wrappers, unmerged
    images = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        expected = adapted(images).numpy()
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["logits"], {"images": images.numpy()})[0], expected, atol=1e-4, rtol=0)
    with torch.no_grad():
        assert np.abs(vitkit.load(base)(images).numpy() - expected).max() > 1e-2


def test_timm_and_native_files_hold_the_merged_lora(base, lora, tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import load_file

    written = tmp_path / "out.safetensors"
    assert main(["convert", str(base), str(written), "--to", "timm", "--adapter", str(lora)]) == 0
    assert main(["convert", str(base), str(tmp_path / "native"), "--adapter", str(lora)]) == 0
    peer = timm.models.vision_transformer.VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2)
    peer.load_state_dict(load_file(written), strict=True)  # plain dense layers: no LoRA left
    images = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        expected = vitkit.load(base, adapter=lora)(images)
        torch.testing.assert_close(peer.eval()(images), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(vitkit.load(tmp_path / "native")(images), expected, atol=1e-5, rtol=0)


def test_prompts_are_refused_by_the_formats_without_them_and_kept_by_vitkits(base, vpt, tmp_path, capsys):
    for destination, to in (("out.safetensors", "timm"), ("out.npz", "npz"), ("hf", "hf")):
        assert main(["convert", str(base), str(tmp_path / destination), "--to", to, "--adapter", str(vpt)]) == 2
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and "has no place for VPT prompts (prompt_tokens)" in error, error
        assert not (tmp_path / destination).exists()
    assert main(["convert", str(base), str(tmp_path / "native"), "--adapter", str(vpt)]) == 0
    images = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(vitkit.load(tmp_path / "native")(images), vitkit.load(base, adapter=vpt)(images))


def test_info_analyze_and_fewshot_run_the_adapted_model(base, vpt, lora, image, tmp_path, capsys):
    assert main(["info", str(base), "--adapter", str(vpt), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["prompt_tokens"] == 3
    assert main(["analyze", str(base), "--adapter", str(vpt), "--images", str(image), "--out", str(tmp_path / "a"),
                 "--overlays", "1", "--filters", "2"]) == 0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["model"]["prompt_tokens"] == 3 and summary["title"] == f"{base} with adapter {vpt}"
    assert main(["fewshot", str(base), "--adapter", str(lora), "--dataset", "digits", "--shots", "5", "--seeds", "1",
                 "--out", str(tmp_path / "f")]) == 0
    written = json.loads((tmp_path / "f" / "fewshot.json").read_text())
    adapted, plain = (vitkit.probe_dataset(model, "digits", shots=[5], seeds=1).fewshot[0].mean
                      for model in (vitkit.load(base, adapter=lora), vitkit.load(base)))
    assert written["checkpoint"] == f"{base} with adapter {lora}"
    assert written["fewshot"]["5"]["mean"] == pytest.approx(adapted) and adapted != pytest.approx(plain)


def test_bench_runs_the_adapted_model(base, vpt, lora, tmp_path):
    """With a LoRA, bench's runtimes take the merged model (timm's too); timm has no place for prompts."""
    pytest.importorskip("timm")
    assert main(["bench", str(base), "--adapter", str(lora), "--runtimes", "eager", "timm", *BENCH,
                 "--out", str(tmp_path / "lora")]) == 0
    written = json.loads((tmp_path / "lora" / "bench.json").read_text())
    assert {row["runtime"] for row in written["rows"]} == {"eager", "timm"} and not written["skipped"]
    assert main(["bench", str(base), "--adapter", str(vpt), "--runtimes", "eager", "timm", *BENCH,
                 "--out", str(tmp_path / "vpt")]) == 0
    written = json.loads((tmp_path / "vpt" / "bench.json").read_text())
    assert {row["runtime"] for row in written["rows"]} == {"eager"} and "VPT prompts" in written["skipped"]["timm"]
    assert source_config(str(base), {}, adapter=str(vpt)).prompt_tokens == 3  # what the size check counts


def test_a_missing_adapter_or_one_on_an_exported_graph_is_one_line(base, image, tmp_path, capsys):
    missing = tmp_path / "nowhere"
    for command in (["predict", str(base), str(image)], ["eval", str(base), "--dataset", "digits"],
                    ["convert", str(base), str(tmp_path / "out")], ["bench", str(base), "--runtimes", "eager"]):
        assert main([*command, "--adapter", str(missing)]) == 1
        error = capsys.readouterr().err.strip()
        assert error.endswith(f"no adapter folder at {missing}") and "\n" not in error and "Traceback" not in error
    assert not (tmp_path / "out").exists()
    graph = tmp_path / "m.onnx"
    graph.touch()  # refused before it is read
    assert main(["predict", str(graph), str(image), "--adapter", str(missing)]) == 2
    assert "--adapter: an ONNX model runs as it was exported; apply the adapter before exporting: vitkit convert " \
           "BASE out.onnx --adapter DIR" in capsys.readouterr().err
