"""The named recipes (presets) and how a run's recipe is put together from layers: a preset, then a recipe file
(YAML or JSON), then the command line's flags, each later layer winning field by field.

The recipe itself, its sections and the checks of every field are ``recipes``; this module only chooses and
merges what the fields are set to.
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import yaml

from ..declare import load_yaml
from ..declare_flags import FLAG_PREFIX, add_flags, flag_values
from ..errors import ConfigError, parse_json
from ..paths import read_text
from .recipes import DENSE_OBJECTIVES, FLAT, SECTIONS, Recipe, flat_note, sectioned

logger = logging.getLogger(__name__)

_GREY_28 = dict(model=dict(image_size=28, args=dict(patch_size=4, dim=64, depth=4, num_heads=4, mlp_dim=128,
                                                    in_chans=1, pool="gap")),
                data=dict(val_fraction=0.02), augment=dict(transform="finetune"), objective=dict(label_smoothing=0.1),
                optim=dict(lr=2e-3, weight_decay=0.05), schedule=dict(epochs=10, batch_size=128, warmup_steps=300))
RECIPE_PRESETS: dict[str, dict[str, Any]] = {
    # The default of `vitkit train`: 3 layers with stochastic depth 0.1, mild crops, 50 epochs at batch 128.
    # Test accuracy on 8x8 digits (359 images; benchmarks/results/digits_seeds.md): 98.33% with seed 0, mean 98.27%
    # over seeds 0-4 (97.77-98.61%), 98.22% over seeds 5-9; 26.6 s a run on 2 cores of an AMD EPYC at load 2.6-3.0,
    # 0.99-1.06x the time of the same recipe without stochastic depth (97.94% over seeds 0-4, 97.49% with seed 0).
    "digits": dict(model=dict(image_size=8, args=dict(patch_size=2, dim=64, depth=3, num_heads=4, mlp_dim=128,
                                                      in_chans=1, pool="gap", drop_path=0.1)),
                   data=dict(dataset="digits", val_fraction=0.05),
                   augment=dict(transform="pretrain", crop_scale=(0.8, 1.0), hflip=False),
                   objective=dict(label_smoothing=0.1), optim=dict(lr=6e-3, weight_decay=0.05),
                   schedule=dict(epochs=50, batch_size=128, warmup_steps=100), run=dict(threads=1)),
    # Small ViTs for the 28 px grey sets: patch 4 (a 7x7 grid), random shifts of up to 3 px.
    "mnist": {**_GREY_28, "data": {**_GREY_28["data"], "dataset": "mnist"},
              "augment": {**_GREY_28["augment"], "hflip": False}},
    # Fashion-MNIST underfits the MNIST model (85.8% after 8 epochs, train accuracy as low as test):
    # wider, only mild crops, and long. Measured (benchmarks/results/train_fashion*.json): 87.6% after
    # 6 epochs, 90.2% after 15, 90.9% after 20; 6 layers for 12 epochs (the same compute as 18) 89.4%.
    "fashion-mnist": {**_GREY_28,
                      "model": {**_GREY_28["model"], "args": {**_GREY_28["model"]["args"], "dim": 96, "mlp_dim": 192}},
                      "data": {**_GREY_28["data"], "dataset": "fashion-mnist"},
                      "augment": dict(transform="pretrain", crop_scale=(0.85, 1.0), hflip=True),
                      "schedule": {**_GREY_28["schedule"], "epochs": 20}},
    # MNIST in two minutes (tuned for >= 99.0% test accuracy in <= 120 s wall on 2 cores, data loading and the
    # final test pass included): the hybrid's ResNet stem (7x7 stride-2 conv of 32 channels, GroupNorm, max-pool)
    # on the digits resized to 32 px, its 8x8 map cut into 2x2 patches (a 4x4 grid), 3 blocks of D 64, all 60k
    # training images, 4.5 epochs (2,106 steps). What helped (benchmarks/time_to_accuracy.py --tune, 1 thread,
    # seed 0 unless said): the stem, 93-96% after one epoch against 79-81% for plain patch-7 ViTs, which reach
    # only 98.4-98.5% after 6 epochs (patch 4 costs 3x per image); Inception crops of area 0.8-1 over the
    # pad-and-crop shifts (99.17% against 99.04% at 5 epochs); 3 blocks as good as 4 and 30% cheaper. At
    # 4.5 epochs: 99.06% and 99.10% (seeds 1, 2); 4 epochs 99.18% (seed 0), 5 epochs 99.39% / 99.08% (seeds 0, 1).
    # Measured (benchmarks/results/time_to_accuracy.md; 2 threads, 2 cores of an AMD EPYC, 2026-11-28): 99.23% test
    # accuracy after 78 s, 99% first seen at the 60 s checkpoint.
    "mnist-fast": dict(model=dict(image_size=32, args=dict(backbone=(), backbone_width=32, patch_size=2, dim=64,
                                                           depth=3, num_heads=4, mlp_dim=128, in_chans=1, pool="gap")),
                       data=dict(dataset="mnist", val_fraction=0.0),
                       augment=dict(transform="pretrain", crop_scale=(0.8, 1.0), hflip=False),
                       objective=dict(label_smoothing=0.1), optim=dict(lr=2e-3, weight_decay=0.05),
                       schedule=dict(epochs=4.5, batch_size=128, warmup_steps=300)),
    # The CIFAR-10 subset (5,085 training images; --dataset npz:DIR/cifar10_subset.npz) from scratch in ten minutes
    # (tuned for a 600 s wall budget on 2 cores, data loading and the final test pass included; all of CIFAR-10,
    # the default dataset, takes ten times as long a run): the hybrid's ResNet stem of 64 channels, its 8x8 map
    # cut into 2x2 patches (a 4x4 grid), 6 blocks of D 128, stochastic depth 0.1, Inception crops of area 0.35-1,
    # flips and random erasing 0.25, 120 epochs at batch 128. What helped (benchmarks/time_to_accuracy.py --tune,
    # seed 0): the 4x4 grid over an 8x8 one (patch 1: 3.6x the cost a step, 55.4% after 50 epochs); leaving
    # RandAugment and Mixup out (AugReg's light2 level: 52.8% against 57.2% at 80 epochs); a stem of 64 channels
    # over 32 (64.0% against 62.1% at 120 epochs, 8% slower a step). Measured (time_to_accuracy.md; 2 threads, 2 cores
    # of an AMD EPYC, 2026-11-28): 62.34% test accuracy after 544 s, 60% first seen at the 360 s checkpoint.
    "cifar10-small": dict(model=dict(image_size=32, args=dict(backbone=(), backbone_width=64, patch_size=2, dim=128,
                                                              depth=6, num_heads=4, mlp_dim=256, in_chans=3, pool="gap",
                                                              drop_path=0.1)),
                          data=dict(dataset="cifar10", val_fraction=0.0),
                          augment=dict(transform="pretrain", crop_scale=(0.35, 1.0), hflip=True, random_erasing=0.25),
                          objective=dict(label_smoothing=0.1), optim=dict(lr=2e-3, weight_decay=0.05),
                          schedule=dict(epochs=120, batch_size=128, warmup_steps=300)),
    # Paper, ImageNet from scratch (table 3 / appendix B.1): Adam, lr 3e-3, wd 0.3, batch 4096, 10k
    # warm-up steps, cosine decay, dropout 0.1, 300 epochs at 224 px, pre-logits head.
    "paper-pretrain": dict(model=dict(name="ViT-B/16", args=dict(dropout=0.1, representation_size=768),
                                      image_size=224),
                           augment=dict(transform="pretrain"),
                           optim=dict(optimizer="adamw", lr=3e-3, weight_decay=0.3, clip_norm=1.0),
                           schedule=dict(epochs=300, batch_size=4096, warmup_steps=10_000, decay="cosine"),
                           run=dict(checkpoint_every=1000, eval_every=5000)),
    # Paper, fine-tuning (section 3.2 / B.1.1): SGD momentum 0.9, batch 512, no weight decay, cosine
    # decay after 500 warm-up steps, lr 0.03 (swept over 0.001..0.03), 10k steps (CIFAR), 384 px.
    "paper-finetune": dict(model=dict(image_size=384), augment=dict(transform="finetune"),
                           optim=dict(optimizer="sgd", lr=0.03, weight_decay=0.0, momentum=0.9, clip_norm=1.0),
                           schedule=dict(steps=10_000, batch_size=512, warmup_steps=500, decay="cosine"),
                           run=dict(checkpoint_every=1000, eval_every=1000)),
    # Dense heads (--objective segmentation|depth), one preset for the linear heads and one for DPT: DINOv2's
    # protocol (AdamW, weight decay 1e-4, linear decay after a warm-up) at the length of a small set, 600 steps of
    # 16 crops. On pasted MNIST digits, frozen MNIST backbone (benchmarks/results/dense_probe.md and
    # dense_lr_sweep.md): a linear head 17.7% mIoU at DINOv2's lr 1e-3, 24.4% at 1e-2 (26.3% after 2,000 steps),
    # 25.2% at 3e-2; DPT, whose decoder is deep, 25.6% at 1e-3 against 10.1% at 1e-2.
    "dense-linear": dict(optim=dict(optimizer="adamw", lr=1e-2, weight_decay=1e-4),
                         schedule=dict(steps=600, batch_size=16, warmup_steps=50, decay="linear")),
    "dense-dpt": dict(optim=dict(optimizer="adamw", lr=1e-3, weight_decay=1e-4),
                      schedule=dict(steps=600, batch_size=16, warmup_steps=50, decay="linear")),
}
"""The named recipes (``--preset``): name -> recipe fields by section; ``digits`` is ``vitkit train``'s default."""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A recipe (or part of one) from YAML or JSON, in sections (flat keys of earlier versions are moved into
    theirs, with a one-line note); a ``preset`` key names the preset it starts from."""
    path = Path(path)
    try:
        text = read_text(path, "recipe")
        data = load_yaml(text) if path.suffix in (".yaml", ".yml") else parse_json(text)
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a text file ({error})") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from error
    except RecursionError:  # YAML's composer recurses once per level of nesting
        raise ConfigError(f"{path}: not valid YAML (nested deeper than the YAML parser goes)") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of recipe sections, got {type(data).__name__}")
    preset = {"preset": data.pop("preset")} if "preset" in data else {}
    nested, moved = sectioned(data, str(path))
    if moved:
        logger.warning(flat_note(str(path), moved))
    return {**preset, **nested}


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Sectioned layers, later ones winning field by field; ``model.args`` are merged key by key, so that one
    override keeps the rest."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for section, values in layer.items():
            if section not in SECTIONS:
                merged[section] = values
                continue
            into = merged.setdefault(section, {})
            for name, value in values.items():
                if (section, name) == ("model", "args") and isinstance(value, dict):
                    value = {**into.get("args", {}), **value}
                into[name] = value
    return merged


# What a preset says about the architecture; a run from a checkpoint (``init``) has the checkpoint's.
ARCHITECTURE = ("name", "args")
# The presets whose training settings a run starts from when none is named: from scratch, and from a checkpoint;
# a segmentation or depth run starts from its head's dense preset either way.
DEFAULT_PRESETS = {False: "digits", True: "paper-finetune"}
DENSE_PRESETS = {"linear": "dense-linear", "linear-ms": "dense-linear", "dpt": "dense-dpt"}
# What a default preset leaves to the data (and to the checkpoint): the input's size and channels, the patch.
SIZED_MODEL_ARGS = ("patch_size", "in_chans")


def unsized(preset: dict[str, Any], named_model: bool) -> dict[str, Any]:
    """A preset without its input geometry (and, where the run names a model, without its model), so that
    the run's model is sized from the data: the preset of a command run without ``--preset``."""
    model = {key: value for key, value in preset.get("model", {}).items() if key != "image_size"}
    if named_model:
        model.pop("args", None)
    elif "args" in model:
        model["args"] = {key: value for key, value in model["args"].items() if key not in SIZED_MODEL_ARGS}
    return {**preset, "model": model}


