"""What the commands do, called from Python: the library functions behind ``eval``, ``fewshot``, ``bench`` and the
size checks of ``finetune``/``bench``, on a tiny model and the embedded digits."""

import json

import pytest
import torch

import vitkit
from vitkit.checkpoints.runnable import load_inference, source_config
from vitkit.data import SplitSpec, load_dataset
from vitkit.errors import CheckpointError, ConfigError
from vitkit.train import Recipe, recorded_data
from vitkit.train.recipes import Data

TINY = dict(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2, mlp_dim=32, in_chans=1, num_classes=10)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("api") / "model"
    vitkit.create_model(vitkit.ViTConfig(**TINY)).save(path)
    return path


def test_the_config_of_a_vitkit_directory_is_read_without_its_weights(checkpoint, tmp_path):
    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "config.json").write_bytes((checkpoint / "config.json").read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError):  # the weights cannot be read ...
        vitkit.load(broken)
    config = source_config(str(broken), {"image_size": (16, 16), "ln_eps": 1e-12})  # ... and are not needed
    assert (config.dim, config.depth, config.num_classes, config.ln_eps) == (16, 1, 10, 1e-12)
    assert config.image_size == (8, 8)  # image_size is surgery on a built model: the file's own size
    assert source_config("ViT-Ti/16", {"num_classes": 7}).num_classes == 7  # a variant's name


def test_evaluate_dataset_counts_what_the_model_predicts(checkpoint, tmp_path):
    model, device, dtype = load_inference(str(checkpoint), device="cpu")
    done = vitkit.evaluate_dataset(model, "digits", resize="stretch", out=tmp_path, device=device, dtype=dtype,
                                   source="tiny")
    test = load_dataset("digits", "test")  # 8 x 8 grey digits: at the model's size, only normalised
    pixels = torch.stack([image for image, _ in test]).float() / 255
    labels = torch.tensor([label for _, label in test])
    mean, std = model.config.input_statistics
    with torch.no_grad():  # the reference: one batch, normalised by hand, counted without a loader
        logits = model((pixels - mean[0]) / std[0])
    assert (done.split, done.whole, done.report["images"]) == ("test", False, len(test))
    assert done.report["top1"] == pytest.approx(float((logits.argmax(dim=1) == labels).float().mean()))
    assert json.loads((tmp_path / "eval-test.json").read_text())["top1"] == done.report["top1"]
    other = vitkit.create_model(vitkit.ViTConfig(**{**TINY, "num_classes": 3}))
    with pytest.raises(ConfigError, match="tiny predicts 3 classes but digits has 10"):
        vitkit.evaluate_dataset(other, "digits", source="tiny")


def test_probe_dataset_draws_support_and_query_apart_from_one_split(checkpoint):
    model, device, dtype = load_inference(str(checkpoint), device="cpu")
    done = vitkit.probe_dataset(model, "digits", "train", shots=[2], seeds=1, device=device, dtype=dtype)
    drawn = done.drawn
    assert (drawn.shots, drawn.per_class) == ([2], 12)  # 2 shots and 10 to choose the regulariser
    assert len(drawn.support) == 12 * 10 and not set(drawn.support) & set(drawn.query)
    assert len(drawn.support) + len(drawn.query) == len(load_dataset("digits", "train", spec=SplitSpec(0.0)))
    assert [result.shots for result in done.fewshot] == [2] and done.written is None


def test_probe_dataset_writes_its_report(checkpoint, tmp_path):
    model, device, dtype = load_inference(str(checkpoint), device="cpu")
    done = vitkit.probe_dataset(model, "digits", shots=[1], seeds=2, knn=[3], device=device, dtype=dtype,
                                source="tiny", out=tmp_path)
    written = json.loads(done.written.read_text())
    assert done.drawn is None  # test is measured; the support comes from train
    assert written["checkpoint"] == "tiny" and written["split"] == "test"
    assert written["fewshot"]["1"]["mean"] == done.fewshot[0].mean and len(written["fewshot"]["1"]["per_seed"]) == 2
    assert [entry["k"] for entry in written["knn"]["results"]] == [3]


def test_recorded_data_reads_the_run_beside_a_checkpoint(checkpoint, tmp_path, caplog):
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps(Recipe(data=Data(dataset="mnist", data_dir="somewhere",
                                                                 val_fraction=0.25)).to_dict()))
    with caplog.at_level("INFO", logger="vitkit"):
        found = recorded_data(run / "model")
    assert (found.run_dir, found.dataset, found.data_dir, found.val_fraction) == (run, "mnist", "somewhere", 0.25)
    assert f"dataset mnist, as recorded by the run in {run}" in caplog.text
    with pytest.raises(ConfigError, match="no run beside it records the dataset"):
        recorded_data(checkpoint)


def test_bench_checkpoint_writes_the_rows_it_returns(checkpoint, tmp_path):
    done = vitkit.bench_checkpoint(str(checkpoint), batch_size=2, device="cpu", runtimes=["eager"],
                                   precisions=["fp32"], repeats=1, peak_size=32, out=tmp_path)
    assert done.image_size == (8, 8) and {(row.runtime, row.precision) for row in done.rows} == {("eager", "fp32")}
    assert json.loads((tmp_path / "bench.json").read_text()) == json.loads(json.dumps(done.record()))
