"""Recipes: every setting of a run in one JSON-serialisable dataclass, with the paper's as presets.

A run is ``preset`` < config file (YAML or JSON) < command-line overrides; the resolved recipe is
written to ``run_dir/recipe.json`` so that a run can be repeated or resumed exactly.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..data.loading import CORRUPT
from ..data.transforms import AUGREG_LEVELS, TRANSFORM_PRESETS
from ..errors import ConfigError, parse_json
from ..models import ViTConfig
from ..normalization import NORMALIZATION
from ..paths import read_text
from .distributed import PARALLEL
from .loop import TRAINING_PRECISIONS
from .mpp import TARGETS as MPP_TARGETS
from .optim import SCHEDULES

OBJECTIVES = ("classification", "mpp")
NORMALIZATIONS = ("", *NORMALIZATION)
OPTIMIZERS = ("adamw", "sgd")
CHANNEL_CHOICES = ("", "rgb", "grey")
# The groups of `vitkit train --help`, in order; every recipe field belongs to one.
CONCERNS = ("data", "model", "objective", "augmentation", "optimiser", "schedule", "runtime", "checkpoints and logging")


def setting(default: Any, concern: str, help: str) -> Any:
    """A recipe field with its help, shown by ``vitkit train --help`` in the group of its ``concern``."""
    metadata = {"concern": concern, "help": help}
    if isinstance(default, dict):  # mutable: every recipe gets its own
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class Recipe:
    """Every setting of a run, checked when built: types, ranges and choices (``Literal``); a bad value
    raises ``ConfigError`` naming the field."""

    dataset: str = setting("digits", "data",
        "digits, mnist, fashion-mnist, cifar10, cifar100, npz:PATH, imagefolder:PATH, webdataset:ROOT, hf:PATH")
    data_dir: str | None = setting(None, "data", "where torchvision's datasets lie")
    train_split: str = setting("train", "data",
        "the split a run trains on, as the dataset names its splits (VTAB-1k: train800val200; Pets: trainval)")
    val_fraction: float = setting(0.1, "data",
        "training images held out for validation where the dataset has no val split")
    train_subset: int = setting(0, "data", "train on this many images only (0: all); for quick checks")
    corrupt: Literal[CORRUPT] = setting("fail", "data",
        "an unreadable image: stop (fail), or replace it and count it (skip)")
    num_workers: int = setting(-1, "data", "decoding processes; -1: none for in-memory data, else the cores of a rank")
    threads: int = setting(0, "runtime", "intra-op CPU threads (0: torch's default; small models run best on 1)")
    model: str = setting("", "model",
        "a named variant such as ViT-B/16 (see `vitkit models`), or empty for a custom one")
    model_args: dict[str, Any] = setting({}, "model",
        "a model config field, e.g. depth=8 or dropout=0.1 (repeatable); from a checkpoint, changes its config")
    image_size: int | tuple[int, int] | None = setting(None, "model",
        "input size, H or HxW pixels (default: the data's; when fine-tuning, the data's at the checkpoint's patch)")
    channels: Literal[CHANNEL_CHOICES] = setting("", "model",
        "the model's input channels, the images converted to them: rgb or grey (default: the data's; a checkpoint "
        "of other channels is refused until this says which way to convert)")
    init: str | None = setting(None, "model", "start from this checkpoint (finetune's CHECKPOINT)")
    objective: Literal[OBJECTIVES] = setting("classification", "objective",
        "classification, or mpp: masked patch prediction (self-supervised, labels unused)")
    mpp_target: Literal[MPP_TARGETS] = setting("mean-colour", "objective",
        "what a corrupted patch predicts: its mean colour, a 4x4 downsized patch, or its pixels (L2)")
    mpp_bits: int = setting(3, "objective", "bits per colour channel of the mpp targets")
    mpp_ratio: float = setting(0.5, "objective", "share of patches corrupted")
    mpp_mask_prob: float = setting(0.8, "objective", "share of the corrupted patches replaced by the [mask] embedding")
    mpp_random_prob: float = setting(0.1, "objective",
        "share of the corrupted patches replaced by another patch's embedding")
    transform: Literal[TRANSFORM_PRESETS] = setting("pretrain", "augmentation",
        "pretrain: Inception crop; finetune: resize and random crop; eval: resize only")
    crop_scale: tuple[float, float] = setting((0.08, 1.0), "augmentation",
        "area range of the Inception crop, as fractions of the image")
    hflip: bool = setting(True, "augmentation", "random horizontal flips")
    aug_level: Literal[tuple(AUGREG_LEVELS)] = setting("none", "augmentation",
        "AugReg's RandAugment and mixup strength")
    cutmix_alpha: float = setting(0.0, "augmentation", "CutMix's Beta(alpha, alpha) (0: off)")
    normalization: Literal[NORMALIZATIONS] = setting("", "augmentation",
        "input normalisation; empty: the checkpoint's when fine-tuning, else google")
    steps: int = setting(0, "schedule", "optimiser steps (0: from --epochs)")
    epochs: float = setting(1.0, "schedule", "passes over the training images, when --steps is 0")
    batch_size: int = setting(128, "schedule", "global batch, split over ranks and accumulation steps")
    accum_steps: int = setting(1, "schedule", "micro-batches accumulated into one step")
    optimizer: Literal[OPTIMIZERS] = setting("adamw", "optimiser",
        "AdamW (pre-training) or SGD with momentum (fine-tuning)")
    lr: float = setting(1e-3, "optimiser", "peak learning rate")
    weight_decay: float = setting(0.1, "optimiser", "decoupled weight decay (not on biases, norms and embeddings)")
    layer_decay: float | None = setting(None, "optimiser",
        "layer-wise lr decay (BEiT/MAE/DINOv2 fine-tuning): of L blocks, block i learns at lr * decay**(L - i), the "
        "embedding at lr * decay**(L + 1), the head at lr; null (the default): off")
    betas: tuple[float, float] = setting((0.9, 0.999), "optimiser", "AdamW's beta1 and beta2")
    momentum: float = setting(0.9, "optimiser", "SGD's momentum")
    schedule: Literal[SCHEDULES] = setting("cosine", "schedule", "learning-rate decay after the warm-up")
    warmup_steps: int = setting(0, "schedule", "steps of linear warm-up from 0")
    end_lr: float = setting(0.0, "schedule", "learning rate at the last step")
    clip_norm: float = setting(1.0, "optimiser", "clip gradients to this global norm (0: no clipping)")
    label_smoothing: float = setting(0.0, "optimiser", "label smoothing of the classification targets")
    precision: Literal[TRAINING_PRECISIONS] = setting("fp32", "runtime",
        "training compute precision; auto: bf16 where the hardware runs it natively")
    ema_decay: float = setting(0.0, "optimiser",
        "keep an exponential moving average of the weights with this decay (0: off)")
    grad_checkpointing: bool = setting(False, "runtime", "recompute activations in the backward pass to save memory")
    compile: bool = setting(False, "runtime", "torch.compile the model")
    parallel: Literal[PARALLEL] = setting("ddp", "runtime",
        "under torchrun: ddp (a replica per rank) or fsdp (sharded)")
    seed: int = setting(0, "runtime",
        "seed of the initial weights, the training subset, the data order and the augmentations")
    run_dir: str = setting("", "checkpoints and logging",
        "folder of the run: checkpoints, metrics, recipe.json (default: a new one under runs/)")
    log_every: int = setting(20, "checkpoints and logging", "steps between metric lines")
    eval_every: int = setting(0, "checkpoints and logging", "steps between validation passes (0: at the end only)")
    checkpoint_every: int = setting(0, "checkpoints and logging", "steps between checkpoints (0: by time only)")
    checkpoint_minutes: float = setting(10.0, "checkpoints and logging",
        "wall time between checkpoints (0: by steps only)")
    keep_last: int = setting(2, "checkpoints and logging", "step checkpoints kept, the newest ones (0: all)")
    eval_batch_size: int = setting(256, "checkpoints and logging", "batch of the validation and test passes")

    def __post_init__(self) -> None:
        hints = field_types()
        for item in dataclasses.fields(self):
            parse = PARSERS.get(item.name, functools.partial(_typed, item.name, kind=hints[item.name]))
            setattr(self, item.name, parse(getattr(self, item.name)))
        for name, (holds, expected) in RANGES.items():
            if not holds(getattr(self, name)):
                raise ConfigError(f"recipe field {name}={getattr(self, name)!r}: expected {expected}")
        if self.batch_size % self.accum_steps:
            raise ConfigError(f"recipe field batch_size={self.batch_size}: expected a multiple of "
                              f"accum_steps={self.accum_steps}")
        if self.layer_decay is not None and self.objective == "mpp":
            raise ConfigError(f"recipe field layer_decay={self.layer_decay}: expected null with objective='mpp' "
                              f"(layer-wise decay fine-tunes a pre-trained encoder)")
        if self.mpp_mask_prob + self.mpp_random_prob > 1:
            raise ConfigError(f"recipe fields mpp_mask_prob={self.mpp_mask_prob} + mpp_random_prob="
                              f"{self.mpp_random_prob}: expected a sum of at most 1")
        self._check_model_args()

    def _check_model_args(self) -> None:
        """Unknown ``model_args`` are refused here; their values are checked when the model is built."""
        fields = {f.name for f in dataclasses.fields(ViTConfig)} - {"image_size", "num_classes"}
        unknown = sorted(set(self.model_args) - fields)
        if unknown:
            raise ConfigError(f"recipe field model_args: unknown keys {unknown} (image_size and num_classes come "
                              f"from the recipe and the data); expected some of {sorted(fields)}")

    def replace(self, **changes: Any) -> "Recipe":
        """A copy with ``changes``, checked again as a new recipe is."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain types, as ``recipe.json`` holds it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> "Recipe":
        """A recipe from plain data (a config file, ``recipe.json``); ``source`` names it in errors."""
        prefix = f"{source}: " if source else ""
        if not isinstance(data, dict):
            raise ConfigError(f"{prefix}expected a mapping of recipe fields, got {type(data).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            close = sorted({m for key in unknown for m in difflib.get_close_matches(str(key), known, n=2)})
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"{prefix}unknown recipe keys {unknown}; {hint}every field is listed by "
                              f"`vitkit train --help`")
        try:
            return cls(**data)
        except ConfigError as error:
            if not source:
                raise
            raise ConfigError(f"{prefix}{error}") from error


