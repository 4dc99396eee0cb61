"""What every checkpoint format shares: safe file reading, name tables, and reading a config off the
weights once they carry vitkit's names."""

from __future__ import annotations

import json
import math
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..errors import CheckpointError, ConfigError
from ..models.config import ViTConfig, backbone_stride, pair
from ..models.registry import FAMILY_SIZES, SIZES
from ..normalization import NORMALIZATION, normalization_family

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


def known_normalization(mean: Any, std: Any, source: Any) -> str:
    """The family of a file's input statistics (a number, or one per channel; Google's when the file
    gives none, and, with a warning, when they match no family)."""
    if mean is None and std is None:
        return "google"
    given = []
    for name, value in (("mean", mean), ("std", std)):
        value = [value] * 3 if isinstance(value, (int, float)) else value
        if not (isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value)):
            raise CheckpointError(f"{source}: {name}={value!r}; expected a number, or one per channel")
        given.append(value)
    family = normalization_family(*given)
    if family is None:
        warnings.warn(f"{source}: mean={mean}, std={std} match no known normalisation {sorted(NORMALIZATION)}; "
                      f"evaluating with Google's [-1, 1]", stacklevel=2)
    return family or "google"


# ------------------------------------------------------------------------------------------ files
def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is absent or holds something else (format sniffing)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # absent, unreadable, not text (UnicodeDecodeError), not JSON
        return None
    return data if isinstance(data, dict) else None


# The weights an HF or timm hub directory holds, in order of preference (safetensors before a pickle).
HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def hub_weights_file(directory: Path, kind: str) -> Path:
    """The weights file of an HF or timm hub ``directory`` (``kind`` names it in the error)."""
    for name in HUB_WEIGHT_FILES:
        if (directory / name).exists():
            return directory / name
    raise CheckpointError(f"{directory}: {kind} directory without weights; expected one of {HUB_WEIGHT_FILES}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({error})") from error


def load_torch_file(path: Path) -> Any:
    """What a PyTorch file holds, unpickled with ``weights_only`` (tensors and plain values only). A file
    that is no PyTorch file at all (text, random bytes, a truncated archive) is told apart from one that
    needs code run to unpickle it."""
    problem = _not_torch_file(path)
    if problem:
        raise CheckpointError(f"{path}: not a valid {path.suffix or 'PyTorch'} file ({problem})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = str(error).strip().splitlines()[0]
        raise CheckpointError(f"{path}: refusing to unpickle a file that holds Python objects other than "
                              f"tensors ({reason}); convert it to .safetensors with code you trust") from error
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{path}: corrupt or unreadable PyTorch file ({error})") from error


# torch.save's two layouts: a zip archive with ``<name>/data.pkl``, or (before 1.6) a pickle stream,
# which opens with the PROTO opcode.
_PICKLE_PROTOCOL = b"\x80"


def _not_torch_file(path: Path) -> str | None:
    """Why ``path`` cannot be a torch.save file, or None when it may be one."""
    if not path.is_file():
        return "not a regular file" if path.exists() else "no such file"
    with path.open("rb") as handle:
        head = handle.read(2)
    if head == b"PK":
        try:
            with zipfile.ZipFile(path) as archive:
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
    floats in a small file) is refused before anything is allocated."""
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                _check_npy_header(path, archive, member)
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except zipfile.BadZipFile as error:
        raise CheckpointError(f"{path}: not a valid .npz file (not a readable zip archive: {error})") from error
    except ValueError as error:
        raise CheckpointError(f"{path}: not a valid .npz file of numeric arrays ({error})") from error
    except (OSError, EOFError) as error:
        raise CheckpointError(f"{path}: corrupt or unreadable .npz file ({error})") from error


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


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    if path.suffix in TORCH_SUFFIXES:
        return read_torch(path)
    raise CheckpointError(f"{path}: unknown weights file type {path.suffix or '(no suffix)'}; expected a checkpoint "
                          f"directory, .safetensors, .npz or one of {', '.join(TORCH_SUFFIXES)}")


# ------------------------------------------------------------------------------------ name tables
class Names:
    """A two-way table of parameter names. Templates hold ``{i}``/``{j}`` (indices from 0), ``{I}``/``{J}``
    (the same indices counted from 1) and ``{rest}`` (anything), e.g.
    ``("encoder.layer.{i}.output.dense.{rest}", "blocks.{i}.mlp.fc2.{rest}")``; the first template
    that matches wins, in either direction."""

    def __init__(self, pairs: list[tuple[str, str]]):
        self.forward = [self._compile(theirs, ours) for theirs, ours in pairs]
        self.backward = [self._compile(ours, theirs) for theirs, ours in pairs]

    @staticmethod
    def _compile(source: str, target: str) -> tuple[re.Pattern, str]:
        pattern = re.escape(source)
        for field, regex in (("i", r"\d+"), ("j", r"\d+"), ("I", r"\d+"), ("J", r"\d+"), ("rest", r".+")):
            pattern = pattern.replace(re.escape(f"{{{field}}}"), f"(?P<{field}>{regex})")
        return re.compile(pattern), target

    @staticmethod
    def _apply(name: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
        for pattern, target in rules:
            match = pattern.fullmatch(name)
            if match:
                fields = match.groupdict()
                for zero, one in (("i", "I"), ("j", "J")):
                    if zero in fields:
                        fields[one] = str(int(fields[zero]) + 1)
                    elif one in fields:
                        fields[zero] = str(int(fields[one]) - 1)
                return target.format(**fields)
        return None

    def to_ours(self, name: str) -> str | None:
        return self._apply(name, self.forward)

    def to_theirs(self, name: str) -> str | None:
        return self._apply(name, self.backward)


def rename(state: dict[str, Any], names: Names, source: str) -> dict[str, Any]:
    """``state`` with vitkit's names; a name the table does not know is an error that lists them all."""
    renamed, unknown = {}, []
    for key, value in state.items():
        ours = names.to_ours(key)
        if ours is None:
            unknown.append(key)
        else:
            renamed[ours] = value
    if unknown:
        raise CheckpointError(f"{source}: {len(unknown)} unexpected keys that vitkit cannot place: "
                              + ", ".join(sorted(unknown)[:20]) + (" ..." if len(unknown) > 20 else ""))
    return renamed


