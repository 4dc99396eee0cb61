"""Run a recipe end to end: data, model (fresh or fine-tuned from a checkpoint), the loop, and the
final evaluation on the test split."""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_file
from ..checkpoints import load
from ..data import (SplitSpec, StepSampler, Transformed, build_transform, checkpoint_transform, eval_loader,
                    load_dataset, step_loader, trained_normalization, trained_statistics)
from ..data.transforms import augreg_level
from ..evaluate.metrics import Evaluation, evaluate, write_report
from ..models import ViTConfig, VisionTransformer, create_model
from .distributed import setup, shard
from .loop import LoopConfig, Trainer
from .mpp import MaskedPatchPrediction
from .objectives import Classification, MaskedPatches
from .optim import learning_rate, make_optimizer
from .recipes import Recipe

RECIPE_FILE = "recipe.json"


def build_model(recipe: Recipe, classes: list[str]) -> VisionTransformer:
    """A fresh model, or (``recipe.init``) a checkpoint prepared for fine-tuning as in section 3.2:
    position embeddings interpolated to the new resolution, pre-logits dropped, a new zero head."""
    size = recipe.image_size
    if recipe.init:
        model = load(recipe.init, image_size=size, **recipe.model_args)
        model.reset_head(len(classes))
    elif recipe.model:
        model = create_model(recipe.model, image_size=size, num_classes=len(classes), **recipe.model_args)
    else:
        model = VisionTransformer(ViTConfig(image_size=size, num_classes=len(classes), **recipe.model_args))
    family = recipe.normalization or (trained_normalization(model.config) if recipe.init else "google")
    extra = {**model.config.extra, "classes": list(classes), "normalization": family}
    model.config = model.config.replace(extra=extra)
    model.grad_checkpointing = recipe.grad_checkpointing
    return model


def default_run_dir(recipe: Recipe) -> str:
    tag = recipe.dataset.split(":")[-1].strip("/").replace("/", "-")[-40:]
    return f"runs/{tag}-{time.strftime('%Y%m%d-%H%M%S')}"


def total_steps(recipe: Recipe, train_size: int) -> int:
    return recipe.steps or max(1, math.ceil(recipe.epochs * (train_size // recipe.batch_size)))


@dataclass
class Experiment:
    """A recipe made concrete: the trainer, the class names and how to measure a model on a split."""

    recipe: Recipe
    run_dir: Path
    trainer: Trainer
    classes: list[str]
    measure: Callable[[VisionTransformer, str], Evaluation]


def prepare(recipe: Recipe, device: str | None = None) -> Experiment:
    """Data, model, optimiser, schedule and objective of ``recipe``, wired into a ``Trainer`` on ``device``
    (default: a GPU when there is one)."""
    env = setup(device)
    if recipe.threads:
        torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    run_dir = Path(recipe.run_dir or default_run_dir(recipe))
    spec = SplitSpec(recipe.val_fraction, seed=0)

    def split(name: str):
        return load_dataset(recipe.dataset, name, recipe.data_dir, spec, recipe.corrupt)

    train_set = split("train")
    if recipe.train_subset:
        keep = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(recipe.seed))
        train_set = train_set.subset(keep[:recipe.train_subset].sort().values, f"{train_set.name}[subset]")
    classes = train_set.classes
    if recipe.objective not in ("classification", "mpp"):
        raise ValueError(f"objective={recipe.objective!r}, expected 'classification' or 'mpp'")
    pretraining = recipe.objective == "mpp"
    model = build_model(recipe, [] if pretraining else classes)
    config = model.config
    if pretraining:  # the encoder learns from the images alone; a head is put on at fine-tuning
        model = MaskedPatchPrediction(model, recipe.mpp_target, recipe.mpp_bits, recipe.mpp_ratio,
                                      recipe.mpp_mask_prob, recipe.mpp_random_prob, *trained_statistics(config))
    model = shard(model.to(env.device), env, recipe.parallel)
    if env.rank:  # the same initial weights everywhere, then a random stream per rank (dropout, masking)
        torch.manual_seed(recipe.seed + env.rank)
    train_transform = build_transform(recipe.transform, config.image_size, config.in_chans,
                                      trained_normalization(config), recipe.hflip, recipe.crop_scale, recipe.aug_level)
    eval_transform = checkpoint_transform(config)
    steps = total_steps(recipe, len(train_set))
    training_images = Transformed(train_set, train_transform, recipe.seed)

    def batches(start_step: int):
        sampler = StepSampler(len(train_set), recipe.batch_size, steps, seed=recipe.seed, start_step=start_step,
                              accum_steps=recipe.accum_steps, rank=env.rank, world_size=env.world_size)
        return step_loader(training_images, sampler, recipe.num_workers)

    def measure(network: VisionTransformer, split_name: str) -> Evaluation:
        dataset = Transformed(split(split_name), eval_transform)
        loader = eval_loader(dataset, recipe.eval_batch_size, recipe.num_workers)
        return evaluate(network, loader, len(classes), env.device)

    def validate(network: VisionTransformer) -> dict[str, float]:
        return measure(network, "val").summary("val") if recipe.val_fraction > 0 and not pretraining else {}

    optimizer = make_optimizer(model, recipe.optimizer, recipe.lr, recipe.weight_decay, recipe.betas, recipe.momentum)
    lr_at = functools.partial(learning_rate, base_lr=recipe.lr, total_steps=steps, warmup_steps=recipe.warmup_steps,
                              decay=recipe.schedule, end_lr=recipe.end_lr)
    _, mixup_alpha = augreg_level(recipe.aug_level)
    objective = MaskedPatches() if pretraining else \
        Classification(len(classes), recipe.label_smoothing, mixup_alpha, recipe.cutmix_alpha)
    loop = LoopConfig(total_steps=steps, accum_steps=recipe.accum_steps, clip_norm=recipe.clip_norm,
                      precision=recipe.precision, ema_decay=recipe.ema_decay, log_every=recipe.log_every,
                      eval_every=recipe.eval_every, checkpoint_every=recipe.checkpoint_every,
                      keep_last=recipe.keep_last, compile=recipe.compile)
    trainer = Trainer(model, objective, optimizer, lr_at, batches, run_dir, loop, validate, env)
    return Experiment(recipe, run_dir, trainer, classes, measure)


def run(recipe: Recipe, resume: bool = False, device: str | None = None) -> dict[str, Any]:
    """Train (or fine-tune) as ``recipe`` says, then save the final model and evaluate it on the test
    split; returns the summary also written to ``summary.json``."""
    experiment = prepare(recipe, device)
    trainer, run_dir = experiment.trainer, experiment.run_dir
    if trainer.env.is_main:
        with atomic_file(run_dir / RECIPE_FILE) as handle:
            json.dump(recipe.to_dict(), handle, indent=1)
    started = time.perf_counter()
    last = trainer.fit(resume=resume)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": trainer.config.total_steps,
                               "train_seconds": round(time.perf_counter() - started, 1),
                               **{k: v for k, v in last.items() if not k.startswith("train/images")}}
    with trainer.final_model() as final:
        if trainer.env.is_main:
            final.save(run_dir / "model")
            if recipe.objective == "classification":
                report = write_report(experiment.measure(final, "test"), experiment.classes, run_dir, "test")
                summary.update({"test/accuracy": report["top1"], "test/top5": report["top5"],
                                "test/images": report["images"]})
            with atomic_file(run_dir / "summary.json") as handle:
                json.dump(summary, handle, indent=1)
    trainer.env.barrier()
    return summary
