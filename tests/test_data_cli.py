"""`vitkit data info|verify|convert` on a real MNIST folder with one broken file."""

import collections
import json
import os
import signal
import subprocess
import tarfile
import time

import torchvision
from data_helpers import mnist_folder, numbered_image, png
from launch import VITKIT, child_env

from vitkit.cli import main
from vitkit.data import load_splits


def test_info_verify_and_convert(tmp_path, shared_data, capsys):
    folder = mnist_folder(shared_data, tmp_path / "folder", train=50, test=20, fmt="jpg")
    broken = folder / "test" / "7" / "00000.jpg"
    broken.write_bytes(broken.read_bytes()[:100])

    assert main(["data", "verify", f"imagefolder:{folder}", "--num-workers", "2"]) == 1
    assert capsys.readouterr().out.split() == [str(broken)]

    assert main(["data", "info", f"imagefolder:{folder}", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {name: split["images"] for name, split in info["splits"].items()} == {"train": 45, "val": 5, "test": 20}
    labels = torchvision.datasets.MNIST(shared_data, train=False).targets[:20].tolist()
    assert info["splits"]["test"]["per_class"] == {str(d): n for d, n in sorted(collections.Counter(labels).items())}

    assert main(["data", "convert", f"imagefolder:{folder}", str(tmp_path / "shards")]) == 1  # the broken file
    assert str(broken) in capsys.readouterr().err and not (tmp_path / "shards").exists()
    broken.unlink()
    assert main(["data", "convert", f"imagefolder:{folder}", str(tmp_path / "shards"), "--shard-size", "8kB"]) == 0
    capsys.readouterr()
    assert main(["data", "info", f"webdataset:{tmp_path / 'shards'}", "--json"]) == 0
    converted = json.loads(capsys.readouterr().out)
    assert {name: split["images"] for name, split in converted["splits"].items()} == {"train": 45, "val": 5,
                                                                                      "test": 19}
    assert converted["splits"]["train"]["shards"] > 1
    # one header a member to read, not two (webdataset's writer adds a pax header for a fractional time)
    for shard in (tmp_path / "shards").glob("*.tar"):
        with tarfile.open(shard) as tar:
            assert all(not member.pax_headers and member.mtime == int(member.mtime) for member in tar)
    assert main(["data", "convert", f"imagefolder:{folder}", str(tmp_path / "shards")]) == 1  # never overwritten


def linked_folder(root, per_class: int, classes: int = 4):
    """``root/<c>/NNNNN.png``: ``per_class`` hard links a class to one small PNG (quick to make, quick to read)."""
    for label in range(classes):
        (root / str(label)).mkdir(parents=True)
        (root / str(label) / "image.png").write_bytes(png(numbered_image(label)))
        for index in range(per_class - 1):
            os.link(root / str(label) / "image.png", root / str(label) / f"{index:05d}.png")
    return root


def test_a_killed_conversion_leaves_nothing_half_written(tmp_path):
    """SIGKILL in the middle of `vitkit data convert`: DST is absent, the re-run succeeds with every image,
    and removes the hidden folder the killed one left; an existing DST is refused, never clobbered."""
    folder = linked_folder(tmp_path / "folder", per_class=1000)
    dst = tmp_path / "shards"
    command = ["data", "convert", f"imagefolder:{folder}", str(dst), "--shard-size", "8kB"]
    env = child_env()
    process = subprocess.Popen([*VITKIT, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def staged():
        return [entry for entry in tmp_path.iterdir() if entry.name.startswith(".shards.")]
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline and \
            not any(len(list(entry.rglob("*.tar"))) >= 5 for entry in staged()):
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "killed mid-way, not after the end"
    assert not dst.exists() and len(staged()) == 1

    assert main(command) == 0
    assert staged() == []
    splits = load_splits(f"webdataset:{dst}", ("train", "val", "test"))
    assert sum(len(split) for split in splits.values()) == 4000
    assert sum((split.class_counts for split in splits.values()), collections.Counter()) == {c: 1000 for c in range(4)}

    before = {path.name: path.read_bytes() for path in dst.iterdir()}
    assert main(command) == 1
    assert {path.name: path.read_bytes() for path in dst.iterdir()} == before and staged() == []
