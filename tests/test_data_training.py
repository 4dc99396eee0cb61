"""Training from files as a user would: image folders with unreadable files, WebDataset shards with
workers, under torchrun, killed and resumed."""

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch
from data_helpers import mnist_folder, numbered_shards
from launch import VITKIT, VITKIT_TORCHRUN, child_env, launch
from safetensors.torch import load_file

from vitkit.data import load_dataset
from vitkit.data.convert import write_webdataset
from vitkit.train import Recipe
from vitkit.train.run import run

TINY = {"patch_size": 2, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, "in_chans": 3, "dropout": 0.1}
ARGS = ["train", "--image-size", "4", "--model-args", json.dumps(TINY), "--batch-size", "8", "--lr", "0.01",
        "--transform", "pretrain", "--crop-scale", "0.5", "1.0", "--aug-level", "light1", "--threads", "1",
        "--log-every", "1"]


def _weights(run_dir):
    return load_file(run_dir / "model" / "model.safetensors")


@pytest.fixture
def shards(tmp_path):
    root = tmp_path / "shards"
    numbered_shards(root, "train", [13, 9, 11, 7, 10])
    numbered_shards(root, "test", [5, 9, 2], start=1000)
    return root


def test_mnist_learns_from_a_folder_and_from_its_shards(tmp_path, shared_data):
    """A tiny ViT trained on 2,000 real MNIST images reaches the same kind of accuracy whether it reads the
    image folder or the shards converted from it: labels survive the conversion."""
    folder = mnist_folder(shared_data, tmp_path / "folder", train=2000, test=300)
    splits = {split: load_dataset(f"imagefolder:{folder}", split) for split in ("train", "val", "test")}
    write_webdataset(splits, tmp_path / "shards", 40_000)
    model = {"patch_size": 7, "dim": 64, "depth": 2, "num_heads": 4, "mlp_dim": 128, "in_chans": 1, "pool": "gap"}
    accuracy = {}
    for source in (f"imagefolder:{folder}", f"webdataset:{tmp_path / 'shards'}"):
        recipe = Recipe(model=dict(image_size=28, args=model), data=dict(dataset=source),
                        augment=dict(transform="eval"), schedule=dict(steps=250, batch_size=32, warmup_steps=20),
                        optim=dict(lr=2e-3),
                        run=dict(threads=1, log_every=50, dir=str(tmp_path / source.split(":")[0])))
        summary = run(recipe)
        assert summary["test/images"] == 300
        saved = json.loads((tmp_path / source.split(":")[0] / "recipe.json").read_text())
        assert saved["data"]["num_workers"] == min(8, os.cpu_count()), "file-backed data: decoding workers by default"
        accuracy[source] = summary["test/accuracy"]
    assert min(accuracy.values()) > 0.6, accuracy  # chance: 0.1


def test_unreadable_files_are_replaced_and_reported(tmp_path, shared_data):
    folder = mnist_folder(shared_data, tmp_path / "folder", train=60, test=20)
    broken = folder / "train" / "3" / "00007.png"
    broken.write_bytes(broken.read_bytes()[:40])
    data = dict(dataset=f"imagefolder:{folder}", val_fraction=0.0, num_workers=2)
    common = dict(model=dict(image_size=28, args={"patch_size": 7, "dim": 16, "depth": 1, "num_heads": 2,
                                                  "mlp_dim": 32, "in_chans": 1}),
                  schedule=dict(steps=8, batch_size=30))
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="00007.png: not a readable image"):
        run(Recipe(**common, data=data, run=dict(threads=1, log_every=1, dir=str(tmp_path / "fail"))))
    assert set(multiprocessing.active_children()) == before  # the failed run's workers stopped with it
    summary = run(Recipe(**common, data={**data, "corrupt": "skip"},
                         run=dict(threads=1, log_every=1, dir=str(tmp_path / "skip"))))
    assert set(multiprocessing.active_children()) == before  # and so did those of the run that ended
    assert summary["data/skipped"] == 4 and set(summary["data/skipped_files"]) == {str(broken)}  # once per epoch
    records = [json.loads(line) for line in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("data/skipped", 0) for r in records) == 4


