"""Recipes: every setting of a run in one JSON-serialisable object, grouped into the sections a reader thinks
in (model, data, augment, objective, optim, schedule, run), each field declared once and checked when built.

Each field is declared once (``vitkit.declare``): files, flags and the Python API read it through that
declaration. How a run's recipe is put together (preset < recipe file < flags) is ``presets``; the resolved
recipe is written to the run's ``recipe.json`` so that a run can be repeated or resumed exactly.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from ..checkpoints.adapters import DEFAULT_TARGETS, LAYER_TARGETS, METHODS as PEFT_ONLY, ROW_TARGETS
from ..data.loading import CORRUPT
from ..data.transforms import AUGREG_LEVELS, TRANSFORM_PRESETS
from ..declare import (Bool, Choice, FieldError, Float, Int, Invalid, Items, Mapping, Maybe, Parsed, Text,
                       check_fields, check_keys, declared, refuse, require, setting)
from ..errors import ConfigError
from ..models import ViTConfig
from ..models.config import DENSE_HEADS
from ..normalization import NORMALIZATION
from ..runtime import TRAINING_PRECISIONS
from .distributed import PARALLEL
from .mpp import TARGETS as MPP_TARGETS
from .optim import SCHEDULES

logger = logging.getLogger(__name__)

OBJECTIVES = ("classification", "mpp", "distill", "segmentation", "depth")
DENSE_OBJECTIVES = ("segmentation", "depth")
HEAD_KINDS = tuple(head for head in DENSE_HEADS if head != "none")
DISTILL_KINDS = ("hard", "soft")
NORMALIZATIONS = ("", *NORMALIZATION)
OPTIMIZERS = ("adamw", "sgd")
CHANNEL_CHOICES = ("", "rgb", "grey")
TRAIN_SPLITS = ("train", "trainval", "train800", "train800val200")
MAX_THREADS = 1024  # intra-op threads: more than the largest machines have cores (torch itself takes up to 2**31)
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
        raise Invalid(IMAGE_SIZE_FORMS)
    return size


IMAGE_SIZE = Parsed(image_size, IMAGE_SIZE_FORMS, "HxW")
FRACTION = Float(0, 1, high_open=True)  # a share that cannot be all: [0, 1)


class Section:
    """A group of recipe fields, each checked by its declaration when built."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self, "Recipe", self.SECTION)


@dataclass
class Model(Section):
    """The model: a named variant or a custom one, its input, and the checkpoint it starts from."""

    SECTION: ClassVar[str] = "model"
    name: str = setting("", Text(), "a named variant such as ViT-B/16 (see `vitkit models`), or empty for a custom "
                        "one", alias="model")
    args: dict[str, Any] = setting({}, Mapping(), "model config fields, e.g. depth=8 or dropout=0.1 (repeatable); "
                                   "from a checkpoint, changes its config", alias="model_args")
    image_size: int | tuple[int, int] | None = setting(None, Maybe(IMAGE_SIZE, "null (the data's)"),
        "input size, H or HxW pixels (default: the data's; when fine-tuning, the data's at the checkpoint's patch)")
    channels: str = setting("", Choice(CHANNEL_CHOICES),
        "the model's input channels, the images converted to them: rgb or grey (default: the data's; a checkpoint "
        "of other channels is refused until this says which way to convert)")
    init: str | None = setting(None, Maybe(Text()), "start from this checkpoint (finetune's CHECKPOINT)")


