"""Reading checkpoint files safely: safetensors, PyTorch files unpickled with ``weights_only``, ``.npz``
archives whose headers are checked before anything is allocated, JSON objects, and the weights file of
a hub directory. Each reader opens its file once; nothing here knows a format's names."""

from __future__ import annotations

import errno
import json
import math
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..errors import CheckpointError, abridged, parse_json
from ..models.config import is_int, is_real
from ..paths import NotAFileError, open_regular, read_text, reason, regular_file

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is absent or holds something else (format sniffing).
    A FIFO, a device or a file past the text cap there is an error naming it, never waited on or read whole."""
    try:
        data = parse_json(read_text(path, "JSON config"))
    except (NotAFileError, FileNotFoundError, NotADirectoryError) as error:
        if isinstance(error, NotAFileError) and error.errno != errno.EISDIR:
            raise CheckpointError(f"{path}: {error.strerror}") from None
        return None
    except OSError as error:
        if error.errno == errno.EFBIG:
            raise CheckpointError(f"{path}: {error.strerror}") from None
        return None
    except ValueError:  # not text (UnicodeDecodeError), not JSON
        return None
    return data if isinstance(data, dict) else None


def read_side_file(path: Path) -> dict[str, Any] | None:
    """The JSON object of a file beside the weights (a processor config); None when there is none. A file
    that is there but unreadable, not UTF-8 text, not JSON or not an object is an error naming it."""
    if not path.exists():
        return None
    try:
        data = parse_json(read_text(path, "JSON file"))
    except OSError as error:  # a directory or a FIFO of that name, no permission, past the cap
        raise CheckpointError(f"{path}: unreadable ({error.strerror or error}); expected a JSON file") from error
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); expected a JSON "
                              f"file") from error
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: not JSON ({error})") from error
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# What a number in a checkpoint's JSON file may be, by kind: a test of the value and the words that say it.
FIELD_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "count": (lambda value: is_int(value) and value >= 1, "an integer >= 1"),
    "whole": (lambda value: is_int(value) and value >= 0, "an integer >= 0"),
    "number": (is_real, "a finite number"),
    "size": (lambda value: is_int(value) and value >= 1 or isinstance(value, list) and len(value) == 2
             and all(is_int(side) and side >= 1 for side in value), "an integer >= 1 or a [height, width] pair"),
    "fraction": (lambda value: is_real(value) and 0 <= value < 1, "a number in [0, 1)"),
    "positive": (lambda value: is_real(value) and value > 0, "a positive number"),
    "flag": (lambda value: isinstance(value, bool), "true or false"),
    "text": (lambda value: isinstance(value, str) and value != "", "a non-empty string"),
}


def check_fields(data: Any, fields: dict[str, str], path: Path, required: tuple[str, ...] = (),
                 within: str = "") -> None:
    """Refuse a JSON object from ``path`` whose ``fields`` (name -> a kind of FIELD_KINDS) are of the wrong type
    or out of range, or that lacks a ``required`` one, naming the field (after ``within``, the path of a nested
    object) and what it must be. Fields it does not hold are left to their defaults."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: {within.removesuffix('.')}={abridged(data)}; expected a JSON object")
    for key, kind in fields.items():
        valid, expected = FIELD_KINDS[kind]
        if key in required and key not in data:
            raise CheckpointError(f"{path}: no {within}{key}; expected {expected}")
        if key in data and not valid(data[key]):
            raise CheckpointError(f"{path}: {within}{key}={abridged(data[key])}; expected {expected}")


# The weights an HF or timm hub directory holds, in order of preference (safetensors before a pickle).
HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def find_weights_file(directory: Path, names: tuple[str, ...] = HUB_WEIGHT_FILES) -> Path | None:
    """The first of ``names`` present in ``directory``, or None."""
    return next((directory / name for name in names if (directory / name).exists()), None)


def hub_weights_file(directory: Path, kind: str, names: tuple[str, ...] = HUB_WEIGHT_FILES) -> Path:
    """The weights file of a hub ``directory`` (``kind`` names it in the error), the first of ``names``."""
    weights = find_weights_file(directory, names)
    if weights is None:
        raise CheckpointError(f"{directory}: {kind} directory without weights; expected one of {names}")
    return weights


