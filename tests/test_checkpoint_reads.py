"""Reading a checkpoint opens each of its files once, whatever its format: counted by the kernel (inotify),
so a second parse of config.json or a second pass over a weights file shows up wherever it is added; and a
bare state dict's keys are scanned for unsupported families once."""

import ctypes
import json
import os
import struct
import sys
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.checkpoints import export, inference
from vitkit.models import Provenance

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="counts opens with Linux's inotify")

IN_OPEN, IN_CLOSE = 0x20, 0x08 | 0x10  # closes too, so that successive opens of a file are not coalesced
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows


@contextmanager
def opens(directory):
    """A Counter of the files in ``directory`` opened (by any code: Python, C++, Rust) inside the block."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0 and libc.inotify_add_watch(fd, str(directory).encode(), IN_OPEN | IN_CLOSE) >= 0, os.strerror(
        ctypes.get_errno())
    counts = Counter()
    try:
        yield counts
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            data = b""
        offset = 0
        while offset < len(data):
            _, mask, _, length = _EVENT.unpack_from(data, offset)
            name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0").decode()
            offset += _EVENT.size + length
            if mask & IN_OPEN and name:  # nameless events are the directory itself being listed
                counts[name] += 1
    finally:
        os.close(fd)


def tiny(**options):
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1, num_classes=3, **options)
    model.config = model.config.replace(provenance=Provenance(normalization="imagenet"))
    return model.eval()


def timm_hub_directory(tmp_path):
    directory = tmp_path / "timm"
    directory.mkdir()
    export(tiny(), directory / "model.safetensors", "timm")
    (directory / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch16_224", "num_classes": 3,
        "pretrained_cfg": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}))
    return directory


def bare_timm_pth(tmp_path):
    export(tiny(), tmp_path / "timm.safetensors", "timm")
    (tmp_path / "bare").mkdir()
    torch.save(load_file(tmp_path / "timm.safetensors"), tmp_path / "bare" / "timm.pth")
    return tmp_path / "bare" / "timm.pth"


def written(to, **options):
    def write(tmp_path):
        name = "m.npz" if to == "npz" else to
        path = tmp_path / "out" / name
        path.parent.mkdir()
        export(tiny(**options), path, to)
        return path
    return write


CHECKPOINTS = {  # each checkpoint's files, all read by vitkit.load
    "native": (written("native"), ["config.json", "model.safetensors"]),
    "hf": (written("hf"), ["config.json", "preprocessor_config.json", "model.safetensors"]),
    "hf-deit": (written("hf", dist_token=True), ["config.json", "preprocessor_config.json", "model.safetensors"]),
    "timm hub": (timm_hub_directory, ["config.json", "model.safetensors"]),
    "timm .pth": (bare_timm_pth, ["timm.pth"]),
    "npz": (written("npz", gelu="tanh"), ["m.npz"]),
}


@pytest.mark.parametrize("kind", CHECKPOINTS)
def test_each_file_of_a_checkpoint_is_opened_once(tmp_path, kind):
    make, files = CHECKPOINTS[kind]
    path = make(tmp_path)
    directory = path if path.is_dir() else path.parent
    with opens(directory) as counts:
        model = vitkit.load(path)
    assert counts == Counter(files), f"{kind}: files opened {dict(counts)}; expected each of {files} once"
    assert model.config.num_classes == 3  # it was really read


def test_a_bare_state_dict_is_scanned_for_unsupported_families_once(tmp_path, monkeypatch):
    class Counted:
        searches = 0

        def __init__(self, pattern):
            self.pattern = pattern

        def search(self, key):
            Counted.searches += 1
            return self.pattern.search(key)

    families = [(family, Counted(pattern)) for family, pattern in inference.UNSUPPORTED_FAMILIES]
    monkeypatch.setattr(inference, "UNSUPPORTED_FAMILIES", families)
    path = bare_timm_pth(tmp_path)
    keys = len(torch.load(path, weights_only=True))
    vitkit.load(path)
    assert Counted.searches == keys * len(families)
