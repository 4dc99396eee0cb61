"""HF transformers' ViT directories: ``config.json`` + ``model.safetensors`` (or a weights-only
``pytorch_model.bin``), read with both the on-disk names of transformers 4.x (which 5.x still writes)
and the in-memory names of 5.x, and written with the 4.x names that every version reads.

Numerics come from the config: LayerNorm eps (HF's default is 1e-12) and ``hidden_act``. HF resamples
position tables bicubically without antialias (``interpolate_pos_encoding=True``), as vitkit does.
The pooler (Linear + tanh on the [class] token) is vitkit's pre-logits layer. The input
normalisation and crop fraction come from ``preprocessor_config.json`` when there is one (HF ViTs default
to [-1, 1] and to resizing the whole image).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..atomic import atomic_directory
from ..errors import CheckpointError, FormatError, abridged
from ..models.config import CROP_PCT, Provenance, ViTConfig, is_crop_pct, is_int
from ..models.vit import VisionTransformer
from .files import HUB_WEIGHT_FILES, check_fields, hub_weights_file, read_side_file, read_weights
from .inference import kept_overrides, known_normalization, options_in_use
from .names import Names, fuse_qkv, rename, split_qkv, with_prefix_positions

CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
GELUS = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "quick_gelu": "quick"}
HF_ACTIVATIONS = {"exact": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}  # what the writers name

_V4, _V5 = "encoder.layer.{i}.", "layers.{i}."
VIT_NAMES = [  # the 4.x name of each pair comes first: it is the one written
    ("embeddings.cls_token", "cls_token"),
    ("embeddings.position_embeddings", "pos_embed.weight"),
    ("embeddings.patch_embeddings.projection.{rest}", "patch_embed.proj.{rest}"),
    ("layernorm.{rest}", "norm.{rest}"),
    ("pooler.dense.{rest}", "pre_logits.0.{rest}"),
    ("classifier.{rest}", "head.{rest}"),
    *[(layer + theirs + ".{rest}", "blocks.{i}." + ours + ".{rest}") for theirs, ours, layer in [
        ("layernorm_before", "norm1", _V4), ("layernorm_before", "norm1", _V5),
        ("layernorm_after", "norm2", _V4), ("layernorm_after", "norm2", _V5),
        ("attention.attention.query", "attn.q", _V4), ("attention.q_proj", "attn.q", _V5),
        ("attention.attention.key", "attn.k", _V4), ("attention.k_proj", "attn.k", _V5),
        ("attention.attention.value", "attn.v", _V4), ("attention.v_proj", "attn.v", _V5),
        ("attention.output.dense", "attn.proj", _V4), ("attention.o_proj", "attn.proj", _V5),
        ("intermediate.dense", "mlp.fc1", _V4), ("mlp.fc1", "mlp.fc1", _V5),
        ("output.dense", "mlp.fc2", _V4), ("mlp.fc2", "mlp.fc2", _V5),
    ]],
]
NAMES = Names(VIT_NAMES)

# What each number HF's config.json gives must be (a kind of files.FIELD_KINDS).
HF_FIELDS = dict(hidden_size="count", num_hidden_layers="count", num_attention_heads="count",
                 intermediate_size="count", num_channels="count", patch_size="count", image_size="size",
                 hidden_dropout_prob="fraction", attention_probs_dropout_prob="fraction", layer_norm_eps="positive",
                 qkv_bias="flag")


def is_hf_config(config_json: dict[str, Any] | None) -> bool:
    """Whether a directory's parsed ``config.json`` is HF transformers'."""
    return "model_type" in (config_json or {})


def read_hf(directory: Path, hf: dict[str, Any], overrides: dict[str, Any]
            ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An HF ViT directory (model_type 'vit') whose ``config.json`` the caller has parsed into ``hf``."""
    check_fields(hf, HF_FIELDS, directory / CONFIG_FILE,
                 required=("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"))
    if hf.get("hidden_act", "gelu") not in GELUS or hf.get("pooler_act", "tanh") != "tanh":
        raise CheckpointError(f"{directory / CONFIG_FILE}: hidden_act={hf.get('hidden_act')!r}, "
                              f"pooler_act={hf.get('pooler_act')!r}; expected hidden_act in {sorted(GELUS)} "
                              f"and pooler_act 'tanh'")
    weights = hub_weights_file(directory, "an HF")
    state = {key.removeprefix("vit."): value for key, value in read_weights(weights).items()}
    state = fuse_qkv(rename(state, NAMES, str(weights)))
    head = state.get("head.weight")
    pooler = state.get("pre_logits.0.weight")
    num_classes, channels = head.shape[0] if head is not None else 0, hf.get("num_channels", 3)
    config = dict(
        image_size=hf.get("image_size", 224), patch_size=hf.get("patch_size", 16),
        in_chans=channels, dim=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"], qkv_bias=hf.get("qkv_bias", True),
        num_classes=num_classes,
        representation_size=pooler.shape[0] if pooler is not None else None,
        dropout=hf.get("hidden_dropout_prob", 0.0), attn_dropout=hf.get("attention_probs_dropout_prob", 0.0),
        ln_eps=hf.get("layer_norm_eps", 1e-12), gelu=GELUS[hf.get("hidden_act", "gelu")],
        pos_interp="bicubic", pos_interp_antialias=False,
        provenance=Provenance(format="hf", source=str(directory), **read_preprocessing(directory, channels),
                              classes=read_labels(hf, num_classes, directory / CONFIG_FILE)),
    )
    try:
        return ViTConfig(**{**config, **kept_overrides(overrides)}), state
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{directory / CONFIG_FILE}: describes an invalid model ({error})") from error