def test_shards_under_torchrun_count_every_test_image_once_and_resume_exactly(tmp_path, shards):
    """Two ranks x two workers read the 5 training shards; the test shards (5 + 9 + 2 images) are counted
    once each; a run continued from its middle checkpoint ends with the same weights."""
    extra = ["--dataset", f"webdataset:{shards}", "--steps", "6", "--checkpoint-every", "3", "--num-workers", "2"]
    stdout = launch(VITKIT_TORCHRUN, *ARGS, *extra, "--run-dir", tmp_path / "ddp")
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["test/images"] == 16 and "(16 images)" in stdout

    resumed = tmp_path / "resumed"  # as if stopped right after the middle checkpoint
    shutil.copytree(tmp_path / "ddp", resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000006")
    shutil.rmtree(resumed / "model")
    launch(VITKIT_TORCHRUN, *ARGS, *extra, "--run-dir", resumed, "--resume")
    straight, continued = _weights(tmp_path / "ddp"), _weights(resumed)
    assert all(torch.equal(continued[key], straight[key]) for key in straight)


def test_killed_run_on_shards_resumes_to_the_same_weights(tmp_path, shards):
    """kill -9 in the middle of a run with two decoding workers, then --resume: the weights at the end
    are the uninterrupted run's, bit for bit."""
    extra = ["--dataset", f"webdataset:{shards}", "--steps", "120", "--checkpoint-every", "10", "--num-workers", "2"]
    launch(VITKIT, *ARGS, *extra, "--run-dir", tmp_path / "straight")

    killed = tmp_path / "killed"
    env = child_env()
    process = subprocess.Popen([*VITKIT, *ARGS, *extra, "--run-dir", str(killed)], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (killed / "checkpoints" / "step-00000010").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)  # the run and its DataLoader workers
    process.wait()
    assert process.returncode == -signal.SIGKILL and not (killed / "model").exists(), "killed before the end"
    launch(VITKIT, *ARGS, *extra, "--run-dir", killed, "--resume")
    straight, resumed = _weights(tmp_path / "straight"), _weights(killed)
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)


@pytest.mark.parametrize("layout, final, images", [
    ("flat", "test", 4),  # test and val held out of the whole: 4 of 16, then 3 of the 12 left
    ("train", "val", 4),  # val held out of train/; no test split: the final numbers are val's
    ("train+val", "val", 6),  # ImageNet's layout: validation and final numbers on val/
    ("train+val+test", "test", 2),
    ("train+val, no hold-out", "val", 6),  # val_fraction 0 holds nothing out; val/ is still there
])
def test_every_folder_layout_trains_and_names_the_split_of_its_final_numbers(tmp_path, capsys, layout, final,
                                                                           images):
    from PIL import Image

    from vitkit.cli import main
    sizes = {"flat": {"": 8}, "train": {"train": 8}, "train+val": {"train": 8, "val": 3},
             "train+val+test": {"train": 8, "val": 3, "test": 1}, "train+val, no hold-out": {"train": 8, "val": 3}}
    for split, per_class in sizes[layout].items():
        for label in ("cat", "dog"):
            (tmp_path / "data" / split / label).mkdir(parents=True)
            for index in range(per_class):
                Image.new("RGB", (4, 4), (index * 20, 200 * (label == "cat"), 0)).save(
                    tmp_path / "data" / split / label / f"{index}.png")
    val_fraction = "0" if "no hold-out" in layout else "0.25"
    code = main([*ARGS, "--dataset", f"imagefolder:{tmp_path / 'data'}", "--steps", "2", "--batch-size", "4",
                 "--num-workers", "0", "--val-fraction", val_fraction, "--run-dir", str(tmp_path / "run")])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert code == 0 and summary["test/split"] == final and summary["test/images"] == images
    assert "val/accuracy" in summary  # validated during training
    assert f"{final} accuracy: " in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / f"eval-{final}.json").read_text())["images"] == images
