"""`vitkit transfer --zeroshot`: a zero-shot row per task, each cell the top-1 that `vitkit zeroshot --dataset` gives
on the task's test split by the dataset's class names and the default templates (itself checked against
open_clip's own zero-shot classifier in test_zeroshot.py), beside the fine-tuned row or, with --no-finetune,
alone; a checkpoint without a text tower is refused before any task trains."""

import json

import pytest

import test_zeroshot
from test_transfer import tiny_checkpoint
from vitkit.cli import main
from vitkit.transfer import run_transfer

pytest.importorskip("open_clip")
open_clip_hub = test_zeroshot.open_clip_hub  # a tiny CLIP as open_clip's hub folder, as a fixture here too
CIFAR = "cifar10-subset/cifar10_subset.npz"
RECIPE = {"schedule.steps": 3, "run.threads": 1, "schedule.batch_size": 16, "run.eval_batch_size": 64}


def zeroshot_top1(capsys, checkpoint, dataset, data_dir=None):
    argv = ["zeroshot", str(checkpoint), "--dataset", dataset, "--split", "test", "--json"]
    assert main(argv + (["--data-dir", str(data_dir)] if data_dir else [])) == 0
    report = json.loads(capsys.readouterr().out)
    return report["top1"], report["images"]


def test_the_zeroshot_row_beside_the_fine_tuned_row(open_clip_hub, shared_data, tmp_path, capsys):
    """CIFAR-10's subset fine-tuned (3 steps a run) and classified zero-shot by its class names; run again, the
    finished task's line says both numbers."""
    checkpoint = open_clip_hub[2]
    lines = []
    report = run_transfer(str(checkpoint), ["cifar10"], shared_data, tmp_path / "suite", budget="small",
                          recipe=RECIPE, zeroshot=True, say=lines.append)
    top1, images = zeroshot_top1(capsys, checkpoint, f"npz:{shared_data / CIFAR}")
    assert images == 1017 and report["tasks"]["cifar10"]["zeroshot"]["images"] == images
    assert list(report["rows"]) == ["fine-tuned", "zero-shot"] and report["zeroshot"] is True
    assert report["rows"]["zero-shot"] == {"cifar10": top1}
    tuned = report["rows"]["fine-tuned"]["cifar10"]
    table = (tmp_path / "suite" / "transfer.md").read_text().splitlines()
    assert f"| zero-shot | {100 * top1:.2f} |" in table and f"| fine-tuned | {100 * tuned:.2f} |" in table
    said = f"top-1 {100 * tuned:.2f}%, zero-shot top-1 {100 * top1:.2f}% on test (1017 images)"
    assert any(f"cifar10: {said}" in line for line in lines), "\n".join(lines)
    again = []
    run_transfer(str(checkpoint), ["cifar10"], shared_data, tmp_path / "suite", budget="small", recipe=RECIPE,
                 zeroshot=True, say=again.append)
    assert any(f"cifar10: finished earlier, {100 * tuned:.2f}%, zero-shot {100 * top1:.2f}%" in line
               for line in again), again


def test_no_finetune_gives_the_zeroshot_row_alone(open_clip_hub, tmp_path, capsys):
    """The built-in digits task through the command line: its ten class names '0' to '9', its test split."""
    checkpoint = open_clip_hub[2]
    assert main(["transfer", str(checkpoint), "--suite", "digits", "--data-dir", str(tmp_path), "--zeroshot",
                 "--no-finetune", "--out", str(tmp_path / "suite")]) == 0
    printed = capsys.readouterr().out
    top1, images = zeroshot_top1(capsys, checkpoint, "digits")
    report = json.loads((tmp_path / "suite" / "transfer.json").read_text())
    assert report["rows"] == {"zero-shot": {"digits": top1}} and report["tasks"]["digits"]["zeroshot"]["images"] == 359
    assert f"digits: zero-shot top-1 {100 * top1:.2f}% on test ({images} images)" in printed
    assert f"| zero-shot | {100 * top1:.2f} |" in printed


def test_a_checkpoint_without_a_text_tower_is_refused_before_any_task(tmp_path, capsys):
    checkpoint = tiny_checkpoint(tmp_path)
    code = main(["transfer", checkpoint, "--suite", "digits", "--data-dir", str(tmp_path), "--zeroshot",
                 "--out", str(tmp_path / "suite")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "no text tower vitkit reads" in err and "CLIPModel" in err
    assert not (tmp_path / "suite").exists()