def read_labels(hf: dict[str, Any], num_classes: int, source: Path) -> tuple[str, ...] | None:
    """The class names of ``id2label``, one per output of the head; None without a head or when they are
    HF's placeholders ``LABEL_k`` (what :func:`hf_labels` writes for unnamed classes)."""
    labels = hf.get("id2label")
    if not num_classes or not labels:
        return None
    if isinstance(labels, dict) and all(name == f"LABEL_{key}" for key, name in labels.items()):
        return None
    if not (isinstance(labels, dict) and set(labels) == {str(k) for k in range(num_classes)}
            and all(isinstance(name, str) for name in labels.values())):
        raise CheckpointError(f"{source}: id2label={abridged(labels)}; expected a name (a string) for each of the "
                              f"head's {num_classes} outputs, keyed '0' to '{num_classes - 1}'")
    return tuple(labels[str(k)] for k in range(num_classes))


def read_preprocessing(directory: Path, channels: int, default: str = "google") -> dict[str, Any]:
    """The provenance fields ``preprocessor_config.json`` gives for a model of ``channels`` input channels:
    the normalisation family and the crop fraction (the family's ``default`` statistics and the whole image when
    there is no file). A processor that does not normalise (``do_normalize: false``) gives the [0, 1] pixels as
    they are: the "unit" statistics."""
    path = directory / PREPROCESSOR_FILE
    processor = read_side_file(path)
    if processor is None:
        return dict(normalization=default, crop_pct=1.0)
    if processor.get("do_normalize", True) is False:
        family = "unit"
    else:
        family = known_normalization(processor.get("image_mean"), processor.get("image_std"), path, channels,
                                     ("image_mean", "image_std"))
    return dict(normalization=family, crop_pct=processor_crop_pct(processor, path))


def processor_crop_pct(processor: dict[str, Any], path: Path) -> float:
    """``crop_pct`` where the processor names it (ConvNeXt's style); else the centre crop's side over the
    resized side (``crop_size`` over ``size``); 1.0 when it does not centre-crop, where HF resizes the whole
    image to ``size``, stretching a non-square one (vitkit's ``--resize stretch``)."""
    if processor.get("crop_pct") is not None:
        crop_pct = processor["crop_pct"]
    elif processor.get("do_center_crop"):
        crop, resized = _side(processor.get("crop_size"), "crop_size", path), _side(processor.get("size"), "size", path)
        if crop > resized:  # transformers pads such a crop with black borders; vitkit crops inside the image
            raise CheckpointError(f"{path}: do_center_crop with crop_size={abridged(processor['crop_size'])} larger "
                                  f"than size={abridged(processor['size'])}; expected a crop within the resized "
                                  f"image (vitkit does not pad)")
        crop_pct = crop / resized
    else:
        return 1.0
    if not is_crop_pct(crop_pct):
        raise CheckpointError(f"{path}: a centre crop of {crop_pct!r} of the resized image; expected {CROP_PCT} "
                              f"(crop_pct, or crop_size over size)")
    return float(crop_pct)


