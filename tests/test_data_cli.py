"""`vitkit data info|verify|convert` on a real MNIST folder with one broken file."""

import collections
import json

import torchvision

from data_helpers import mnist_folder

from vitkit.cli import main


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
    assert main(["data", "convert", f"imagefolder:{folder}", str(tmp_path / "shards")]) == 1  # never overwritten
