"""`make gpu-check`'s script (benchmarks/gpu_check.py) on the CPU: the dry run writes every section of its report,
the goals are judged from bench rows as a hand computation says, and a missing GPU or dataset is one line."""

import importlib.util
from pathlib import Path

import pytest

from vitkit.benchmark import Row

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(runtime, phase, images_per_s, fraction=0.5):
    return Row(runtime, "bf16", phase, 64, images_per_s, 1.0, 2.0, fraction, None, 64 / images_per_s)


def test_the_goals_are_judged_from_the_rows(gpu_check):
    rows = [_row("compile", "train_step", 1100.0, fraction=0.46), _row("timm-compile", "train_step", 1000.0),
            _row("eager", "train_step", 900.0, fraction=0.40), _row("timm", "train_step", 1000.0),
            _row("eager", "inference", 3000.0), _row("compile", "inference", 3500.0), _row("timm", "inference", 3000.0)]
    assert [(figure, met) for _, figure, met in gpu_check.goals(rows)] == [("1.10x", True), ("46%", True),
                                                                          ("1.17x", False)]  # 3500 / 3000
    assert [met for *_, met in gpu_check.goals(rows[2:4])] == [False, False, None]  # eager 0.9x; no inference rows


def test_the_dry_run_writes_every_section(gpu_check, tmp_path, capsys):
    out = tmp_path / "gpu.md"
    assert gpu_check.main(["--device", "cpu", "--dry-run", "--data", "digits", "--out", str(out)]) == 0
    text = out.read_text()
    collected = int(text.split("tests collected")[0].split()[-1].split("/")[0])
    assert collected >= 8, text
    for needed in ("# GPU check (dry run)", "| eager | fp32 | inference |", "| timm | fp32 | train_step |",
                   "peak fp32:", "| bf16 training MFU", "| test accuracy |", "| steps | 3 |"):
        assert needed in text, needed


def test_no_gpu_or_no_dataset_is_one_line(gpu_check, tmp_path, capsys):
    import torch

    if not torch.cuda.is_available():
        assert gpu_check.main(["--out", str(tmp_path / "gpu.md")]) == 1
        assert "--device cuda: no CUDA GPU is available" in capsys.readouterr().err
    assert gpu_check.main(["--device", "cpu", "--data", str(tmp_path / "none.npz")]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "none.npz: no such file" in error and "make gpu-data" in error
    assert not (tmp_path / "gpu.md").exists()