@functools.cache
def field_types() -> dict[str, Any]:
    """The annotation of every recipe field, resolved once (``Literal`` fields list their choices)."""
    return typing.get_type_hints(Recipe)


def _typed(name: str, value: Any, kind: Any) -> Any:
    """``value`` checked against the field's annotation (and normalised: ints for floats, lists for
    tuples, as JSON and YAML give them); a ``Literal`` is checked against its choices."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)

    def fail(expected: str) -> typing.NoReturn:
        raise ConfigError(f"recipe field {name}={value!r}: expected {expected}")

    if origin is Literal:
        if value not in args:
            fail(f"one of {list(args)}")
        return value
    if origin in (types.UnionType, typing.Union):  # ``X | None``, ``int | tuple[int, int]``: the first that fits
        if value is None and type(None) in args:
            return None
        expected = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _typed(name, value, option)
            except ConfigError as error:
                expected.append(str(error).rsplit(": expected ", 1)[-1])
        fail(" or ".join(expected))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            fail(f"{len(args)} numbers")
        return tuple(_typed(name, part, part_kind) for part, part_kind in zip(value, args))
    if origin is dict:
        if not (isinstance(value, dict) and all(isinstance(key, str) for key in value)):
            fail("a mapping (JSON object) of names to values")
        return dict(value)
    if kind is bool:
        if not isinstance(value, bool):
            fail("true or false")
        return value
    if kind is int:  # 64 bits: what torch takes (a seed, a step count)
        if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
            fail("an integer" if not isinstance(value, int) or isinstance(value, bool) else "a 64-bit integer")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail("a finite number")
        return float(value)
    if kind is str and not isinstance(value, str):
        fail("a string")
    return value


# A rule a value must follow beyond its type: (test, what is expected). The command line's flags that
# mirror a recipe field or share its kind of range check their values by these same rules.
Rule = tuple[typing.Callable[[Any], bool], str]


def at_least(low: float) -> Rule:
    return (lambda value: value >= low), f">= {low}"


def fraction(open_top: bool = False) -> Rule:
    if open_top:
        return (lambda value: 0 <= value < 1), "a number in [0, 1)"
    return (lambda value: 0 <= value <= 1), "a number in [0, 1]"


IMAGE_SIZE_FORMS = "a size such as 224, 384x512 (height x width) or [384, 512], with sides >= 1"


def image_size(value: Any) -> int | tuple[int, int]:
    """An image size in every form a recipe file or a flag gives it: ``H``, ``[H, W]`` (JSON, YAML) or the text
    ``H`` or ``HxW`` (the command line, and YAML's reading of ``8x12``); one parser, so that all accept and
    refuse the same forms."""
    size = value
    if isinstance(value, str):
        parts = [part.strip() for part in value.lower().split("x")]
        if len(parts) in (1, 2) and all(part.isdecimal() for part in parts):
            size = int(parts[0]) if len(parts) == 1 else tuple(int(part) for part in parts)
    elif isinstance(value, list):
        size = tuple(value)
    sides = size if isinstance(size, tuple) and len(size) == 2 else (size,)
    if not all(type(side) is int and side >= 1 for side in sides):
        raise ConfigError(f"recipe field image_size={value!r}: expected {IMAGE_SIZE_FORMS}")
    return size


MAX_THREADS = 1024  # intra-op threads: more than the largest machines have cores (torch itself takes up to 2**31)

# Fields read by a parser of their own rather than by their annotation.
def image_size_or_data(value: Any) -> int | tuple[int, int] | None:
    """A recipe's ``image_size``: a size, or null for the data's (see ``train.sizing``)."""
    return None if value is None else image_size(value)


PARSERS: dict[str, typing.Callable[[Any], Any]] = {"image_size": image_size_or_data}

# Ranges of the fields beyond their types.
RANGES: dict[str, Rule] = {
    "val_fraction": fraction(open_top=True), "train_subset": at_least(0), "num_workers": at_least(-1),
    "threads": ((lambda v: 0 <= v <= MAX_THREADS), f"0 to {MAX_THREADS}"),
    "mpp_bits": ((lambda v: 1 <= v <= 8), "1 to 8 bits"),
    "mpp_ratio": ((lambda v: 0 < v <= 1), "a number in (0, 1]"), "mpp_mask_prob": fraction(),
    "mpp_random_prob": fraction(), "crop_scale": ((lambda v: 0 < v[0] <= v[1] <= 1), "0 < low <= high <= 1"),
    "cutmix_alpha": at_least(0), "steps": at_least(0), "epochs": ((lambda v: v > 0), "a positive number"),
    "batch_size": at_least(1), "accum_steps": at_least(1), "lr": at_least(0), "weight_decay": at_least(0),
    "layer_decay": ((lambda v: v is None or 0 < v <= 1), "a number in (0, 1], or null (off)"),
    "betas": ((lambda v: all(0 <= b < 1 for b in v)), "two numbers in [0, 1)"), "momentum": fraction(open_top=True),
    "warmup_steps": at_least(0), "end_lr": at_least(0), "clip_norm": at_least(0),
    "label_smoothing": fraction(open_top=True), "ema_decay": fraction(open_top=True), "seed": at_least(0),
    "log_every": at_least(1), "eval_every": at_least(0), "checkpoint_every": at_least(0),
    "checkpoint_minutes": at_least(0), "keep_last": at_least(0), "eval_batch_size": at_least(1),
}


# The help of every field, grouped by concern: `vitkit train --help` shows one group per entry.
FIELD_HELP: dict[str, dict[str, str]] = {
    concern: {item.name: item.metadata["help"] for item in dataclasses.fields(Recipe)
              if item.metadata["concern"] == concern}
    for concern in CONCERNS}

_GREY_28 = dict(image_size=28, model_args=dict(patch_size=4, dim=64, depth=4, num_heads=4, mlp_dim=128, in_chans=1,
                                               pool="gap"),
                transform="finetune", epochs=10, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_steps=300,
                label_smoothing=0.1, val_fraction=0.02)
RECIPE_PRESETS: dict[str, dict[str, Any]] = {
    # The default of `vitkit train`: >= 97% test accuracy on 8x8 digits in under 45 s on 2 cores
    # (benchmarks/results/train_speed.md: 3 layers, mild crops, 50 epochs at batch 128).
    "digits": dict(dataset="digits", image_size=8, threads=1, model_args=dict(patch_size=2, dim=64, depth=3,
                   num_heads=4, mlp_dim=128, in_chans=1, pool="gap"), transform="pretrain", crop_scale=(0.8, 1.0),
                   hflip=False, epochs=50, batch_size=128, lr=6e-3, weight_decay=0.05, warmup_steps=100,
                   label_smoothing=0.1, val_fraction=0.05),
    # Small ViTs for the 28 px grey sets: patch 4 (a 7x7 grid), random shifts of up to 3 px.
    "mnist": dict(dataset="mnist", hflip=False, **_GREY_28),
    # Fashion-MNIST underfits the MNIST model (85.8% after 8 epochs, train accuracy as low as test):
    # wider, only mild crops, and long. Measured (benchmarks/results/train_fashion*.json): 87.6% after
    # 6 epochs, 90.2% after 15, 90.9% after 20; 6 layers for 12 epochs (the same compute as 18) 89.4%.
    "fashion-mnist": dict(dataset="fashion-mnist", **{**_GREY_28, "model_args": {
        **_GREY_28["model_args"], "dim": 96, "mlp_dim": 192}, "transform": "pretrain", "crop_scale": (0.85, 1.0),
        "hflip": True, "epochs": 20}),
    # Paper, ImageNet from scratch (table 3 / appendix B.1): Adam, lr 3e-3, wd 0.3, batch 4096, 10k
    # warm-up steps, cosine decay, dropout 0.1, 300 epochs at 224 px, pre-logits head.
    "paper-pretrain": dict(model="ViT-B/16", model_args=dict(dropout=0.1, representation_size=768), image_size=224,
                           transform="pretrain", epochs=300, batch_size=4096, optimizer="adamw", lr=3e-3,
                           weight_decay=0.3, warmup_steps=10_000, schedule="cosine", clip_norm=1.0,
                           checkpoint_every=1000, eval_every=5000),
    # Paper, fine-tuning (section 3.2 / B.1.1): SGD momentum 0.9, batch 512, no weight decay, cosine
    # decay after 500 warm-up steps, lr 0.03 (swept over 0.001..0.03), 10k steps (CIFAR), 384 px.
    "paper-finetune": dict(image_size=384, transform="finetune", steps=10_000, batch_size=512, optimizer="sgd",
                           lr=0.03, weight_decay=0.0, momentum=0.9, warmup_steps=500, schedule="cosine",
                           clip_norm=1.0, checkpoint_every=1000, eval_every=1000),
}
"""The named recipes (``--preset``): name -> recipe fields; ``digits`` is ``vitkit train``'s default."""


class _YamlLoader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; recipes mean a number, as in JSON."""


_YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A recipe (or part of one) from YAML or JSON; a ``preset`` key names the preset it starts from."""
    path = Path(path)
    try:
        text = read_text(path, "recipe")
        if path.suffix in (".yaml", ".yml"):
            data = yaml.load(text, Loader=_YamlLoader)
        else:
            data = parse_json(text)
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a text file ({error})") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from error
    except RecursionError:  # YAML's composer recurses once per level of nesting
        raise ConfigError(f"{path}: not valid YAML (nested deeper than the YAML parser goes)") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of recipe fields, got {type(data).__name__}")
    return data


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; ``model_args`` are merged key by key, so one override keeps the rest."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "model_args" and not isinstance(value, dict):
                raise ConfigError(f"recipe field model_args={value!r}: expected a mapping (JSON object) of "
                                  f"model settings")
            merged[key] = {**merged.get(key, {}), **value} if key == "model_args" else value
    return merged


# What a preset says about the architecture; a run from a checkpoint (``init``) has the checkpoint's.
ARCHITECTURE = ("model", "model_args")
# The presets whose training settings a run starts from when none is named: from scratch, and from a checkpoint.
DEFAULT_PRESETS = {False: "digits", True: "paper-finetune"}
# What a default preset leaves to the data (and to the checkpoint): the input's size and channels, the patch.
SIZED_MODEL_ARGS = ("patch_size", "in_chans")


def unsized(preset: dict[str, Any], named_model: bool) -> dict[str, Any]:
    """A preset without its input geometry (and, where the run names a model, without its model), so that
    the run's model is sized from the data: the preset of a command run without ``--preset``."""
    kept = {key: value for key, value in preset.items() if key != "image_size"}
    if named_model:
        kept.pop("model_args", None)
    elif "model_args" in kept:
        kept["model_args"] = {key: value for key, value in kept["model_args"].items() if key not in SIZED_MODEL_ARGS}
    return kept


def resolve(preset: str | None = None, config_file: str | Path | None = None,
            overrides: dict[str, Any] | None = None) -> Recipe:
    """Preset, then config file, then overrides. When the run starts from a checkpoint, the preset's
    architecture is left out: it describes a fresh model, and a fine-tuning run may start from any preset.
    Without a preset, the training settings are digits' (paper-finetune's from a checkpoint) and the input's
    size, channels and patch are left to the data and the checkpoint."""
    layers = [read_config_file(config_file)] if config_file else []
    name = preset or (layers[0].pop("preset", None) if layers else None)
    if name is not None and (not isinstance(name, str) or name not in RECIPE_PRESETS):
        raise ConfigError(f"{config_file or 'recipe'}: unknown preset {name!r}; expected one of "
                          f"{sorted(RECIPE_PRESETS)}")
    layers.append(overrides or {})
    asked = merge(*layers)
    base = RECIPE_PRESETS[name] if name else unsized(RECIPE_PRESETS[DEFAULT_PRESETS[bool(asked.get("init"))]],
                                                     bool(asked.get("model")))
    if asked.get("init"):
        base = {key: value for key, value in base.items() if key not in ARCHITECTURE}
    return Recipe.from_dict(merge(base, *layers), str(config_file) if config_file else None)
