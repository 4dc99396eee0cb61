"""A short real-data run: MNIST from ../shared/data must learn (well above the 10% of chance)."""

import json

import pytest

from vitkit.cli import main


@pytest.mark.slow
def test_short_mnist_run_learns(shared_data, tmp_path, capsys):
    code = main(["train", "--preset", "mnist", "--data-dir", str(shared_data), "--train-subset", "6000",
                 "--steps", "500", "--batch-size", "64", "--warmup-steps", "20", "--lr", "0.003",
                 "--model-args", '{"patch_size": 7, "dim": 48, "depth": 2, "num_heads": 3, "mlp_dim": 96}',
                 "--val-fraction", "0.02", "--threads", "1", "--run-dir", str(tmp_path), "--log-every", "50"])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["test/images"] == 10000
    assert summary["test/accuracy"] > 0.6, summary  # chance is 0.1; the full run reaches 98.6%
    assert "test accuracy:" in capsys.readouterr().out
