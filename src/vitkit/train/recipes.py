"""Recipes: every setting of a run in one JSON-serialisable dataclass, with the paper's as presets.

A run is ``preset`` < config file (YAML or JSON) < command-line overrides; the resolved recipe is
written to ``run_dir/recipe.json`` so that a run can be repeated or resumed exactly.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.config import check_keys


@dataclass
class Recipe:
    # data
    dataset: str = "digits"
    data_dir: str | None = None
    val_fraction: float = 0.1
    train_subset: int = 0  # >0: train on this many images only (quick checks)
    corrupt: str = "fail"  # image folders: 'fail' on an unreadable file, or 'skip' it
    num_workers: int = 0
    threads: int = 0  # intra-op CPU threads; 0: torch's default. Small models run best on 1.
    # model: a named variant ('ViT-B/16') or '' for a custom one, plus ViTConfig overrides
    model: str = ""
    model_args: dict[str, Any] = field(default_factory=dict)
    image_size: int = 8
    init: str | None = None  # fine-tune from this checkpoint (anything vitkit.load reads)
    # objective: 'classification', or 'mpp' (masked patch prediction, self-supervised, labels unused)
    objective: str = "classification"
    mpp_target: str = "mean-colour"  # or 'downsized' (4x4, 3 bits each), 'pixels' (L2)
    mpp_bits: int = 3
    mpp_ratio: float = 0.5  # share of patches corrupted; of those 80% [mask], 10% random, 10% kept
    mpp_mask_prob: float = 0.8
    mpp_random_prob: float = 0.1
    # transforms
    transform: str = "pretrain"  # 'pretrain' (Inception crop) or 'finetune' (resize + crop)
    crop_scale: tuple[float, float] = (0.08, 1.0)
    hflip: bool = True
    aug_level: str = "none"  # AugReg: none, light1, light2, medium1, medium2, strong1, strong2
    cutmix_alpha: float = 0.0
    normalization: str = ""  # 'google' or 'imagenet'; '': the checkpoint's when fine-tuning, else 'google'
    # optimisation
    steps: int = 0  # 0: derived from epochs
    epochs: float = 1.0
    batch_size: int = 128  # global batch, split over ranks and accumulation steps
    accum_steps: int = 1
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.9
    schedule: str = "cosine"
    warmup_steps: int = 0
    end_lr: float = 0.0
    clip_norm: float = 1.0
    label_smoothing: float = 0.0
    precision: str = "fp32"
    ema_decay: float = 0.0
    grad_checkpointing: bool = False
    compile: bool = False
    parallel: str = "ddp"  # under torchrun: 'ddp' (a replica per rank) or 'fsdp' (sharded, large variants)
    seed: int = 0
    # bookkeeping
    run_dir: str = ""
    log_every: int = 20
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_last: int = 2
    eval_batch_size: int = 256

    def replace(self, **changes: Any) -> "Recipe":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Recipe":
        check_keys(cls, data, "recipe")
        data = {k: tuple(v) if isinstance(v, list) and k in ("crop_scale", "betas") else v for k, v in data.items()}
        return cls(**data)


_GREY_28 = dict(image_size=28, model_args=dict(patch_size=4, dim=64, depth=4, num_heads=4, mlp_dim=128, in_chans=1,
                                               pool="gap"),
                transform="finetune", epochs=6, batch_size=128, lr=2e-3, weight_decay=0.05, warmup_steps=300,
                label_smoothing=0.1, val_fraction=0.02)
PRESETS: dict[str, dict[str, Any]] = {
    # The default of `vitkit train`: >= 95% test accuracy on 8x8 digits in about two minutes on 2 cores.
    "digits": dict(dataset="digits", image_size=8, threads=1, model_args=dict(patch_size=2, dim=64, depth=4,
                   num_heads=4, mlp_dim=128, in_chans=1, pool="gap"), transform="pretrain", crop_scale=(0.5, 1.0),
                   hflip=False, epochs=100, batch_size=64, lr=3e-3, weight_decay=0.05, warmup_steps=100,
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


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A recipe (or part of one) from YAML or JSON; a ``preset`` key names the preset it starts from."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of recipe fields, got {type(data).__name__}")
    return data


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win; ``model_args`` are merged key by key, so one override keeps the rest."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            merged[key] = {**merged.get(key, {}), **value} if key == "model_args" else value
    return merged


# What a preset says about the architecture; a run from a checkpoint (``init``) has the checkpoint's.
ARCHITECTURE = ("model", "model_args")


def resolve(preset: str | None = None, config_file: str | Path | None = None,
            overrides: dict[str, Any] | None = None) -> Recipe:
    """Preset, then config file, then overrides. When the run starts from a checkpoint, the preset's
    architecture is left out: it describes a fresh model, and a fine-tuning run may start from any preset."""
    layers = [read_config_file(config_file)] if config_file else []
    name = preset or (layers[0].pop("preset", None) if layers else None) or "digits"
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    layers.append(overrides or {})
    merged = merge(PRESETS[name], *layers)
    if merged.get("init"):
        merged = merge({key: value for key, value in PRESETS[name].items() if key not in ARCHITECTURE}, *layers)
    return Recipe.from_dict(merged)