@dataclass
class Data(Section):
    """Where the images come from and how they are read."""

    SECTION: ClassVar[str] = "data"
    dataset: str = setting("digits", Text(),
        "digits, mnist, fashion-mnist, cifar10, cifar100, npz:PATH, imagefolder:PATH, webdataset:ROOT, hf:PATH")
    data_dir: str | None = setting(None, Maybe(Text()), "where torchvision's datasets lie")
    train_split: str = setting("train", Choice(TRAIN_SPLITS), "the split trained on: train, or a published "
                               "training split (Pets' and Flowers-102's trainval, VTAB-1k's train800val200), out of "
                               "which the validation images are then held")
    val_fraction: float = setting(0.1, FRACTION,
        "training images held out for validation where the dataset has no val split")
    train_subset: int = setting(0, Int(0), "train on this many images only (0: all); for quick checks")
    corrupt: str = setting("fail", Choice(CORRUPT), "an unreadable image: stop (fail), or replace it and count it "
                           "(skip)")
    num_workers: int = setting(-1, Int(-1), "decoding processes; -1: none for in-memory data, else the cores of a "
                               "rank", short=("-j",))


@dataclass
class Augment(Section):
    """What the training images go through before the model."""

    SECTION: ClassVar[str] = "augment"
    transform: str = setting("pretrain", Choice(TRANSFORM_PRESETS),
        "pretrain: Inception crop; finetune: resize and random crop; eval: resize only")
    crop_scale: tuple[float, float] = setting((0.08, 1.0), Items(Float(), 2, lambda v: 0 < v[0] <= v[1] <= 1,
        "two numbers 0 < low <= high <= 1"), "area range of the Inception crop, as fractions of the image")
    hflip: bool = setting(True, Bool(), "random horizontal flips")
    aug_level: str = setting("none", Choice(tuple(AUGREG_LEVELS)), "AugReg's RandAugment and mixup strength")
    cutmix_alpha: float = setting(0.0, Float(0), "CutMix's Beta(alpha, alpha) (0: off)")
    random_erasing: float = setting(0.0, Float(0, 1), "probability of erasing a random rectangle of a training image "
                                    "with noise (DeiT: 0.25)")
    repeated_aug: int = setting(1, Int(1, 16), "repeated augmentation (DeiT: 3): an epoch draws 1/N of the images, "
                                "each N times in its batch, every copy augmented apart")
    normalization: str = setting("", Choice(NORMALIZATIONS),
        "input normalisation; empty: the checkpoint's when fine-tuning, else google")