def fuse_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Concatenate separate ``attn.q/k/v`` projections into vitkit's packed ``attn.qkv``."""
    fused = dict(state)
    for key in [k for k in state if ".attn.q." in k]:
        parts = [fused.pop(key.replace(".attn.q.", f".attn.{p}.")) for p in "qkv"]
        fused[key.replace(".attn.q.", ".attn.qkv.")] = torch.cat(parts, dim=0)
    return fused


def split_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`fuse_qkv`."""
    split = dict(state)
    for key in [k for k in state if ".attn.qkv." in k]:
        for part, tensor in zip("qkv", split.pop(key).chunk(3, dim=0)):
            split[key.replace(".attn.qkv.", f".attn.{part}.")] = tensor.contiguous()
    return split


# Families vitkit does not read, and the keys that give them away: such a checkpoint is refused rather than
# loaded with those weights ignored.
UNSUPPORTED_FAMILIES = (
    ("EVA / EVA-02 (rotary position embeddings, SwiGLU with separate gates)",
     re.compile(r"(^|\.)(rope|freqs_cos|freqs_sin)(\.|$)|\.attn\.[qv]_bias$|\.mlp\.fc1_g\.|\.attn\.q_proj\.")),
    ("BEiT / relative position bias tables", re.compile(r"relative_position_bias_table|rel_pos_bias|\.gamma_1$")),
    ("Swin (windowed attention)", re.compile(r"^layers\.\d+\.blocks\.\d+\.attn\.")),
)


def refuse_unsupported(state: dict[str, Any], source: str) -> None:
    """Refuse a state dict of a family vitkit cannot compute exactly, naming the family and the keys."""
    for family, pattern in UNSUPPORTED_FAMILIES:
        telling = sorted(key for key in state if pattern.search(key))
        if telling:
            raise CheckpointError(f"{source}: a checkpoint of the {family} family, which vitkit does not read; "
                                  f"these keys give it away: " + ", ".join(telling[:6])
                                  + (" ..." if len(telling) > 6 else ""))


# ------------------------------------------------------------------------------ reading a config
def count_indices(state: dict[str, Any], prefix: str) -> int:
    """How many ``prefix{n}.`` entries there are (e.g. blocks), checking they run 0..n-1."""
    found = {int(m.group(1)) for key in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", key))}
    return len(found) if found == set(range(len(found))) else -1


def standard_heads(dim: int, overrides: dict[str, Any], source: str) -> int:
    """The head count the weights cannot tell (packed qkv): the override, or the paper's for its widths."""
    if "num_heads" in overrides:
        return int(overrides["num_heads"])
    by_width = {width: heads for _, width, _, heads in [*SIZES.values(), *FAMILY_SIZES.values()]}
    if dim in by_width:
        return by_width[dim]
    raise CheckpointError(f"{source}: the head count of a packed qkv matrix of width {dim} cannot be read "
                          f"from the weights; pass the override num_heads=...")


