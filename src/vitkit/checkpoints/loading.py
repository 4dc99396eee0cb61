"""``vitkit.load``: find out what a path holds, read it, and build the model it describes; the one place that
tells the formats apart (a directory's files, an HF ``model_type``, a state dict's names) and picks a reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, VitkitError, abridged, parse_json
from ..models.config import ViTConfig
from ..models.vit import CONFIG_FILE, WEIGHTS_FILE, VisionTransformer
from ..paths import read_text, reason
from . import hub
from .adapters import base_named, is_adapter_folder, load_adapter
from .files import read_json_object, read_safetensors, read_weights
from .gemma4 import is_gemma4_state, read_bare_gemma4, read_hf_gemma4
from .google import read_npz
from .hf import is_hf_config, read_hf
from .hf_families import MODEL_TYPES as HF_FAMILY_TYPES
from .hf_families import read_hf_family
from .hf_recent import MODEL_TYPES as HF_RECENT_TYPES
from .hf_recent import read_hf_recent
from .inference import SURGERY, kept_overrides, refuse_unsupported
from .internvl import MODEL_TYPES as INTERNVL_TYPES
from .internvl import read_internvl
from .open_clip import from_open_clip, is_open_clip, is_open_clip_directory, read_open_clip_directory
from .qwen import HF_TYPES as QWEN_TYPES
from .qwen import is_qwen3_state, read_bare_qwen3, read_hf_qwen_vl, refuse_unmerged_qwen3
from .radio import MODEL_TYPES as RADIO_TYPES
from .radio import read_radio
from .timm import from_timm, is_timm, is_timm_config, read_timm_directory
from .timm_families import family_of_keys, read_timm_family
from .tipsv2 import MODEL_TYPES as TIPSV2_TYPES
from .tipsv2 import read_tipsv2
from .torchvision_ import from_torchvision, is_torchvision

__all__ = ["CheckpointError", "load", "read_checkpoint", "read_config", "build", "load_state_strict"]


def load(path: str | Path, *, adapter: str | Path | None = None, **overrides: Any) -> VisionTransformer:
    """Load a checkpoint of any supported format as a ready ``VisionTransformer`` (in eval mode).

    ``path`` is a vitkit directory, an HF transformers or timm hub directory (ViT, DeiT, DINOv2, CLIP,
    SigLIP; HF's DINOv3, AIMv2 and SigLIP 2; timm's families of 2023-25), a Google ``.npz``, a timm,
    torchvision or open_clip state dict (``.safetensors``, or ``.pth``/``.bin``/``.pt`` read with
    ``weights_only``), or a remote name (``hf-hub:ORG/NAME``, ``gs://vit_models/...``). ``overrides`` change config fields:
    settings the file cannot tell (``num_heads`` of a packed qkv) and numerics are set before the
    weights are loaded; after loading, ``patch_size`` resamples the patch kernel (FlexiViT) and the
    position table, ``image_size`` resamples the position table and ``num_classes`` puts a new
    zero-initialised head on. ``adapter`` is an adapter folder (``adapter_config.json`` +
    ``adapter_model.safetensors``: LoRA or DoRA written by ``peft`` or by ``vitkit finetune --peft``, VPT,
    AdaptFormer, BitFit) applied to the base model ``path`` holds.
    """
    config, state, source = read_checkpoint(path, overrides)
    return build(config, state, overrides, source, adapter)


def read_checkpoint(path: str | Path, overrides: dict[str, Any] | None = None, weights: bool = True
                    ) -> tuple[ViTConfig, dict[str, torch.Tensor], str]:
    """The config and the vitkit-named weights that ``path`` holds, whatever its format (without ``weights``, a
    vitkit directory's weights are left unread: an empty state). A file whose fields are missing or of the wrong
    kind, met deep inside a format's reader, is a CheckpointError."""
    try:
        return _read_checkpoint(path, overrides or {}, weights)
    except VitkitError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, ArithmeticError, NotImplementedError,
            RuntimeError) as error:
        raise CheckpointError(f"{path}: malformed checkpoint ({type(error).__name__}: {error})") from error


def read_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ViTConfig:
    """The config of the model ``path`` holds, for what a check needs to know before any model is built: a vitkit
    directory's ``config.json`` is read and its weights are not; the other formats, whose config follows from
    the shapes of their weights, are read whole."""
    return read_checkpoint(path, overrides, weights=False)[0]


def _read_checkpoint(path: str | Path, overrides: dict[str, Any], weights: bool
                     ) -> tuple[ViTConfig, dict[str, torch.Tensor], str]:
    if isinstance(path, str) and hub.is_remote(path):
        path = hub.resolve(path)
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    if path.is_dir():
        if is_open_clip_directory(path):  # before HF: LAION's repositories hold an HF CLIPModel beside it
            return *read_open_clip_directory(path, overrides), source
        config_json = read_json_object(path / CONFIG_FILE)  # HF's, timm's or vitkit's: parsed once, passed on
        if is_hf_config(config_json):
            return *read_hf_directory(path, config_json, overrides), source
        if is_timm_config(config_json):
            return *read_timm_directory(path, config_json, overrides), source
        if (path / WEIGHTS_FILE).exists() and (path / CONFIG_FILE).exists():
            return *read_native(path, config_json, weights), source
        npz = sorted(path.glob("*.npz"))
        if len(npz) == 1:  # a hub repository holding one Google file
            return *read_npz(npz[0], overrides), str(npz[0])
        if is_adapter_folder(path):
            raise CheckpointError(f"{path} is an adapter folder, not a model: give its base as the checkpoint and the "
                                  f"folder as --adapter (in Python: load(BASE, adapter=...)){base_named(path)}")
        raise CheckpointError(f"{path} is not a checkpoint vitkit can read: expected a vitkit directory "
                              f"({CONFIG_FILE} + {WEIGHTS_FILE}), an HF transformers or timm hub directory, "
                              f"or one .npz")
    if path.suffix == ".npz":
        return *read_npz(path, overrides), source
    state = read_weights(path)
    if is_gemma4_state(state):  # read by timm's definitions, or refused naming the patch layout it cannot tell
        return *read_bare_gemma4(state, overrides, source), source
    if is_qwen3_state(state):  # timm's Qwen3 ViT: its rope and resize are the architecture's, not in the weights
        return *read_bare_qwen3(state, overrides, source), source
    if any(key.startswith("radio_model.") for key in state):
        raise CheckpointError(f"{path}: a C-RADIO state dict in NVIDIA's layout, whose class tokens, registers and "
                              f"summary only its config.json tells; load its transformers directory (RadioModel) or "
                              f"timm's hub directory (vit_*_radio, naflexvit_*_radio)")
    refuse_unsupported(state, source)
    refuse_unmerged_qwen3(state, overrides, source)
    timm_like = {"patch_embed.proj.weight", "embeds.proj.weight"} & state.keys()
    family = family_of_keys(state, source, overrides) if timm_like else None
    if family is not None:  # timm's layout of a family whose rotary settings are not in the weights
        return *read_timm_family(state, *family, overrides, source), source
    for recognises, convert in ((is_timm, from_timm), (is_torchvision, from_torchvision),
                                (is_open_clip, from_open_clip)):
        if recognises(state):
            return *convert(state, overrides, source), source
    raise CheckpointError(f"{path}: a state dict of no known ViT layout (timm's 'patch_embed.proj.weight' + "
                          f"'pos_embed', torchvision's 'conv_proj.weight' + 'encoder.pos_embedding', or "
                          f"open_clip's 'visual.conv1.weight'); "
                          f"found {sorted(state)[:6]} ...")


# HF's model_type -> the reader of its directories.
HF_READERS = {"vit": read_hf, **dict.fromkeys(HF_FAMILY_TYPES, read_hf_family),
              **dict.fromkeys(HF_RECENT_TYPES, read_hf_recent),
              **dict.fromkeys(TIPSV2_TYPES, read_tipsv2), **dict.fromkeys(RADIO_TYPES, read_radio),
              **dict.fromkeys(("gemma4_vision", "gemma4"), read_hf_gemma4),
              **dict.fromkeys(QWEN_TYPES, read_hf_qwen_vl), **dict.fromkeys(INTERNVL_TYPES, read_internvl)}


# Families vitkit does not read yet whose HF model_type (or config) names them: refused in one line naming the
# family and the nearest family vitkit reads.
_VIDEO = "a video tower ({}); vitkit reads image towers, the nearest {}"
REFUSED_HF_FAMILIES = {
    "intern_vit_6b": "InternViT-6B (QK-norm and RMSNorm in every block); vitkit reads InternViT-300M (timm's "
                     "vit_intern300m_patch14_448)",
    "vjepa2": "V-JEPA 2, " + _VIDEO.format("tubelets of 2 frames, 3-D rotary embeddings",
                                           "DINOv3's rotary ViT (dinov3_vit)"),
    "videomae": "VideoMAE, " + _VIDEO.format("tubelets of 2 frames", "HF's ViT (vit)"),
    "vivit": "ViViT, " + _VIDEO.format("tubelets, a factorised encoder", "HF's ViT (vit)"),
    "timesformer": "TimeSformer, " + _VIDEO.format("divided space-time attention", "HF's ViT (vit)"),
}


def refused_family(hf: dict[str, Any]) -> str | None:
    """The family of 2026 an HF config names that vitkit refuses by name (InternViT-6B in InternVL's own
    ``model_type`` or as transformers' InternVL vision tower with QK-norm; video towers), or None."""
    model_type = hf.get("model_type")
    tower = hf.get("vision_config") if model_type == "internvl" else hf
    if model_type in ("internvl", "internvl_vision") and isinstance(tower, dict) and tower.get("use_qk_norm"):
        return REFUSED_HF_FAMILIES["intern_vit_6b"]
    return REFUSED_HF_FAMILIES.get(model_type) if isinstance(model_type, str) else None


def read_hf_directory(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
                      ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF transformers directory, read by its ``model_type``; one vitkit does not read is refused naming it
    (and the architecture its config gives) beside those it reads, and a family of :data:`REFUSED_HF_FAMILIES`
    by that family and the nearest one vitkit reads."""
    refused = refused_family(hf)
    if refused:
        raise CheckpointError(f"{directory / CONFIG_FILE}: {refused}")
    model_type = hf.get("model_type")
    if not (isinstance(model_type, str) and model_type in HF_READERS):
        architectures = hf.get("architectures")
        named = f" ({architectures[0]})" if isinstance(architectures, list) and architectures and isinstance(
            architectures[0], str) else ""
        raise CheckpointError(f"{directory / CONFIG_FILE}: model_type={abridged(model_type)}{named} is not a model "
                              f"vitkit reads; it reads HF's {', '.join(HF_READERS)}")
    return HF_READERS[model_type](directory, hf, overrides)


def read_native(directory: Path, parsed: dict[str, Any] | None = None, weights: bool = True
                ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A vitkit directory; ``parsed`` is its ``config.json`` when the caller has read it already; without
    ``weights``, the config alone (no weights: an empty state)."""
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    try:
        fields = parsed if parsed is not None else parse_json(read_text(config_path, "vitkit config"))
        config = ViTConfig.from_dict(fields, str(config_path))
    except OSError as error:  # not a regular file, past the cap, unreadable
        raise CheckpointError(f"{config_path}: not a readable vitkit config ({reason(error)})") from None
    except (TypeError, ValueError, ArithmeticError) as error:  # not JSON, not text, fields out of range
        raise CheckpointError(f"{config_path}: not a valid vitkit config ({error})") from error
    return config, read_safetensors(weights_path) if weights else {}


def overridden(config: ViTConfig, overrides: dict[str, Any], source: str) -> ViTConfig:
    """``config`` with the overrides that win over what the file ``source`` says (``kept_overrides``); a value that
    does not fit its field is a ``CheckpointError`` naming the file."""
    try:
        return config.replace(**kept_overrides(overrides))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{source}: bad override ({error})") from error


def build(config: ViTConfig, state: dict[str, torch.Tensor], overrides: dict[str, Any],
          source: str, adapter: str | Path | None = None) -> VisionTransformer:
    """Build the model of ``config`` (plus overrides), load ``state`` strictly, apply the ``adapter`` folder if one
    is given, then the surgery the overrides ask for (a size or a head asked for wins over the adapter's)."""
    surgery = {key: overrides[key] for key in SURGERY if key in overrides}
    config = overridden(config, overrides, source)
    with torch.device("meta"):
        model = VisionTransformer(config)
    load_state_strict(model, state, source)
    if adapter is not None:
        load_adapter(model, adapter)
    if "patch_size" in surgery:  # at the new image size too, if one is asked for: one resample of the table
        model.resize_patch(surgery["patch_size"], surgery.get("image_size"))
    elif "image_size" in surgery:
        model.resize_image(surgery["image_size"])
    if "num_classes" in surgery and surgery["num_classes"] != config.num_classes:
        model.reset_head(surgery["num_classes"], keep_pre_logits=True)
    return model.eval()


def load_state_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load every weight of ``model`` (built on the meta device) from ``state`` onto the CPU, or fail
    with one error that lists every missing key, unexpected key and shape conflict."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    conflicts = [f"{key}: checkpoint {tuple(state[key].shape)} vs model {tuple(expected[key].shape)}"
                 for key in sorted(set(expected) & set(state)) if state[key].shape != expected[key].shape]
    if missing or unexpected or conflicts:
        parts = [f"{title} ({len(items)}): " + ", ".join(items[:20]) + (" ..." if len(items) > 20 else "")
                 for title, items in (("missing keys", missing), ("unexpected keys", unexpected),
                                      ("shape conflicts", conflicts)) if items]
        raise CheckpointError(f"{source} does not fit the model it describes: {'; '.join(parts)}")
    # Fresh allocations rather than the file's buffers: aligned memory keeps the kernels (and so the
    # logits, bit for bit) the same as those of a model built in the usual way.
    model.to_empty(device="cpu")
    model.load_state_dict(state, strict=True)