@dataclass
class ObjectiveSection(Section):
    """What the model learns: classes (with label smoothing), masked patch prediction, distillation, or a class or
    a depth per pixel (a dense head)."""

    SECTION: ClassVar[str] = "objective"
    kind: str = setting("classification", Choice(OBJECTIVES),
        "classification; mpp: masked patch prediction (self-supervised, labels unused); distill: DeiT's distillation "
        "from --distill-teacher; segmentation, depth: a dense head (--head) on a segmentation or depth dataset",
        alias="objective")
    dense_head: str | None = setting(None, Maybe(Choice(HEAD_KINDS)), "segmentation, depth: linear (BatchNorm and a "
                                     "1x1 convolution on the last block, DINOv2's probe), linear-ms (the last four "
                                     "blocks) or dpt (a DPT decoder); null: linear", alias="head")
    depth_bins: int = setting(256, Int(2, 65536), "depth: bins of depth the head weighs (DINOv2's 256)")
    max_depth: float | None = setting(None, Maybe(Float(0, low_open=True)), "depth: metres; deeper pixels are left "
                                      "out and the bins end there; null: the dataset's cap, else 10")
    label_smoothing: float = setting(0.0, FRACTION, "label smoothing of the classification targets",
                                     short=("--smoothing",))
    mpp_target: str = setting("mean-colour", Choice(MPP_TARGETS),
        "what a corrupted patch predicts: its mean colour, a 4x4 downsized patch, or its pixels (L2)")
    mpp_bits: int = setting(3, Int(1, 8), "bits per colour channel of the mpp targets")
    mpp_ratio: float = setting(0.5, Float(0, 1, low_open=True), "share of patches corrupted")
    mpp_mask_prob: float = setting(0.8, Float(0, 1), "share of the corrupted patches replaced by the [mask] "
                                   "embedding")
    mpp_random_prob: float = setting(0.1, Float(0, 1),
        "share of the corrupted patches replaced by another patch's embedding")
    distill_teacher: str | None = setting(None, Maybe(Text()), "distill: the teacher, any classifier vitkit loads, "
                                          "or timm:ARCH=WEIGHTS / torchvision:ARCH=WEIGHTS (a CNN and its local file)")
    distill_kind: str | None = setting(None, Maybe(Choice(DISTILL_KINDS)), "distill: hard (the teacher's argmax, "
                                       "DeiT's choice) or soft (KL at distill_temperature); null: hard")
    distill_temperature: float = setting(1.0, Float(0, low_open=True), "distill: temperature of soft distillation")
    distill_alpha: float = setting(0.5, Float(0, 1), "distill: weight of the teacher's term (the labels' is 1 - alpha)")
    distill_teacher_size: int | tuple[int, int] | None = setting(None, Maybe(IMAGE_SIZE, "null (the student's)"),
        "distill: resize the student's images to this size for the teacher (needed where its patches do not divide "
        "the student's size)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.mpp_mask_prob + self.mpp_random_prob <= 1, "Recipe", "objective.mpp_random_prob",
                f"at most 1 - objective.mpp_mask_prob = {1 - self.mpp_mask_prob:g}", self.mpp_random_prob)
        distilling = self.kind == "distill"
        require(not distilling or self.distill_teacher, "Recipe", "objective.distill_teacher",
                "a teacher with objective.kind='distill' (--distill-teacher CKPT)", self.distill_teacher)
        dense = self.kind in DENSE_OBJECTIVES
        require(dense or self.dense_head is None, "Recipe", "objective.dense_head",
                "null unless objective.kind is segmentation or depth (--objective segmentation)", self.dense_head)
        require(self.kind == "depth" or self.max_depth is None, "Recipe", "objective.max_depth",
                "null unless objective.kind='depth' (--objective depth)", self.max_depth)
        for name in ("distill_teacher", "distill_kind", "distill_teacher_size"):
            require(distilling or getattr(self, name) is None, "Recipe", f"objective.{name}",
                    "null unless objective.kind='distill' (--objective distill)", getattr(self, name))


PEFT_METHODS = ("none", *PEFT_ONLY)
LORA_TARGETS = (*LAYER_TARGETS, *ROW_TARGETS)
TARGET_FORMS = f"comma-separated layers of each block, some of {', '.join(LORA_TARGETS)} (q, k, v: rows of qkv)"


