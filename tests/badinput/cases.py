"""Bad and odd inputs a careless or hostile user could give vitkit, each with the error it must get.

A case builds its input under a scratch folder (binary inputs are generated here, none is committed)
and returns the command line to run; ``code`` is the expected exit status (2: the command line or
recipe cannot work, 1: a file or the machine failed) and ``says`` a fragment the one-line message must
hold. ``{tmp}`` in ``says`` stands for the scratch folder.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

from vitkit import ViTConfig, VisionTransformer

TINY = {"patch_size": 2, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, "in_chans": 1, "pool": "gap"}
TRAIN = ["train", "--model-args", json.dumps(TINY), "--steps", "2", "--batch-size", "16", "--threads", "1"]


@dataclass
class Case:
    name: str
    build: Callable[[Path], list[str]]
    code: int
    says: str
    needs_run: bool = False  # the test puts a finished tiny run in {tmp}/run first


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def model_dir(tmp: Path, channels: int = 1) -> Path:
    """A real tiny checkpoint (8x8 px) to point commands at."""
    path = tmp / "ckpt"
    if not path.exists():
        VisionTransformer(ViTConfig(image_size=8, num_classes=3, **{**TINY, "in_chans": channels})).save(path)
    return path


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width x height`` pixels: a decompression bomb's signature."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


def npz_claiming(count: int) -> bytes:
    """An .npz whose one member's header claims ``count`` float32 values, with 16 bytes of data."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": (count,)})
    member.write(b"\0" * 16)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("embedding/kernel.npy", member.getvalue())
    return archive.getvalue()


def npz_lying_about_its_size() -> bytes:
    """An .npz whose member claims 10^9 floats in its .npy header and, to match, ~4 GB in the zip's own
    size fields (local header and central directory), while it stores 16 bytes."""
    archive = npz_claiming(10**9)
    size = struct.pack("<I", 0xFFFFFF00)
    local, central = archive.index(b"PK\x03\x04"), archive.index(b"PK\x01\x02")
    archive = archive[:local + 22] + size + archive[local + 26:]
    return archive[:central + 24] + size + archive[central + 28:]