def _side(size: Any, key: str, path: Path) -> int:
    """The shorter side (or the height) an HF ``size``/``crop_size`` entry names."""
    side = size.get("shortest_edge", size.get("height")) if isinstance(size, dict) else size
    if is_int(side) and side > 0:
        return side
    raise CheckpointError(f"{path}: do_center_crop with {key}={abridged(size)}; expected {key} as a number of "
                          f"pixels, or an object with 'shortest_edge' or 'height' (vitkit does not guess the "
                          f"defaults of HF's processor classes)")


def write_hf(model: VisionTransformer, directory: str | Path) -> Path:
    """Export as ``ViTForImageClassification`` (or ``ViTModel`` with its pooler when there is no head)."""
    config = model.config
    unsupported = [reason for reason, bad in [
        ("pool='gap'", config.pool != "token"), ("fc_norm", config.fc_norm),
        (f"pos_embed={config.pos_embed!r}", config.pos_embed != "learned"),
        ("hybrid backbone", config.backbone is not None),
        ("pre-logits layer together with a head", config.representation_size and config.num_classes),
    ] if bad] + options_in_use(config)
    if unsupported:
        raise FormatError(f"cannot write {directory}: HF's ViT has no {', '.join(unsupported)}")
    classify = config.num_classes > 0
    height, width = config.image_size
    hf = {
        "architectures": ["ViTForImageClassification" if classify else "ViTModel"], "model_type": "vit",
        "hidden_size": config.dim, "num_hidden_layers": config.depth, "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim, "hidden_act": HF_ACTIVATIONS[config.gelu],
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.attn_dropout,
        "layer_norm_eps": config.ln_eps, "image_size": height if height == width else [height, width],
        "patch_size": config.patch_size, "num_channels": config.in_chans, "qkv_bias": config.qkv_bias,
        "encoder_stride": config.patch_size, "pooler_act": "tanh",
        "pooler_output_size": config.representation_size or config.dim, **hf_labels(config),
    }
    prefix = "vit." if classify else ""
    state = {}
    for name, tensor in split_qkv(with_prefix_positions(config, model.state_dict())[1]).items():
        theirs = NAMES.to_theirs(name)
        state[theirs if theirs.startswith("classifier.") else prefix + theirs] = tensor
    return write_hf_directory(directory, config, hf, state)


def hf_labels(config: ViTConfig) -> dict[str, Any]:
    """``id2label``/``label2id`` from the class names a run recorded (``LABEL_k`` without them)."""
    names = config.provenance.classes or [f"LABEL_{k}" for k in range(config.num_classes)]
    labels = {str(k): name for k, name in enumerate(names)}
    return {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}


def processor_geometry(config: ViTConfig, directory: str | Path) -> dict[str, Any]:
    """The HF image processor that sizes images as vitkit's evaluation does: for a square size, BiT's
    (shorter side to size / crop_pct, then a centre crop, with ``crop_pct`` recorded); ViT's otherwise,
    which resizes to the size: HF has no crop that covers a non-square size."""
    height, width = config.image_size
    crop_pct = config.provenance.crop_pct
    if height != width:
        if crop_pct < 1:
            warnings.warn(f"{directory}: HF's image processors cannot centre-crop {crop_pct:g} of a non-square "
                          f"{height}x{width} input; its preprocessor_config.json resizes whole images", stacklevel=3)
        return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                "size": {"height": height, "width": width}}
    return {"image_processor_type": "BitImageProcessor", "do_resize": True,
            "size": {"shortest_edge": math.floor(height / crop_pct)}, "do_center_crop": True,
            "crop_size": {"height": height, "width": width}, "crop_pct": crop_pct,
            "do_convert_rgb": config.in_chans == 3}


def write_hf_directory(directory: str | Path, config: ViTConfig, hf: dict[str, Any],
                       state: dict[str, torch.Tensor], geometry: dict[str, Any] | None = None) -> Path:
    """An HF directory, atomically: ``config.json`` (``hf``), the weights (``state`` in HF's names) and a
    ``preprocessor_config.json`` with the checkpoint's input statistics and ``geometry`` (the processor's class
    and sizes; by default :func:`processor_geometry`'s: its size and crop fraction)."""
    mean, std = config.input_statistics
    processor = {**(geometry or processor_geometry(config, directory)), "resample": 2, "do_rescale": True,
                 "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(mean), "image_std": list(std)}
    weights = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
    with atomic_directory(directory) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True))
        (staging / PREPROCESSOR_FILE).write_text(json.dumps(processor, indent=2, sort_keys=True))
        save_file(weights, staging / HUB_WEIGHT_FILES[0], metadata={"format": "pt"})
    return Path(directory)