def resolve(preset: str | None = None, config_file: str | Path | None = None,
            overrides: dict[str, Any] | None = None) -> Recipe:
    """Preset, then config file, then overrides (sectioned, as ``{"optim": {"lr": 0.01}}``). When the run starts
    from a checkpoint, the preset's architecture is left out: it describes a fresh model, and a fine-tuning run
    may start from any preset. Without a preset, the training settings are digits' (paper-finetune's from a
    checkpoint, dense-linear's or dense-dpt's for segmentation and depth) and the input's size, channels and patch are left to the data
    and the checkpoint."""
    layers = [read_config_file(config_file)] if config_file else []
    name = preset or (layers[0].pop("preset", None) if layers else None)
    if name is not None and (not isinstance(name, str) or name not in RECIPE_PRESETS):
        raise ConfigError(f"{config_file or 'recipe'}: unknown preset {name!r}; expected one of "
                          f"{sorted(RECIPE_PRESETS)}")
    asked_overrides, moved = sectioned(overrides or {}, "overrides")
    for key in moved:
        warnings.warn(f"resolve(overrides={{{key!r}: ...}}) is deprecated; use the section: {'.'.join(FLAT[key])}",
                      DeprecationWarning, stacklevel=2)
    layers.append(asked_overrides)
    merged = merge(*layers)
    model = merged.get("model", {})
    objective = merged.get("objective", {})
    dense = objective.get("kind") in DENSE_OBJECTIVES
    default = DENSE_PRESETS.get(objective.get("dense_head") or "linear", "dense-linear") if dense \
        else DEFAULT_PRESETS[bool(model.get("init"))]
    base = RECIPE_PRESETS[name] if name else unsized(RECIPE_PRESETS[default], bool(model.get("name")))
    if model.get("init"):
        base = {**base, "model": {key: value for key, value in base.get("model", {}).items()
                                  if key not in ARCHITECTURE}}
    return Recipe.from_dict(merge(base, *layers), str(config_file) if config_file else None)