def read_safetensors(path: Path, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; with ``keep``, only those whose names it keeps, the others not read."""
    try:
        regular_file(path)
        if keep is None:
            return load_file(path)
        with safe_open(path, "pt") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys() if keep(key)}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({reason(error)})") from error


def load_torch_file(path: Path) -> Any:
    """What a PyTorch file holds, unpickled with ``weights_only`` (tensors and plain values only). A file
    that is no PyTorch file at all (text, random bytes, a truncated archive) is told apart from one that
    needs code run to unpickle it. The file is opened once: the check and torch read the same handle."""
    try:
        with open_regular(path) as handle:
            problem = _not_torch_file(handle)
            if problem:
                raise CheckpointError(f"{path}: not a valid {path.suffix or 'PyTorch'} file ({problem})")
            handle.seek(0)
            return torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[0]
        raise CheckpointError(f"{path}: refusing to unpickle a file that holds Python objects other than "
                              f"tensors ({first_line}); convert it to .safetensors with code you trust") from error
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{path}: not a valid {path.suffix or 'PyTorch'} file ({reason(error)})") from error


# torch.save's two layouts: a zip archive with ``<name>/data.pkl``, or (before 1.6) a pickle stream,
# which opens with the PROTO opcode.
_PICKLE_PROTOCOL = b"\x80"


def _not_torch_file(handle: BinaryIO) -> str | None:
    """Why the open file ``handle`` cannot be a torch.save file, or None when it may be one."""
    head = handle.read(2)
    if head == b"PK":
        handle.seek(0)
        try:
            with zipfile.ZipFile(handle) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as error:
            return f"a damaged or truncated zip archive: {error}"
        if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
            return "a zip archive without torch.save's data.pkl"
        return None
    if head.startswith(_PICKLE_PROTOCOL):  # a pickle: weights_only unpickling tells what it holds
        return None
    if not head:
        return "the file is empty"
    return "neither a torch.save zip archive nor a pickle stream"


def read_torch(path: Path) -> dict[str, torch.Tensor]:
    """A PyTorch file holding tensors only; anything that would need unpickling code is refused."""
    data = load_torch_file(path)
    for wrapper in ("state_dict", "model", "module"):  # training checkpoints nest the weights
        if isinstance(data, dict) and isinstance(data.get(wrapper), dict):
            data = data[wrapper]
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state dict), got {type(data).__name__}")
    return {key.removeprefix("module."): value for key, value in data.items()}


def read_npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, without unpickling, and only after each member's ``.npy`` header
    has been checked against the bytes the archive really holds: a header that claims more (10^12
    floats in a small file) is refused before anything is allocated. The archive is opened once."""
    try:
        with open_regular(path) as file, zipfile.ZipFile(file) as archive:
            for member in archive.infolist():
                _check_npy_header(path, archive, member)
            arrays = {}
            for member in archive.infolist():
                with archive.open(member) as handle:
                    arrays[member.filename.removesuffix(".npy")] = np.lib.format.read_array(handle, allow_pickle=False)
            return arrays
    except zipfile.BadZipFile as error:
        raise CheckpointError(f"{path}: not a valid .npz file (not a readable zip archive: {error})") from error
    except ValueError as error:
        raise CheckpointError(f"{path}: not a valid .npz file of numeric arrays ({error})") from error
    except (OSError, EOFError) as error:
        raise CheckpointError(f"{path}: corrupt or unreadable .npz file ({reason(error)})") from error


# Deflate expands at most about 1032 times: the most data a compressed member can really hold.
_MAX_DEFLATE_RATIO = 1032


def _check_npy_header(path: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> None:
    if not member.filename.endswith(".npy"):
        raise CheckpointError(f"{path}: member {member.filename!r} is not a .npy array; not a valid .npz file")
    with archive.open(member) as handle:
        try:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(handle)
        except ValueError as error:
            raise CheckpointError(f"{path}: member {member.filename!r} has a malformed .npy header ({error})") \
                from error
        if dtype.hasobject:
            raise CheckpointError(f"{path}: member {member.filename!r} holds Python objects (dtype {dtype}); "
                                  f"refusing to unpickle them, a checkpoint holds numeric arrays only")
        claimed = math.prod(shape) * dtype.itemsize
        header = handle.tell()
    # The archive's own size fields can lie too: bound them by the bytes it really stores.
    stored = member.compress_size * (1 if member.compress_type == zipfile.ZIP_STORED else _MAX_DEFLATE_RATIO)
    available = min(member.file_size, stored) - header
    if claimed > available:
        raise CheckpointError(f"{path}: member {member.filename!r} claims shape {shape} of {dtype} ({claimed:,} "
                              f"bytes) but holds {max(available, 0):,} bytes; not a valid .npz file")


def read_weights(path: Path, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a weights file; with ``keep``, only those whose names it keeps (from safetensors the others
    are never read: one tower of a two-tower model)."""
    if path.suffix == ".safetensors":
        return read_safetensors(path, keep)
    if path.suffix in TORCH_SUFFIXES:
        state = read_torch(path)
        return state if keep is None else {key: value for key, value in state.items() if keep(key)}
    raise CheckpointError(f"{path}: unknown weights file type {path.suffix or '(no suffix)'}; expected a checkpoint "
                          f"directory, .safetensors, .npz or one of {', '.join(TORCH_SUFFIXES)}")


def prefixed_weights(directory: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix`` of an HF directory's safetensors weights (one file, or the shards its index
    names), keys without the prefix, read one by one: the vision tower of a whole vision-language model without
    its language model ever loaded."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        mapping = read_side_file(index).get("weight_map", {})
        files = sorted({name for key, name in mapping.items() if key.startswith(prefix)})
        paths = [directory / Path(name).name for name in files]
    else:
        paths = [hub_weights_file(directory, "an HF", ("model.safetensors",))]
    state = {}
    for path in paths:
        state.update({key[len(prefix):]: value
                      for key, value in read_safetensors(path, keep=lambda key: key.startswith(prefix)).items()})
    return state