def infer_config(state: dict[str, torch.Tensor], overrides: dict[str, Any], source: str,
                 **settings: Any) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The config that vitkit-named ``state`` implies (shapes, layout, grid); ``settings`` give what the
    format knows beyond the weights (numerics, head count, pooling). A position table without rows for
    the prefix tokens (big_vision, timm's ``no_embed_class``) sets ``no_embed_class``: told by the format
    or the override, else read off the table's length (square without prefix rows; with registers, timm's
    layout, also when both readings are square)."""
    def need(key: str) -> torch.Tensor:
        if key not in state:
            raise CheckpointError(f"{source}: missing {key!r}, which every ViT has; found {sorted(state)[:8]} ...")
        return state[key]

    proj = need("patch_embed.proj.weight")
    fc1, fc2 = need("blocks.0.mlp.fc1.weight"), need("blocks.0.mlp.fc2.weight")
    dim, patch = proj.shape[0], proj.shape[-1]
    swiglu = fc1.shape[0] == 2 * fc2.shape[-1]  # fc1 yields a gate and a value
    config: dict[str, Any] = dict(dim=dim, patch_size=patch, in_chans=proj.shape[1],
                                  depth=count_indices(state, "blocks."), mlp="swiglu" if swiglu else "gelu",
                                  mlp_dim=fc2.shape[-1] if swiglu else fc1.shape[0],
                                  qkv_bias="blocks.0.attn.qkv.bias" in state,
                                  class_token="cls_token" in state, fc_norm="fc_norm.weight" in state,
                                  dist_token="dist_token" in state,
                                  reg_tokens=state["reg_token"].shape[1] if "reg_token" in state else 0,
                                  pre_norm="norm_pre.weight" in state, patch_bias="patch_embed.proj.bias" in state,
                                  qk_norm="blocks.0.attn.q_norm.weight" in state,
                                  num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0)
    if "blocks.0.ls1.gamma" in state:  # the init a trained gamma came from is not recorded; DINOv2's
        config["layer_scale"] = 1e-5
    if "pre_logits.0.weight" in state:
        config["representation_size"] = state["pre_logits.0.weight"].shape[0]
    stem = "patch_embed.backbone.stem.conv.weight"
    if stem in state:
        stages = count_indices(state, "patch_embed.backbone.stages.")
        config.update(in_chans=state[stem].shape[1], backbone_width=state[stem].shape[0],
                      backbone=tuple(count_indices(state, f"patch_embed.backbone.stages.{s}.")
                                     for s in range(stages)))
    if "attn_pool.probe" in state:
        config["pool"] = "map"
    else:
        config["pool"] = "gap" if config["fc_norm"] or not config["class_token"] else "token"
    config.update(settings)
    if "num_heads" not in config:
        config["num_heads"] = standard_heads(dim, overrides, source)

    if "pos_embed.weight" in state:
        table = state["pos_embed.weight"]
        if table.ndim == 2:
            table = table.unsqueeze(0)
        prefix, rows = int(config["class_token"]) + int(config["dist_token"]) + config["reg_tokens"], table.shape[1]
        without_prefix_rows = overrides.get("no_embed_class", config.get("no_embed_class"))
        if without_prefix_rows is None:  # a square table; with registers, timm's never has prefix rows
            without_prefix_rows = bool(prefix) and _is_square(rows) and (
                config["reg_tokens"] > 0 or not _is_square(rows - prefix))
        config["no_embed_class"] = bool(without_prefix_rows)
        tokens = rows if without_prefix_rows else rows - prefix
        state = {**state, "pos_embed.weight": table}
        config["image_size"] = _native_size(tokens, config, overrides, source)
    else:
        config["pos_embed"] = "none"
        config["image_size"] = overrides.get("image_size", 224)
    try:
        return ViTConfig(**{**config, **kept_overrides(overrides)}), state
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{source}: the weights describe an invalid model ({error})") from error


def options_in_use(config: ViTConfig) -> list[str]:
    """The family options ``config`` turns on, as ``field=value``, for the refusals of writers whose format
    lacks them all (``no_embed_class`` aside: see :func:`with_prefix_positions`)."""
    used = [f"{name}={value!r}" for name, value in config.family_options().items() if name != "no_embed_class"]
    return used + [f"{name}={value!r}" for name, value in (("pool", "map"), ("gelu", "quick"))
                   if getattr(config, name) == value]


def with_prefix_positions(config: ViTConfig, state: dict[str, torch.Tensor]
                          ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """For formats without ``no_embed_class``: zero position rows for the prefix tokens, exactly equivalent."""
    if not config.no_embed_class or "pos_embed.weight" not in state:
        return config, state
    table = state["pos_embed.weight"]
    rows = table.new_zeros(1, config.num_prefix_tokens, table.shape[-1])
    return config.replace(no_embed_class=False), {**state, "pos_embed.weight": torch.cat([rows, table], dim=1)}


def kept_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides that win over what the file says (image_size and num_classes are surgery, after)."""
    return {k: v for k, v in overrides.items() if k not in ("image_size", "num_classes")}


def _is_square(count: int) -> bool:
    return count >= 0 and math.isqrt(count) ** 2 == count


def _native_size(tokens: int, config: dict[str, Any], overrides: dict[str, Any], source: str) -> tuple[int, int]:
    stride = config["patch_size"] * backbone_stride(config.get("backbone"))
    if _is_square(tokens):
        side = math.isqrt(tokens)
        return (side * stride, side * stride)
    if "image_size" in overrides:  # a non-square native grid can only come from the caller
        height, width = pair(overrides["image_size"])
        if (height // stride) * (width // stride) == tokens:
            return (height, width)
    raise CheckpointError(f"{source}: the position table has {tokens} patch positions, not a square grid; "
                          f"pass the native size as the override image_size=(height, width)")