# ------------------------------------------------------------------------------------------- command line
RECIPE_FILE = "recipe.json"  # the resolved recipe, in the run's folder
MODEL_ARGS_FLAG = FLAG_PREFIX + "model.args"  # the destination of --set, --model-args and --drop-path


def add_recipe_flags(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """One flag per recipe field (``--lr``, ``--batch-size``, ...: the field's flat name), in a help group per
    section, generated from the declarations; returns the groups, so that the caller adds the model's
    ``--set``/``--model-args`` flags (destination ``MODEL_ARGS_FLAG``) to the model's."""
    return add_flags(parser, SECTIONS.items(), title="recipe: ", skip={"model.args"})


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    """The recipe a train/finetune command line describes: ``--preset`` < ``--config`` < the recipe flags;
    ``--resume`` starts from the run's own ``recipe.json`` so that the continued run is the same run."""
    overrides = flag_values(args)
    if getattr(args, "checkpoint", None):
        overrides.setdefault("model", {})["init"] = args.checkpoint
    run_dir = overrides.get("run", {}).get("dir")
    saved = Path(run_dir or "") / RECIPE_FILE
    if args.resume and run_dir is not None and saved.is_file():
        return Recipe.from_dict(merge(read_config_file(saved), overrides), str(saved))
    if args.resume:
        raise ConfigError("--resume needs --run-dir with the run to continue (a folder holding recipe.json)")
    return resolve(args.preset, args.config, overrides)
