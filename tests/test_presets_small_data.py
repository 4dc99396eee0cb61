"""The small-data presets, mnist-fast and cifar10-small: each resolves to a recipe whose model builds, trains through
``vitkit train`` on the data at hand, and is the recipe that benchmarks/time_to_accuracy.py measured (its committed
results name the preset's step count and show it inside its budget)."""

import json
from pathlib import Path

import pytest
import torch

from vitkit.cli import main
from vitkit.models import ViTConfig, create_model
from vitkit.train import resolve
from vitkit.train.run import total_steps

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "time_to_accuracy.json"

# preset -> its data: training images (all of the training split: val_fraction 0), classes, input channels, and
# the benchmark scenario that measures it.
PRESETS = {
    "mnist-fast": dict(images=60_000, classes=10, channels=1, scenario="mnist"),
    "cifar10-small": dict(images=5_085, classes=10, channels=3, scenario="cifar"),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_resolves_to_a_model_that_builds(name):
    recipe, expected = resolve(name), PRESETS[name]
    assert recipe.data.val_fraction == 0  # every training image is trained on; the test split is the measure
    assert recipe.schedule.warmup_steps < total_steps(recipe, expected["images"])
    model = create_model(ViTConfig(), num_classes=expected["classes"], image_size=recipe.model.image_size,
                         **recipe.model.args)
    with torch.no_grad():
        logits = model.eval()(torch.randn(2, expected["channels"], *model.config.image_size))
    assert logits.shape == (2, expected["classes"])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_benchmark_measured_this_preset_inside_its_budget(name):
    """A preset changed without a new measurement fails here: the committed record's vitkit run took the preset's
    steps, and ended (data, training and the final test pass) inside the scenario's budget."""
    expected = PRESETS[name]
    record = json.loads(RESULTS.read_text())
    result = next(result for result in record["results"] if result["scenario"] == expected["scenario"])
    mine = result["sides"][0]
    assert mine["label"] == f"vitkit `--preset {name}`"
    assert mine["steps"] == total_steps(resolve(name), expected["images"])
    assert result["train_images"] == expected["images"]
    assert mine["final"]["seconds"] <= result["budget_s"]


@pytest.mark.parametrize("name,dataset", [("mnist-fast", "mnist"), ("cifar10-small", "npz")])
def test_preset_trains_through_the_command_line(shared_data, tmp_path, name, dataset):
    data = ["--data-dir", str(shared_data)] if dataset == "mnist" else \
        ["--dataset", f"npz:{shared_data / 'cifar10-subset' / 'cifar10_subset.npz'}"]
    code = main(["train", "--preset", name, *data, "--train-subset", "512", "--steps", "3", "--threads", "1",
                 "--run-dir", str(tmp_path / "run"), "--log-every", "1"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["test/split"] == "test"