def npz_of(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def torch_bytes(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


class Payload:
    """Unpickling this would run code: it must never be."""

    def __reduce__(self):
        return (os.system, (f"touch {PWNED}",))


PWNED = "/tmp/vitkit-badinput-pwned"


def image_folder(tmp: Path, **files: bytes) -> str:
    for name, data in files.items():
        write(tmp / "folder" / name.replace("__", "/"), data)
    return f"imagefolder:{tmp / 'folder'}"


def png(size=(8, 8), mode="L") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, 100).save(buffer, "PNG")
    return buffer.getvalue()


def symlink_loop(tmp: Path) -> Path:
    folder = tmp / "loop"
    folder.mkdir()
    os.symlink(folder, folder / "again")
    os.symlink(folder / "self", folder / "self")
    return folder


RANDOM = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()


def config(name: str, content: str | bytes) -> Callable[[Path], list[str]]:
    """Train with a recipe file ``name`` holding ``content``."""
    return lambda tmp: [*TRAIN, "--config", str(write(tmp / name, content))]


def resume(damage: Callable[[Path], object]) -> Callable[[Path], list[str]]:
    """Damage the finished run in ``{tmp}/run`` (given the last checkpoint's training state), then resume it."""
    def build(tmp: Path) -> list[str]:
        run = tmp / "run"
        damage(sorted((run / "checkpoints").glob("step-*"))[-1] / "training_state.pt")
        return ["train", "--resume", "--run-dir", str(run)]
    return build


def replace_by_file(path: Path) -> None:
    import shutil

    shutil.rmtree(path)
    write(path, "x")

CASES = [
    # ---------------------------------------------------------------- flags and recipe fields
    Case("batch size 0", lambda t: [*TRAIN, "--batch-size", "0"], 2,
         "schedule.batch_size: expected an int >= 1, got '0'"),
    Case("negative steps", lambda t: [*TRAIN, "--steps", "-1"], 2, "schedule.steps: expected an int >= 0, got '-1'"),
    Case("NaN learning rate", lambda t: [*TRAIN, "--lr", "nan"], 2,
         "optim.lr: expected a finite number >= 0, got 'nan'"),
    Case("infinite weight decay", lambda t: [*TRAIN, "--weight-decay", "inf"], 2,
         "optim.weight_decay: expected a finite number >= 0, got 'inf'"),
    Case("word for a number", lambda t: [*TRAIN, "--lr", "fast"], 2,
         "argument --lr: optim.lr: expected a number >= 0, got 'fast'"),
    Case("unknown optimizer", lambda t: [*TRAIN, "--optimizer", "adam"], 2,
         "optim.optimizer: expected one of ['adamw', 'sgd'], got 'adam'"),
    Case("label smoothing 1", lambda t: [*TRAIN, "--label-smoothing", "1"], 2,
         "objective.label_smoothing: expected a number in [0, 1), got '1'"),
    Case("EMA decay above 1", lambda t: [*TRAIN, "--ema-decay", "1.5"], 2,
         "optim.ema_decay: expected a number in [0, 1), got '1.5'"),
    Case("crop scale reversed", lambda t: [*TRAIN, "--crop-scale", "0.9", "0.1"], 2,
         "augment.crop_scale: expected two numbers 0 < low <= high <= 1, got [0.9, 0.1]"),
    Case("batch not a multiple of accumulation", lambda t: [*TRAIN, "--batch-size", "10", "--accum-steps", "3"],
         2, "schedule.batch_size: expected a multiple of schedule.accum_steps=3, got 10"),
    Case("batch larger than the data", lambda t: [*TRAIN, "--batch-size", "100000"], 2,
         "smaller than the global batch 100000"),
    Case("model args a list", lambda t: [*TRAIN, "--model-args", "[1, 2]"], 2, "expected a JSON object"),
    Case("model args not JSON", lambda t: [*TRAIN, "--model-args", "{depth: 2"], 2, "not valid JSON"),
    Case("model args unknown key", lambda t: [*TRAIN, "--model-args", '{"depht": 2}'], 2,
         "model.args.depht: unknown key; did you mean model.args.depth?"),
    Case("model args image_size", lambda t: [*TRAIN, "--model-args", '{"image_size": 8}'], 2,
         "model.args.image_size: unknown key; did you mean model.image_size"),
    Case("model args negative dim", lambda t: [*TRAIN, "--model-args", json.dumps({**TINY, "dim": -8})], 2,
         "ViTConfig: dim: expected an int >= 1, got -8"),
    Case("model args zero heads", lambda t: [*TRAIN, "--model-args", json.dumps({**TINY, "num_heads": 0})], 2,
         "ViTConfig: num_heads: expected an int >= 1, got 0"),
    Case("model args string dim", lambda t: [*TRAIN, "--model-args", json.dumps({**TINY, "dim": "wide"})], 2,
         "ViTConfig: dim: expected an int >= 1, got 'wide'"),
    Case("unknown model name", lambda t: [*TRAIN, "--model", "ViT-Q/16"], 2, "unknown model 'ViT-Q/16'"),
    Case("unknown model in the table", lambda t: ["models", "ViT-Q/16"], 2, "unknown model 'ViT-Q/16'"),
    Case("image size 0", lambda t: [*TRAIN, "--image-size", "0"], 2, "--image-size: model.image_size: expected a "
         "size such as 224, 384x512 (height x width) or [384, 512], with sides >= 1, or null (the data's), got '0'"),
    Case("image size 8x0", lambda t: [*TRAIN, "--image-size", "8x0"], 2,
         "with sides >= 1, or null (the data's), got '8x0'"),
    Case("image size not a multiple of the patch", lambda t: [*TRAIN, "--image-size", "7"], 2,
         "image_size: expected sides that are multiples of patch_size=2, got (7, 7)"),
    Case("validation fraction 1", lambda t: [*TRAIN, "--val-fraction", "1"], 2,
         "data.val_fraction: expected a number in [0, 1), got '1'"),
    Case("keep last -1", lambda t: [*TRAIN, "--keep-last", "-1"], 2, "run.keep_last: expected an int >= 0, got '-1'"),
    Case("negative workers", lambda t: [*TRAIN, "--num-workers", "-2"], 2,
         "data.num_workers: expected an int >= -1, got '-2'"),
    Case("negative threads", lambda t: [*TRAIN, "--threads", "-1"], 2,
         "run.threads: expected an int in [0, 1024], got '-1'"),
    Case("negative checkpoint minutes", lambda t: [*TRAIN, "--checkpoint-minutes", "-5"], 2,
         "run.checkpoint_minutes: expected a number >= 0, got '-5'"),
    Case("beta of 1", lambda t: [*TRAIN, "--betas", "0.9", "1.0"], 2,
         "argument --betas: optim.betas: expected a number in [0, 1), got '1.0'"),
    Case("masking probabilities over 1", lambda t: [*TRAIN, "--mpp-mask-prob", "0.8", "--mpp-random-prob", "0.5"], 2,
         "objective.mpp_random_prob: expected at most 1 - objective.mpp_mask_prob = 0.2, got 0.5"),
    Case("table at size 0", lambda t: ["models", "ViT-B/16", "--image-size", "0"], 2, "with sides >= 1, got '0'"),
    Case("table at size 3x", lambda t: ["models", "--image-size", "3x"], 2, "expected a size such as 224"),
    Case("override of a word", lambda t: ["info", str(model_dir(t)), "--set", "num_heads=many"], 1, "bad override"),
    Case("top-k -1", lambda t: ["predict", str(model_dir(t)), "x.png", "--top-k", "-1"], 2,
         "--top-k: expected an int >= 1, got '-1'"),
    Case("top-k 0", lambda t: ["predict", str(model_dir(t)), "x.png", "--top-k", "0"], 2, "--top-k"),
    Case("eval batch 0", lambda t: ["eval", str(model_dir(t)), "--batch-size", "0"], 2, "--batch-size"),
    Case("few-shot 0 shots", lambda t: ["fewshot", str(model_dir(t)), "--shots", "0"], 2, "--shots"),
    Case("k-NN 0 neighbours", lambda t: ["fewshot", str(model_dir(t)), "--knn", "0"], 2,
         "--knn: expected an int >= 1, got '0'"),
    Case("k-NN temperature 0", lambda t: ["fewshot", str(model_dir(t)), "--knn", "5", "--knn-temperature", "0"], 2,
         "--knn-temperature: expected a number > 0, got '0'"),
    Case("k-NN beyond the memory bank", lambda t: ["fewshot", str(model_dir(t)), "--dataset", "digits", "--shots", "2",
                                                   "--knn", "21"], 2,
         "k=21 neighbours, but the memory bank holds 20 training features"),
    Case("layer decay above 1", lambda t: [*TRAIN, "--layer-decay", "1.5"], 2,
         "optim.layer_decay: expected a number in (0, 1], or null (off), got '1.5'"),
    Case("layer decay 0", lambda t: [*TRAIN, "--layer-decay", "0"], 2,
         "optim.layer_decay: expected a number in (0, 1], or null (off), got '0'"),
    Case("layer decay while pre-training", lambda t: ["pretrain", *TRAIN[1:], "--layer-decay", "0.75"], 2,
         "optim.layer_decay: expected null with objective.kind='mpp'"),
    Case("discard ratio 1.5", lambda t: ["analyze", str(model_dir(t)), "--out", str(t), "--discard-ratio", "1.5"],
         2, "--discard-ratio: expected a number in [0, 1), got '1.5'"),
    Case("normalisation of 2 values", lambda t: ["analyze", str(model_dir(t, 3)), "--out", str(t / "o"), "--images",
                                                 str(write(t / "a.png", png())), "--mean", "0.1", "0.2"],
         2, "expected 1 or 3 values"),
    # ------------------------------------------------------------------------ recipe files
    Case("YAML malformed", config("r.yaml", "lr: [0.1\nsteps: 3"), 2, "r.yaml: not valid YAML"),
    Case("JSON malformed", config("r.json", '{"lr": 0.1,'), 2, "r.json: not valid JSON"),
    Case("YAML wrong type", config("r.yaml", "lr: fast"), 2,
         "r.yaml: optim.lr: expected a number >= 0, got 'fast'"),
    Case("YAML NaN", config("r.yaml", "lr: .nan"), 2, "r.yaml: optim.lr: expected a finite number >= 0, got nan"),
    Case("YAML float for an int", config("r.yaml", "warmup_steps: 2.5"), 2,
         "r.yaml: schedule.warmup_steps: expected an int >= 0, got 2.5"),
    Case("YAML number for a flag", config("r.yaml", "hflip: 2"), 2,
         "r.yaml: augment.hflip: expected true or false, got 2"),
    Case("YAML a list", config("r.yaml", "- lr\n- 3"), 2, "r.yaml: expected a mapping of recipe sections, got list"),
    Case("YAML misspelt key", config("r.yaml", "batchsize: 8"), 2,
         "r.yaml: batchsize: unknown key; did you mean schedule.batch_size"),
    Case("YAML unknown preset", config("r.yaml", "preset: imagenet"), 2, "unknown preset 'imagenet'"),
    Case("YAML model_args a string", config("r.yaml", "model_args: big"), 2,
         "r.yaml: model.args: expected a mapping (JSON object) of names to values, got 'big'"),
    Case("YAML of binary noise", config("r.yaml", RANDOM), 2, "r.yaml: not"),
    Case("recipe file missing", lambda t: [*TRAIN, "--config", str(t / "absent.yaml")], 1,
         "absent.yaml: No such file or directory"),
    Case("recipe file a folder", lambda t: [*TRAIN, "--config", str(t)], 1, "Is a directory"),
    # --------------------------------------------------------------------------- resuming
    Case("resume without run dir", lambda t: ["train", "--resume"], 2, "--resume needs --run-dir"),
    Case("resume, recipe.json malformed", lambda t: ["train", "--resume", "--run-dir", str(
        write(t / "r" / "recipe.json", "{'lr': 1}").parent)], 2, "recipe.json: not valid JSON"),
    Case("resume, recipe.json a list", lambda t: ["train", "--resume", "--run-dir", str(
        write(t / "r" / "recipe.json", "[1, 2]").parent)], 2, "recipe.json: expected a mapping"),
    Case("resume, recipe.json wrong value", lambda t: ["train", "--resume", "--run-dir", str(
        write(t / "r" / "recipe.json", '{"batch_size": -4}').parent)], 2,
         "recipe.json: schedule.batch_size: expected an int >= 1, got -4"),
    Case("resume, training state truncated", resume(lambda p: write(p, p.read_bytes()[: p.stat().st_size // 2])),
         1, "training_state.pt: not a valid .pt file (a damaged or truncated zip archive", needs_run=True),
    Case("resume, training state carries a pickle payload", resume(lambda p: write(p, torch_bytes(
        {"step": 2, "optimizer": {}, "best": None, "rng_cpu": Payload()}))), 1, "refusing to unpickle", needs_run=True),
    Case("resume, training state of text", resume(lambda p: write(p, "step = 2")), 1,
         "training_state.pt: not a valid .pt file (neither a torch.save zip archive nor a pickle stream)",
         needs_run=True),
    Case("resume with another model", lambda t: ["train", "--resume", "--run-dir", str(t / "run"), "--set",
                                                 "depth=2"], 2, "(depth: 1 in the checkpoint, 2 in the recipe)",
         needs_run=True),
    Case("resume, training state of other tensors", resume(lambda p: write(p, torch_bytes({"w": torch.zeros(3)}))),
         1, "not a vitkit training state (missing ['step', 'optimizer', 'best', 'rng_cpu'])", needs_run=True),
    Case("resume, checkpoints folder is a file", resume(lambda p: replace_by_file(p.parents[1])), 1,
         "checkpoints is a file; expected the run's checkpoint directory", needs_run=True),
    Case("resume, metrics.jsonl is a folder", resume(lambda p: (p.parents[2] / "metrics.jsonl").unlink() or
                                                     (p.parents[2] / "metrics.jsonl").mkdir()), 1,
         "metrics.jsonl is not a regular file", needs_run=True),
    Case("a new run over a finished one", lambda t: [*TRAIN, "--run-dir", str(t / "run")], 2,
         "already holds a run (checkpoints up to step-00000002); continue it with --resume", needs_run=True),
    Case("run dir is a file", lambda t: [*TRAIN, "--run-dir", str(write(t / "file", "x"))], 1, "File exists"),
    # ------------------------------------------------------------------------ checkpoint files
    Case("random bytes named .npz", lambda t: ["info", str(write(t / "w.npz", RANDOM))], 1,
         "w.npz: not a valid .npz file"),
    Case("text named .pth", lambda t: ["info", str(write(t / "w.pth", "hello, weights"))], 1,
         "w.pth: not a valid .pth file (neither a torch.save zip archive nor a pickle stream)"),
    Case("empty .pth", lambda t: ["info", str(write(t / "w.pth", b""))], 1,
         "w.pth: not a valid .pth file (the file is empty)"),
    Case("random bytes named .bin", lambda t: ["info", str(write(t / "w.bin", b"\x01" + RANDOM))], 1,
         "not a valid .bin file"),
    Case(".pth cut in half", lambda t: ["info", str(write(t / "w.pth", torch_bytes({"a": torch.zeros(64)})[:300]))],
         1, "damaged or truncated zip archive"),
    Case("zip without data.pkl named .pth", lambda t: ["info", str(write(t / "w.pth", npz_of(a=np.zeros(2))))], 1,
         "a zip archive without torch.save's data.pkl"),
    Case(".pth with a pickle payload", lambda t: ["info", str(write(t / "w.pth", torch_bytes({"x": Payload()})))],
         1, "refusing to unpickle"),
    Case("raw pickle named .bin", lambda t: ["info", str(write(t / "w.bin", pickle.dumps(Payload())))], 1,
         "refusing to unpickle"),
    Case(".npz claiming 10^12 floats", lambda t: ["info", str(write(t / "w.npz", npz_claiming(10**12)))], 1,
         "claims shape (1000000000000,) of float32 (4,000,000,000,000 bytes) but holds 16 bytes"),
    Case(".npz lying in its zip sizes too", lambda t: ["info", str(write(t / "w.npz", npz_lying_about_its_size()))],
         1, "claims shape (1000000000,) of float32 (4,000,000,000 bytes) but holds"),
    Case(".npz of Python objects", lambda t: ["info", str(write(t / "w.npz", npz_of(a=np.array([{}], object))))],
         1, "holds Python objects"),
    Case(".npz of text files", lambda t: ["info", str(write(t / "w.npz", _zip_of(notes="hello")))], 1,
         "member 'notes' is not a .npy array"),
    Case(".npz of integers", lambda t: ["info", str(write(t / "w.npz", npz_of(**{"embedding/kernel": np.ones(3, int)
                                                                                         })))],
         1, "expected floats"),
    Case(".safetensors of noise", lambda t: ["info", str(write(t / "w.safetensors", RANDOM))], 1,
         "corrupt or unreadable safetensors file"),
    Case("checkpoint directory that is a file", lambda t: ["info", str(write(t / "model", "not a directory"))], 1,
         "model: unknown weights file type (no suffix); expected a checkpoint directory"),
    Case("empty checkpoint directory", lambda t: ["info", str((t / "empty").mkdir() or t / "empty")], 1,
         "is not a checkpoint vitkit can read"),
    Case("config.json of noise", lambda t: ["info", str(_native_with(t, config=RANDOM[:64]))], 1,
         "config.json: not a valid vitkit config"),
    Case("model.safetensors truncated", lambda t: ["info", str(_native_with(t, weights=b"\x08\0\0\0\0\0\0\0{}"))], 1,
         "corrupt or unreadable safetensors file"),
    Case("checkpoint path a symlink loop", lambda t: ["info", str(symlink_loop(t) / "self")], 1, "self"),
    Case("missing checkpoint", lambda t: ["info", str(t / "nothing")], 1, "no checkpoint at"),
    # ------------------------------------------------------------------------------ images
    Case("0-byte image", lambda t: ["predict", str(model_dir(t)), str(write(t / "a.png", b""))], 1,
         "a.png: not a readable image"),
    Case("text named .png", lambda t: ["predict", str(model_dir(t)), str(write(t / "a.png", "hello"))], 1,
         "a.png: not a readable image"),
    Case("truncated PNG", lambda t: ["predict", str(model_dir(t)), str(write(t / "a.png", png((64, 64))[:60]))], 1,
         "a.png: not a readable image"),
    Case("decompression bomb to predict", lambda t: ["predict", str(model_dir(t)),
                                                     str(write(t / "b.png", png_claiming(100_000, 100_000)))], 1,
         "b.png: refusing to decode"),
    Case("decompression bomb to analyze", lambda t: ["analyze", str(model_dir(t)), "--out", str(t / "o"), "--images",
                                                     str(write(t / "b.png", png_claiming(30_000, 30_000)))], 1,
         "b.png: refusing to decode"),
    Case("a folder without images to predict", lambda t: ["predict", str(model_dir(t)), str(t)], 1,
         "no image files"),
    Case("analyze a symlink loop without images", lambda t: ["analyze", str(model_dir(t)), "--out", str(t / "o"),
                                                             "--images", str(symlink_loop(t))], 1, "no image files"),
    Case("analyze a missing image", lambda t: ["analyze", str(model_dir(t)), "--out", str(t / "o"), "--images",
                                               str(t / "gone.png")], 1, "no image file or directory at"),
    # ---------------------------------------------------------------------------- datasets
    Case("0-byte image in a folder", lambda t: [*TRAIN, "--val-fraction", "0", "--dataset", image_folder(
        t, **{f"train__{c}__{i}.png": png() for c in "ab" for i in range(16)}, test__a__x=png(), test__b__z=b"")],
        1, "z: not a readable image"),  # decoded, and refused, when the test split is measured
    Case("class folder empty", lambda t: [*TRAIN, "--dataset", image_folder(t, a__x=png()) and
                                          f"imagefolder:{(t / 'folder' / 'b').mkdir() or t / 'folder'}"], 1,
         "class folder is empty"),
    Case("image folder that is a file", lambda t: [*TRAIN, "--dataset", f"imagefolder:{write(t / 'f', 'x')}"], 1,
         "no such image folder"),
    Case("colour images for a 2-channel model", lambda t: [
        "train", "--model-args", json.dumps({**TINY, "in_chans": 2}), *TRAIN[3:], "--dataset", image_folder(
            t, **{f"{c}__{i}.png": png(mode="RGB") for c in "ab" for i in range(20)})], 1,
         "cannot turn a 3-channel image into 2 channels"),
    Case("unknown dataset", lambda t: [*TRAIN, "--dataset", "imagenet-22k"], 2, "unknown dataset 'imagenet-22k'"),
    Case("data dir that is a file", lambda t: [*TRAIN, "--dataset", "mnist", "--data-dir", str(write(t / "d", "x"))],
         1, "mnist: not found under"),
    Case("colour image to a 2-channel model", lambda t: ["predict", str(model_dir(t, channels=2)), str(write(
        t / "c.png", png(mode="RGB")))], 1, "cannot turn a 3-channel image into 2 channels"),
    Case("HF export of an average-pooled model", lambda t: ["convert", str(model_dir(t)), str(t / "hf"), "--to",
                                                            "hf"], 2,
         "HF's ViT has no pool='gap'; write it as 'native'"),
    Case("int8 for a format that holds weights only", lambda t: ["convert", str(model_dir(t)), str(t / "m.safetensors"),
                                                                  "--quantize", "int8"], 2,
         "quantize='int8' applies to ONNX and OpenVINO exports, not to 'timm'"),
    Case("calibration without int8", lambda t: ["convert", str(model_dir(t)), str(t / "m.onnx"), "--calibration",
                                                "digits"], 2, "calibration images apply to int8 quantisation"),
    Case("calibration on a dataset of other classes", lambda t: [
        "convert", str(model_dir(t)), str(t / "m.onnx"), "--quantize", "int8", "--calibration", "digits"], 2,
         "--calibration digits (train split): 10 classes, but the model predicts 3"),
    Case("convert onto a folder of other files", lambda t: ["convert", str(model_dir(t)), str(write(
        t / "photos" / "cat.jpg", "x").parent)], 1, "does not look like a checkpoint directory"),
    Case("dataset .npz of noise", lambda t: [*TRAIN, "--dataset", f"npz:{write(t / 'd.npz', RANDOM)}"], 1,
         "d.npz: not a readable .npz file"),
    Case("dataset .npz without labels", lambda t: [*TRAIN, "--dataset", "npz:" + str(write(
        t / "d.npz", npz_of(x_train=np.zeros((4, 8, 8), np.uint8))))],
         1, "needs arrays x_train and y_train"),
    Case("eval on a dataset of other classes", lambda t: ["eval", str(model_dir(t)), "--dataset", "digits"], 2,
         "predicts 3 classes but digits has 10"),
    Case("ONNX file of noise", lambda t: ["eval", str(write(t / "m.onnx", RANDOM))], 1,
         "not a model ONNX Runtime can read"),
    Case("shard size NaN", lambda t: ["data", "convert", "digits", str(t / "shards"), "--shard-size", "nan"], 2,
         "expected a positive, finite size"),
    Case("data info with a NaN validation fraction", lambda t: ["data", "info", "digits", "--val-fraction", "nan"],
         2, "expected a finite number in [0, 1), got 'nan'"),
    Case("bench of an unknown model", lambda t: ["bench", "NoSuch-Model"], 2, "unknown model 'NoSuch-Model'"),
    Case("hf: parquet of noise", lambda t: ["data", "info", "hf:" + str(write(
        t / "hf" / "train" / "train-0.parquet", RANDOM).parents[1])], 1, "not a readable parquet file"),
    Case("HF processor with 2 means for 3 channels", lambda t: ["info", str(hf_with(t, json.dumps(
        {"image_mean": [0.5, 0.5], "image_std": [0.5, 0.5]})))], 1,
         "preprocessor_config.json: image_mean=[0.5, 0.5]; expected a finite number, or one per channel of the "
         "model (3)"),
    Case("HF processor that is a folder", lambda t: ["info", str(hf_with(t, None))], 1,
         "preprocessor_config.json: unreadable (Is a directory)"),
    Case("HF processor of binary noise", lambda t: ["info", str(hf_with(t, RANDOM))], 1,
         "preprocessor_config.json: not UTF-8 text"),
    Case("HF processor holding a list", lambda t: ["info", str(hf_with(t, "[1, 2]"))], 1,
         "preprocessor_config.json: expected a JSON object, got list"),
    Case("HF processor with crop_pct true", lambda t: ["info", str(hf_with(t, json.dumps({"crop_pct": True})))],
         1, "preprocessor_config.json: a centre crop of True of the resized image; expected a number in (0, 1]"),
    Case("HF config with the channel count as a string", lambda t: ["info", str(_hf_config_with(
        t, num_channels="3"))], 1, "hf/config.json: num_channels='3'; expected an integer >= 1"),
    Case("open_clip hub with a bad preprocess_cfg beside weights of noise (the side file is read first)",
         lambda t: ["info", str(_open_clip_hub(t, {"mean": "red"}))], 1,
         "open_clip_config.json: preprocess_cfg.mean='red'; expected a finite number"),
    Case("open_clip hub whose width is a string", lambda t: ["info", str(_open_clip_hub(t, {}, width="768"))], 1,
         "open_clip_config.json: model_cfg.vision_cfg.width='768'; expected an integer >= 1"),
    Case("timm hub whose head count is a bool", lambda t: ["info", str(_timm_hub_with(t, {}, num_heads=True))], 1,
         "config.json: model_args.num_heads=True; expected an integer >= 1"),
    Case("open_clip hub whose preprocess_cfg is a long list", lambda t: ["info", str(_open_clip_hub(
        t, list(range(100))))], 1, "open_clip_config.json: preprocess_cfg=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, "
         "13, 14, 15, 16, 17, 18, 19, 20, 21, 2 ...; expected a JSON object"),  # the first 80 characters
    Case("timm hub with crop_pct true", lambda t: ["info", str(_timm_hub_with(t, {"crop_pct": True}))], 1,
         "config.json: pretrained_cfg.crop_pct=True; expected a number in (0, 1]"),
    Case("timm hub whose pretrained_cfg is a list", lambda t: ["info", str(_timm_hub_with(t, [1]))], 1,
         "config.json: pretrained_cfg=[1]; expected a JSON object"),
    Case("timm hub with 2 means for 3 channels", lambda t: ["info", str(_timm_hub_with(
        t, {"mean": [0.5, 0.5], "std": 0.5}))], 1, "config.json: pretrained_cfg.mean=[0.5, 0.5]; expected"),
    Case("ONNX file whose config has backbone 5", lambda t: ["eval", str(_onnx_with_config(t, {"backbone": 5}))], 1,
         "m.onnx: backbone: expected a list of positive block counts, or null, got 5)"),
    # ------------------------------------------------------------- values past what a reader can hold
    Case(".cls label of 23 digits", lambda t: ["data", "info", _shards(t, {"a.png": png(), "a.cls": b"1" * 23})], 1,
         "train-000000.tar: sample a: .cls is b'11111111111111111111', out of range for a class index"),
    Case("shard of noise", lambda t: ["data", "info", "webdataset:" + str(write(
        t / "w" / "train-000000.tar", RANDOM).parent)], 1,
         "train-000000.tar: not a readable tar shard (file could not be opened successfully: - method gz:"),
    Case("shard pattern with unbalanced braces", lambda t: ["data", "info", f"webdataset:{t}/train-{{0..9.tar"], 1,
         "train-{{0..9.tar: unbalanced braces; expected a folder, a shard file or a brace pattern"),
    Case("shard pattern naming 10^7 shards", lambda t: ["data", "info", f"webdataset:{t}/train-{{0..9999999}}.tar"],
         1, "names more than 1,000,000 shards; expected at most 1,000,000"),
    Case("ONNX graph taking a flat input", lambda t: ["eval", str(_tiny_onnx(t, input_shape=["N", 64]))], 1,
         "m.onnx: input 'images' of shape ['N', 64]; expected (batch, C, H, W) = ['batch', 1, 8, 8]"),
    Case("ONNX graph without a logits output", lambda t: ["eval", str(_tiny_onnx(t, output="probs"))], 1,
         "m.onnx: outputs ['probs']; expected among them 'logits' of shape (batch, classes)"),
    Case("ONNX graph with more outputs than the config's classes", lambda t: ["eval", str(_tiny_onnx(t, width=12))],
         1, "m.onnx: output 'logits' of shape ['N', 12]; expected (batch, classes) = ['batch', 10]"),
    Case("ONNX graph whose output width shows only when run", lambda t: ["predict", str(_tiny_onnx(
        t, input_shape=["N", 1, "H", "W"], width=None)), str(write(t / "a.png", png()))], 1,
         "m.onnx: gave logits of shape [1, 64] for 1 images; expected [1, 10]"),
    Case("ONNX config nested 10^5 deep", lambda t: ["eval", str(_tiny_onnx(t, config="[" * 100_000))], 1,
         "m.onnx: bad 'vitkit.config' metadata (nested deeper than the JSON parser goes"),
    Case("JSON recipe nested 10^5 deep", config("r.json", "[" * 100_000), 2,
         "r.json: not valid JSON (nested deeper than the JSON parser goes"),
    Case("YAML recipe nested 10^5 deep", config("r.yaml", "[" * 100_000), 2,
         "r.yaml: not valid YAML (nested deeper than the YAML parser goes)"),
    Case("model args nested 10^5 deep", lambda t: [*TRAIN, "--model-args", "[" * 100_000], 2,
         "argument --model-args: not valid JSON (nested deeper than the JSON parser goes"),
    Case("recipe seed of 23 digits", config("r.yaml", "seed: " + "9" * 23), 2,
         "r.yaml: run.seed: expected an int >= 0 that fits in 64 bits, got 99999999999999999999999"),
    Case("threads of 23 digits", lambda t: [*TRAIN, "--threads", "9" * 23], 2,
         "argument --threads: run.threads: expected an int in [0, 1024], got '99999999999999999999999'"),
    Case("threads 5000", lambda t: [*TRAIN, "--threads", "5000"], 2,
         "run.threads: expected an int in [0, 1024], got '5000'"),
    Case("few-shot seeds of 23 digits", lambda t: ["fewshot", str(model_dir(t)), "--seeds", "9" * 23], 2,
         "--seeds: expected an int in [1, 1000], got '99999999999999999999999'"),
    Case("few-shot 5000 seeds", lambda t: ["fewshot", str(model_dir(t)), "--seeds", "5000"], 2,
         "--seeds: expected an int in [1, 1000], got '5000'"),
    Case("few-shot negative regulariser", lambda t: ["fewshot", str(model_dir(t)), "--l2", "-1"], 2,
         "--l2: expected a number >= 0, got '-1'"),
    Case("table of 10^23 classes", lambda t: ["models", "ViT-B/16", "--num-classes", "1" + "0" * 23], 2,
         "--num-classes: expected an int >= 0 that fits in 64 bits"),
    Case("analyze 0 filters", lambda t: ["analyze", str(model_dir(t)), "--out", str(t / "o"), "--filters", "0"], 2,
         "--filters: expected an int >= 1, got '0'"),
    Case("analyze std 0", lambda t: ["analyze", str(model_dir(t)), "--out", str(t / "o"), "--std", "0"], 2,
         "--std: expected a number > 0, got '0'"),
    Case("analyze mean NaN", lambda t: ["analyze", str(model_dir(t)), "--out", str(t / "o"), "--mean", "nan"], 2,
         "--mean: expected a finite number, got 'nan'"),
    Case("config.json depth of 31 digits", lambda t: ["info", str(_native_with(t, config=json.dumps(
        {**json.loads((model_dir(t) / "config.json").read_text()), "depth": 10**30}).encode()))], 1,
         "config.json: depth: expected an int in [1, 4096], got 1000000000000000000000000000000"),
    Case("weights of another width", lambda t: ["info", str(_native_with(t, config=json.dumps(
        {**json.loads((model_dir(t) / "config.json").read_text()), "dim": 32, "mlp_dim": 64}).encode()))], 1,
         "broken does not fit the model it describes: shape conflicts (19): blocks.0.attn.proj.bias: checkpoint (16,) "
         "vs model (32,)"),
    Case("dataset .npz of Python objects", lambda t: [*TRAIN, "--dataset", "npz:" + str(write(t / "d.npz", npz_of(
        x_train=np.array([{}] * 4, object), y_train=np.zeros(4, np.int64))))], 1,
         "d.npz: array x_train is not readable (Object arrays cannot be loaded when allow_pickle=False)"),
    Case("dataset .npz with no images", lambda t: [*TRAIN, "--dataset", "npz:" + str(write(t / "d.npz", npz_of(
        x_train=np.zeros((0, 8, 8), np.uint8), y_train=np.zeros(0, np.int64))))], 1,
         "d.npz[train]: the dataset is empty"),
    Case("dataset .npz with a label of 2^62", lambda t: ["data", "info", "npz:" + str(write(t / "d.npz", npz_of(
        x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.full(4, 2**62))))], 1,
         "d.npz: y_train holds int64 of shape (4,) in 4611686018427387904..4611686018427387904; expected one class "
         "index in 0..999999 per image"),
    Case("dataset .npz with fractional labels", lambda t: ["data", "info", "npz:" + str(write(t / "d.npz", npz_of(
        x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.full(4, 0.5))))], 1, "d.npz: y_train holds float64"),
    Case("hf: with no path", lambda t: ["data", "info", "hf:"], 1, "dataset 'hf:': expected a path after 'hf:'"),
    Case("imagefolder: with no path", lambda t: [*TRAIN, "--dataset", "imagefolder:"], 1,
         "dataset 'imagefolder:': expected a path after 'imagefolder:'"),
    Case("hf: folder without splits", lambda t: ["data", "info", f"hf:{(t / 'hf').mkdir() or t / 'hf'}"], 1,
         "hf: no split found; expected parquet files of a train, validation or test split"),
    Case("parquet metadata nested 10^5 deep", lambda t: ["data", "info", _parquet(t, b"[" * 100_000)], 1,
         "train-0.parquet: schema metadata 'huggingface' is not JSON (nested deeper than the JSON parser goes"),
    Case("dataset_dict.json nested 10^5 deep", lambda t: ["data", "info", "hf:" + str(write(
        t / "h" / "dataset_dict.json", "[" * 100_000).parent)], 1,
         "dataset_dict.json: expected {{\"splits\": [names]}} (JSONDecodeError('nested deeper than the JSON "
         "parser goes"),
    Case("HF processor nested 10^5 deep", lambda t: ["info", str(hf_with(t, "[" * 100_000))], 1,
         "preprocessor_config.json: not JSON (nested deeper than the JSON parser goes"),
    Case("ONNX file whose config names a list for its normalisation", lambda t: ["eval", str(_onnx_with_config(
        t, {"provenance": {"normalization": []}}))], 1,
         "m.onnx: provenance.normalization: expected one of ['google', 'imagenet', 'clip', 'unit'], got []"),
    Case("gs:// id climbing out of the cache", lambda t: ["info", "gs://vit_models/../../../outside.npz"], 1,
         "'gs://vit_models/../../../outside.npz': the id holds a '..' segment"),
    Case("run folder that links to a folder of other files", lambda t: [*TRAIN, "--run-dir", str(_linked_folder(
        t))], 2, "{tmp}/run: holds 'passwd', which a training run does not write"),
    Case("recipe that is /dev/zero", lambda t: ["train", "--config", "/dev/zero"], 1,
         "/dev/zero: a character device, not a regular file"),
    # ---------------------------------------------------------------- ReaL labels and the evaluation suite
    Case("ReaL labels of another length than the validation set", lambda t: [
        "eval", str(model_dir(t)), "--dataset", "digits", "--set", "num_classes=10", "--real-labels",
        str(write(t / "real.json", "[[1], [2]]"))], 1, "holds 2 label sets for a validation set of 359 images"),
    Case("ReaL labels whose entry is not a list", lambda t: [
        "eval", str(model_dir(t)), "--dataset", "digits", "--set", "num_classes=10", "--real-labels",
        str(write(t / "real.json", json.dumps([[1]] * 358 + [3])))], 1, "real.json: entry 358 is 3; expected"),
    Case("transfer task folder missing", lambda t: ["transfer", str(model_dir(t)), "--suite", "pets", "--data-dir",
                                                    str(t)], 1, "task pets: not under {tmp} (expected"),
    Case("transfer task folder partial", lambda t: ["transfer", str(model_dir(t)), "--suite", "cifar10",
                                                    "--data-dir", str(write(t / "cifar-10-batches-py" / "test_batch",
                                                                            "").parent.parent)],
         1, "task cifar10: {tmp}/cifar-10-batches-py lacks data_batch_1"),
    Case("transfer VTAB-1k task of fewer than 1,000 training examples", lambda t: [
        "transfer", str(model_dir(t)), "--suite", "vtab1k", "--data-dir", str(_vtab_task(t, 640))], 1,
         "task vtab-dtd: {tmp}/vtab-1k/dtd/train800val200.txt lists 640 examples; VTAB-1k trains on 1,000"),
    Case("transfer without fine-tuning, a head of other classes", lambda t: [
        "transfer", str(model_dir(t)), "--suite", "digits", "--data-dir", str(t), "--no-finetune", "--out",
        str(t / "suite")], 2, "task digits: {tmp}/ckpt predicts 3 classes but digits has 10"),
]


def _linked_folder(tmp: Path) -> Path:
    """``tmp/run``: a link to a folder of someone else's files (as a run folder linked to /etc would be)."""
    write(tmp / "etc" / "passwd", "root:x:0:0")
    (tmp / "run").symlink_to(tmp / "etc")
    return tmp / "run"


def _tiny_colour_model():
    return VisionTransformer(ViTConfig(image_size=8, num_classes=3, **{**TINY, "in_chans": 3, "pool": "token"}))


def hf_with(tmp: Path, processor: bytes | str | None) -> Path:
    """An HF directory of a tiny colour model whose preprocessor_config.json is ``processor`` (a folder for None)."""
    from vitkit.checkpoints.hf import write_hf

    directory = write_hf(_tiny_colour_model(), tmp / "hf")
    side = directory / "preprocessor_config.json"
    side.unlink()
    if processor is None:
        side.mkdir()
    else:
        write(side, processor)
    return directory


def _hf_config_with(tmp: Path, **fields: object) -> Path:
    """An HF directory of a tiny colour model whose config.json has ``fields`` changed."""
    directory = hf_with(tmp, "{}")
    config = json.loads((directory / "config.json").read_text())
    write(directory / "config.json", json.dumps({**config, **fields}))
    return directory


def _open_clip_hub(tmp: Path, preprocess_cfg: object, width: object = 64) -> Path:
    """An open_clip hub directory whose config has this preprocess_cfg and width and whose weights file is noise."""
    directory = tmp / "clip"
    write(directory / "open_clip_model.safetensors", RANDOM)
    write(directory / "open_clip_config.json", json.dumps({"model_cfg": {"vision_cfg": {"width": width}},
                                                           "preprocess_cfg": preprocess_cfg}))
    return directory


def _timm_hub_with(tmp: Path, pretrained_cfg: object, num_heads: object = 2) -> Path:
    """A timm hub directory (config.json + model.safetensors) of a tiny colour model with this pretrained_cfg."""
    from vitkit.checkpoints.timm import write_timm

    directory = tmp / "hub"
    directory.mkdir()
    write_timm(_tiny_colour_model(), directory / "model.safetensors")
    write(directory / "config.json", json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 3,
                                                 "model_args": {"num_heads": num_heads},
                                                 "pretrained_cfg": pretrained_cfg}))
    return directory


def _onnx_with_config(tmp: Path, config: dict) -> Path:
    """An ONNX file written by vitkit whose 'vitkit.config' metadata is replaced by ``config``."""
    import onnx

    from vitkit.checkpoints.onnx import CONFIG_KEY, write_onnx

    path = write_onnx(_tiny_colour_model(), tmp / "m.onnx").path
    graph = onnx.load(str(path))
    next(entry for entry in graph.metadata_props if entry.key == CONFIG_KEY).value = json.dumps(config)
    onnx.save(graph, str(path))
    return path


def _zip_of(**members: str) -> bytes:
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as handle:
        for name, text in members.items():
            handle.writestr(name, text)
    return archive.getvalue()


def _native_with(tmp: Path, config: bytes | None = None, weights: bytes | None = None) -> Path:
    """A copy of the tiny checkpoint with its config or weights replaced."""
    source = model_dir(tmp)
    target = tmp / "broken"
    target.mkdir()
    write(target / "config.json", config if config is not None else (source / "config.json").read_bytes())
    write(target / "model.safetensors", weights if weights is not None else
          (source / "model.safetensors").read_bytes())
    return target


def _shards(tmp: Path, members: dict[str, bytes]) -> str:
    """``webdataset:`` of one train shard holding ``members``."""
    import tarfile

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return f"webdataset:{write(tmp / 'wds' / 'train-000000.tar', archive.getvalue()).parent}"


def _tiny_onnx(tmp: Path, input_shape: list | None = None, output: str = "logits", width: int | None = 10,
               config: str | None = None) -> Path:
    """A hand-built ONNX graph (the first ``width`` pixels of a flattened 8x8 grey image as logits, all of them for
    None) carrying the metadata of a 10-class vitkit model: its input, output name and width as given."""
    import onnx
    from onnx import TensorProto, helper

    shape = input_shape or ["N", 1, 8, 8]
    nodes = [helper.make_node("Flatten", ["images"], ["flat" if width else output], axis=1)]
    constants = []
    if width:
        nodes.append(helper.make_node("Slice", ["flat", "start", "end", "axis"], [output]))
        constants = [helper.make_tensor(name, TensorProto.INT64, [1], [value])
                     for name, value in (("start", 0), ("end", width), ("axis", 1))]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("images", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", width or "pixels"])],
                              constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    settings = ViTConfig(image_size=8, num_classes=10, **TINY).to_json()
    model.metadata_props.add(key="vitkit.config", value=settings if config is None else config)
    path = tmp / "m.onnx"
    onnx.save(model, str(path))
    return path


def _parquet(tmp: Path, metadata: bytes) -> str:
    """``hf:`` of one train parquet file of two grey images whose schema's 'huggingface' metadata is ``metadata``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": [{"bytes": png(), "path": None}] * 2, "label": [0, 1]})
    path = tmp / "hf" / "train" / "train-0.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(table.replace_schema_metadata({b"huggingface": metadata}), path)
    return f"hf:{tmp / 'hf'}"


def _vtab_task(tmp: Path, examples: int) -> Path:
    """A folder holding VTAB-1k's dtd task in the file-list layout, its train800val200.txt of ``examples`` lines."""
    for name, count in (("train800.txt", 800), ("val200.txt", 200), ("train800val200.txt", examples),
                        ("test.txt", 10)):
        write(tmp / "vtab-1k" / "dtd" / name, "".join(f"images/{i}.jpg 0\n" for i in range(count)))
    return tmp