def lora_targets(value: Any) -> tuple[str, ...]:
    """LoRA's target layers as a flag gives them (``qkv,fc1``) or a recipe file (a list), each named once."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(isinstance(item, str) for item in items):
        raise Invalid(TARGET_FORMS)
    names = tuple(dict.fromkeys(item.strip() for item in items))
    if not all(name in LORA_TARGETS for name in names):
        raise Invalid(TARGET_FORMS)
    return names


@dataclass
class Peft(Section):
    """Parameter-efficient fine-tuning: one method adapts a frozen checkpoint, the head always trained
    (``vitkit.checkpoints.adapters``)."""

    SECTION: ClassVar[str] = "peft"
    method: str = setting("none", Choice(PEFT_METHODS), "none: fine-tune every weight; lora, dora: low-rank updates "
                          "of the dense layers (--peft-targets); vpt-shallow, vpt-deep: prompt tokens at the input or "
                          "every block; adaptformer: a bottleneck MLP beside each MLP; bitfit: the biases; linear: "
                          "the head alone", alias="peft")
    lora_rank: int = setting(8, Int(1), "LoRA/DoRA: rank r of each update")
    lora_alpha: float = setting(8.0, Float(0, low_open=True), "LoRA/DoRA: updates scaled by alpha / r")
    lora_dropout: float = setting(0.0, FRACTION, "LoRA/DoRA: dropout on each update's input")
    targets: tuple[str, ...] = setting(DEFAULT_TARGETS, Parsed(lora_targets, TARGET_FORMS, "LAYERS"),
                                       "LoRA/DoRA: the layers of each block it updates, e.g. qkv,fc1,fc2 or q,v (the "
                                       "q and v rows of the fused qkv, as the LoRA paper and HF ViTs have it)",
                                       alias="peft_targets")
    prompt_tokens: int = setting(10, Int(1, 4096), "VPT: prompt tokens (at the input, or before every block)")
    adapter_dim: int = setting(64, Int(1), "AdaptFormer: width of each bottleneck MLP")
    adapter_scale: float = setting(0.1, Float(), "AdaptFormer: factor of the bottleneck MLP's output")


@dataclass
class Optim(Section):
    """The optimiser and what it does to the weights and gradients."""

    SECTION: ClassVar[str] = "optim"
    optimizer: str = setting("adamw", Choice(OPTIMIZERS), "AdamW (pre-training) or SGD with momentum (fine-tuning)",
                             short=("--opt",))
    lr: float = setting(1e-3, Float(0), "peak learning rate")
    weight_decay: float = setting(0.1, Float(0), "decoupled weight decay (not on biases, norms and embeddings)")
    layer_decay: float | None = setting(None, Maybe(Float(0, 1, low_open=True), "null (off)"),
        "layer-wise lr decay (BEiT/MAE/DINOv2 fine-tuning): of L blocks, block i learns at lr * decay**(L - i), the "
        "embedding at lr * decay**(L + 1), the head at lr; null (the default): off")
    betas: tuple[float, float] = setting((0.9, 0.999), Items(FRACTION, 2), "AdamW's beta1 and beta2")
    momentum: float = setting(0.9, FRACTION, "SGD's momentum")
    clip_norm: float = setting(1.0, Float(0), "clip gradients to this global norm (0: no clipping)")
    ema_decay: float = setting(0.0, FRACTION, "keep an exponential moving average of the weights with this decay "
                               "(0: off)")


@dataclass
class Schedule(Section):
    """How long, in what batches, and how the learning rate moves."""

    SECTION: ClassVar[str] = "schedule"
    steps: int = setting(0, Int(0), "optimiser steps (0: from --epochs)")
    epochs: float = setting(1.0, Float(0, low_open=True), "passes over the training images, when --steps is 0")
    batch_size: int = setting(128, Int(1), "global batch, split over ranks and accumulation steps", short=("-b",))
    accum_steps: int = setting(1, Int(1), "micro-batches accumulated into one step")
    decay: str = setting("cosine", Choice(SCHEDULES), "learning-rate decay after the warm-up", alias="schedule",
                         short=("--sched",))
    warmup_steps: int = setting(0, Int(0), "steps of linear warm-up from 0")
    end_lr: float = setting(0.0, Float(0), "learning rate at the last step")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.batch_size % self.accum_steps == 0, "Recipe", "schedule.batch_size",
                f"a multiple of schedule.accum_steps={self.accum_steps}", self.batch_size)


@dataclass
class Run(Section):
    """Where the run lives and how it runs: the machine's side, checkpoints and logs."""

    SECTION: ClassVar[str] = "run"
    dir: str = setting("", Text(), "folder of the run: checkpoints, metrics, recipe.json (default: a new one under "
                       "runs/)", alias="run_dir")
    seed: int = setting(0, Int(0), "seed of the initial weights, the training subset, the data order and the "
                        "augmentations")
    precision: str = setting("fp32", Choice(TRAINING_PRECISIONS),
        "training compute precision; auto: bf16 where the hardware runs it natively")
    threads: int = setting(0, Int(0, MAX_THREADS), "intra-op CPU threads (0: torch's default; small models run "
                           "best on 1)")
    grad_checkpointing: bool = setting(False, Bool(), "recompute activations in the backward pass to save memory")
    compile: bool = setting(False, Bool(), "torch.compile the model")
    parallel: str = setting("ddp", Choice(PARALLEL), "under torchrun: ddp (a replica per rank) or fsdp (sharded)")
    log_every: int = setting(20, Int(1), "steps between metric lines")
    eval_every: int = setting(0, Int(0), "steps between validation passes (0: at the end only)")
    checkpoint_every: int = setting(0, Int(0), "steps between checkpoints (0: by time only)")
    checkpoint_minutes: float = setting(10.0, Float(0), "wall time between checkpoints (0: by steps only)")
    keep_last: int = setting(2, Int(0), "step checkpoints kept, the newest ones (0: all)")
    eval_batch_size: int = setting(256, Int(1), "batch of the validation and test passes")
    eval_slide: int = setting(0, Int(0), "segmentation and depth: validate and test by windows of the model's size "
                              "stepping by this many pixels over each image resized at its aspect ratio (vitkit "
                              "eval --slide; DINOv2 steps 2/3 of the window); 0: the whole image stretched")


SECTIONS: dict[str, type] = {cls.SECTION: cls for cls in (Model, Data, Augment, ObjectiveSection, Peft, Optim,
                                                                 Schedule, Run)}
# The flat name of every field (a recipe file's key before the sections) -> (section, field).
FLAT: dict[str, tuple[str, str]] = {declaration.alias or name: (section, name)
                                    for section, cls in SECTIONS.items() for name, declaration, _ in declared(cls)}


def flat_note(source: str, moved: list[str]) -> str:
    """The one line that tells the reader of ``source`` where its flat keys now live."""
    renames = ", ".join(f"{key} -> {'.'.join(FLAT[key])}" for key in moved)
    return f"{source}: flat recipe keys read as the fields of their sections: {renames}"


def sectioned(data: Any, source: str) -> tuple[dict[str, Any], list[str]]:
    """``data`` (a recipe file, ``recipe.json``, overrides) as ``{section: {field: value}}``, and the flat keys
    (those of recipe files before the sections) it held: ``lr`` is read as ``optim.lr``; ``model``,
    ``objective`` and ``schedule`` are sections when they hold a mapping, and flat fields otherwise."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of recipe sections, got {type(data).__name__}")
    nested: dict[str, Any] = {}
    moved = []
    for key, value in data.items():
        if key in SECTIONS and (isinstance(value, dict) or key not in FLAT):
            if not isinstance(value, dict):
                raise refuse(source, key, f"a mapping of {key} fields", value)
            nested.setdefault(key, {}).update(value)
        elif key in FLAT:
            section, name = FLAT[key]
            nested.setdefault(section, {})[name] = value
            moved.append(key)
        else:
            check_keys({key: value}, list(SECTIONS), source,
                       suggestions={flat: ".".join(where) for flat, where in FLAT.items()})
    for section, values in nested.items():
        fields = {name: declaration.kind for name, declaration, _ in declared(SECTIONS[section])}
        check_keys(values, list(fields), source, section)
        for name, value in values.items():  # a mapping is merged key by key with other layers: checked first
            if isinstance(fields[name], Mapping) and not isinstance(value, dict):
                raise refuse(source, f"{section}.{name}", fields[name].expected, value)
    return nested, moved


class Recipe:
    """Every setting of a run, in sections (``recipe.optim.lr``), each field checked when built; a bad value
    raises ``ConfigError`` of one shape: ``Recipe: optim.lr: expected a number >= 0, got 'fast'``.

    ``Recipe(optim=Optim(lr=0.01))`` or ``Recipe(optim={"lr": 0.01})``; the flat names of earlier versions
    (``Recipe(lr=0.01)``, ``recipe.lr``) still work, with a DeprecationWarning naming the new one."""

    model: Model
    data: Data
    augment: Augment
    objective: ObjectiveSection
    peft: Peft
    optim: Optim
    schedule: Schedule
    run: Run

    def __init__(self, model: Model | dict | None = None, data: Data | dict | None = None,
                 augment: Augment | dict | None = None, objective: ObjectiveSection | dict | None = None,
                 peft: Peft | dict | None = None, optim: Optim | dict | None = None,
                 schedule: Schedule | dict | None = None, run: Run | dict | None = None, **flat: Any) -> None:
        given = dict(model=model, data=data, augment=augment, objective=objective, peft=peft, optim=optim,
                     schedule=schedule, run=run)
        for name in ("model", "objective", "peft", "schedule"):  # a flat field of the same name as its section
            if given[name] is not None and not isinstance(given[name], (dict, Section)):
                flat[name] = given.pop(name)
        parts = {name: value for name, value in given.items() if isinstance(value, Section)}
        nested, moved = sectioned({name: value for name, value in given.items()
                                   if value is not None and name not in parts} | flat, "Recipe")
        for key in moved:
            warnings.warn(f"Recipe({key}=...) is deprecated; use {'.'.join(FLAT[key])}", DeprecationWarning,
                          stacklevel=2)
        for name, cls in SECTIONS.items():
            part = parts.get(name) or cls(**nested.get(name, {}))
            if not isinstance(part, cls):
                raise refuse("Recipe", name, f"a {cls.__name__} or a mapping of its fields", part)
            setattr(self, name, part)
        self._check()

    def _check(self) -> None:
        """The rules between sections; unknown ``model.args`` are refused here, their values are checked when
        the model is built."""
        require(self.optim.layer_decay is None or self.objective.kind != "mpp", "Recipe", "optim.layer_decay",
                "null with objective.kind='mpp' (layer-wise decay fine-tunes a pre-trained encoder)",
                self.optim.layer_decay)
        require(self.peft.method == "none" or (self.model.init and self.objective.kind != "mpp"), "Recipe",
                "peft.method", "'none' unless fine-tuning a checkpoint (vitkit finetune CHECKPOINT "
                "--peft METHOD)", self.peft.method)
        fields = {item.name for item in dataclasses.fields(ViTConfig)} - {"image_size", "num_classes"}
        check_keys(self.model.args, sorted(fields), "Recipe", "model.args",
                   suggestions={"image_size": "model.image_size", "num_classes": "the data's classes"})

    def __getattr__(self, name: str) -> Any:
        """``recipe.lr``: the flat names of earlier versions, deprecated."""
        if name in FLAT and name not in SECTIONS:
            section, field_name = FLAT[name]
            warnings.warn(f"Recipe.{name} is deprecated; use recipe.{section}.{field_name}", DeprecationWarning,
                          stacklevel=2)
            return getattr(getattr(self, section), field_name)
        raise AttributeError(f"'Recipe' object has no attribute {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Recipe) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Recipe({', '.join(f'{name}={getattr(self, name)!r}' for name in SECTIONS)})"

    def replace(self, **changes: Any) -> "Recipe":
        """A copy with ``changes`` (``recipe.replace(optim={"lr": 0.1})``: some fields of a section, or a whole
        section), checked again as a new recipe is."""
        whole = {name: value for name, value in changes.items() if isinstance(value, Section)}
        nested, moved = sectioned({name: value for name, value in changes.items() if name not in whole}, "Recipe")
        for key in moved:
            warnings.warn(f"Recipe.replace({key}=...) is deprecated; use {'.'.join(FLAT[key])}", DeprecationWarning,
                          stacklevel=2)
        current = self.to_dict()
        return Recipe(**{name: whole.get(name) or {**current[name], **nested.get(name, {})} for name in SECTIONS})

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain types in its sections, as ``recipe.json`` holds it."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str | None = None) -> "Recipe":
        """A recipe from plain data (a config file, ``recipe.json``: in sections, or with the flat keys of earlier
        versions, noted in one line); ``source`` names it in errors."""
        source = source or "recipe"
        try:
            nested, moved = sectioned(data, source)
            if moved:
                logger.warning(flat_note(source, moved))
            return cls(**nested)
        except FieldError as error:
            raise error.at(source) from None
