"""Time to accuracy: vitkit's small-data presets against timm's own training tasks, side by side in one run on one
machine (results: benchmarks/results/time_to_accuracy.md and .json).

    PYTHONPATH=src python benchmarks/time_to_accuracy.py mnist cifar distill [--threads 2] [--data-dir ../shared/data]

Each scenario trains the same ViT (vitkit's preset's depth, width, patch and image size; timm's
``VisionTransformer`` built to match, checked by loading vitkit's freshly made weights into it with strict=True) on
the same images (vitkit's train/test split; timm reads the same uint8 arrays through a torch ``DataLoader``) under
the same wall-clock budget, with the same torch threads:

- vitkit: ``vitkit.train.run`` of the preset (``vitkit train --preset NAME`` in-process), its schedule as the
  preset fixes it;
- timm: ``timm.task.ClassificationTask`` (``TokenDistillationTask`` for the distilled case) in the loop of timm's
  train.py: ``create_optimizer_v2``, ``create_scheduler_v2`` stepped per update, ``Mixup`` where the preset
  mixes, ``dispatch_clip_grad``, ``ModelEmaV3`` through the task where the preset averages, the preset's
  augmentations through timm's ``create_transform`` (or equivalent torchvision transforms where timm has no such
  step), ``RepeatAugSampler`` where the preset repeats. Its number of epochs is sized to the budget from its own
  speed, measured in this run just before (a generous choice: its schedule ends as the budget does).

Both clocks start before the data is read and exclude only the checkpoint evaluations (every ``every_s`` seconds
of training, on the test split, with the EMA weights where there are some), so "accuracy at T s" is what each
side had after T s of its own work. Time to target: the first checkpoint (or the end of the run) at or above the
target, an upper bound at the checkpoints' resolution.

The distillation scenario first trains a CNN teacher (timm's ``resnet18`` with timm's ClassificationTask, on the
same images), then distils the preset's student from it with vitkit (``--objective distill``, hard, alpha 0.5) at
the preset's steps, against the same student trained without a teacher, and timm's TokenDistillationTask on its
budget; the students pool the [class] token, as DeiT's do.

``--tune`` runs one side of one scenario with recipe changes (``--set SECTION.FIELD=JSON``) and checkpoints every
``--every-steps`` steps: how the presets were tuned (accuracy by steps does not depend on the machine's load).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitkit.atomic import atomic_file
from vitkit.data import SplitSpec
from vitkit.data.survey import image_geometry
from vitkit.data.transforms import augreg_level
from vitkit.normalization import normalization
from vitkit.train import resolve
from vitkit.train.presets import merge
from vitkit.train.run import TRAINING, build_model, evaluated_splits, training_splits

from timing import cpu_model, repo_relative

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = Path("runs/bench/time_to_accuracy")
TRAIN_RUN = importlib.import_module("vitkit.train.run")  # the module (``vitkit.train.run`` is also the function)


@dataclass
class Scenario:
    name: str
    preset: str
    budget_s: float
    every_s: float
    target: float
    why_target: str
    title: str = ""


SCENARIOS = {
    "mnist": Scenario("mnist", "mnist-fast", 120, 20, 0.99, "the goal of the mnist-fast preset",
                      "MNIST, 120 s budget"),
    "cifar": Scenario("cifar", "cifar10-small", 600, 60, 0.60, "passed by the preset's tuning runs after 3,000 "
                      "steps", "CIFAR-10 subset, 10-minute budget"),
}


# --------------------------------------------------------------------------------------------------------- clocks
class Clock:
    """Wall seconds since start, less the time spent paused (the checkpoint evaluations)."""

    def __init__(self) -> None:
        self.started, self.paused_for = time.perf_counter(), 0.0

    def seconds(self) -> float:
        return time.perf_counter() - self.started - self.paused_for

    @contextlib.contextmanager
    def paused(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.paused_for += time.perf_counter() - began


class Checkpoints:
    """When to measure: every ``every_s`` seconds of a clock (or every ``every_steps`` steps), each measurement's
    time kept off the clock."""

    def __init__(self, clock: Clock, every_s: float = 0, every_steps: int = 0) -> None:
        self.clock, self.every_s, self.every_steps = clock, every_s, every_steps
        self.next_s, self.points = every_s, []

    def due(self, step: int) -> bool:
        if self.every_steps:
            return step % self.every_steps == 0
        return bool(self.every_s) and self.clock.seconds() >= self.next_s

    def record(self, step: int, images: int, measure) -> None:
        seconds = self.clock.seconds()
        with self.clock.paused():
            accuracy = measure()
        while self.every_s and self.next_s <= seconds:
            self.next_s += self.every_s
        self.points.append({"seconds": round(seconds, 1), "step": step, "images": images,
                            "test_accuracy": accuracy, "eval_seconds": round(self.clock.paused_for, 1)})
        print(f"   {seconds:7.1f} s  step {step:6d}  test {100 * accuracy:6.2f}%", flush=True)


def first_at(points: list[dict], target: float) -> float | None:
    return next((point["seconds"] for point in points if point["test_accuracy"] >= target), None)


def at_time(points: list[dict], seconds: float) -> float | None:
    """The accuracy of the last checkpoint at or before ``seconds`` of training."""
    before = [point for point in points if point["seconds"] <= seconds + 0.5]
    return before[-1]["test_accuracy"] if before else None


# --------------------------------------------------------------------------------------------------------- data
def recipe_for(scenario: Scenario, data_dir: str, threads: int, changes: dict, run_dir: Path):
    dataset = {"data_dir": data_dir}
    if scenario.name.startswith("cifar"):
        dataset["dataset"] = "npz:" + str(Path(data_dir) / "cifar10-subset" / "cifar10_subset.npz")
    return resolve(scenario.preset, overrides=merge({"data": dataset, "run": {"dir": str(run_dir), "threads": threads,
                                                                                "log_every": 100}}, changes))


def splits_of(recipe) -> tuple[Any, Any]:
    """The training images and the test split exactly as vitkit's run takes them (same held-out validation)."""
    splits = training_splits(recipe, evaluated_splits(recipe, False), SplitSpec(recipe.data.val_fraction, seed=0))
    return splits[TRAINING], splits["test"]


# --------------------------------------------------------------------------------------------------------- vitkit
def run_vitkit(recipe, every_s: float = 0, every_steps: int = 0) -> dict:
    """``vitkit train`` of ``recipe`` in this process, measured on the test split at the checkpoints."""
    shutil.rmtree(recipe.run.dir, ignore_errors=True)
    load_before = load()
    clock = Clock()
    checkpoints = Checkpoints(clock, every_s, every_steps)
    original = TRAIN_RUN.prepare
    counts = {"images": 0}

    def prepare(recipe, device=None):
        experiment = original(recipe, device)
        trainer, step = experiment.trainer, experiment.trainer._train_step

        def measure() -> float:
            with trainer.final_model() as model:
                accuracy = experiment.measure(model, experiment.final_split).top1
            trainer.model.train()
            return accuracy

        def train_step(*args, **kwargs):
            metrics = step(*args, **kwargs)
            counts["images"] += int(metrics["train/images"])
            if checkpoints.due(trainer.step) and trainer.step < trainer.config.total_steps:
                checkpoints.record(trainer.step, counts["images"], measure)
            return metrics

        trainer._train_step = train_step
        counts["steps"] = trainer.config.total_steps
        return experiment

    TRAIN_RUN.prepare = prepare
    try:
        summary = TRAIN_RUN.run(recipe)
    finally:
        TRAIN_RUN.prepare = original
    seconds = clock.seconds()
    final = {"seconds": round(seconds, 1), "step": summary["steps"], "images": counts["images"],
             "test_accuracy": summary["test/accuracy"], "eval_seconds": round(clock.paused_for, 1)}
    print(f"   {seconds:7.1f} s  step {summary['steps']:6d}  test {100 * summary['test/accuracy']:6.2f}% (end)",
          flush=True)
    return {"side": "vitkit", "points": checkpoints.points + [final], "final": final,
            "train_seconds": summary["train_seconds"], "steps": summary["steps"], "load": [load_before, load()]}


# --------------------------------------------------------------------------------------------------------- timm
ARCHITECTURE_FIELDS = ("image_size", "patch_size", "in_chans", "num_classes", "dim", "depth", "num_heads", "mlp_dim",
                       "qkv_bias", "class_token", "dist_token", "pool", "fc_norm", "backbone", "backbone_width", "gn_groups")


def timm_model_like(vitkit_model, distilled: bool = False):
    """timm's VisionTransformer (VisionTransformerDistilled; a hybrid through timm's HybridEmbed and ResNetV2 stem)
    of the same architecture as ``vitkit_model``, freshly initialised by timm. Checked: vitkit reads timm's weights
    back as a model whose architecture fields are the preset's and whose logits are timm's, with as many
    parameters."""
    from functools import partial

    import vitkit
    from safetensors.torch import save_file
    from timm.layers import GroupNormAct, HybridEmbed, StdConv2dSame
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem
    from timm.models.vision_transformer import VisionTransformer

    config = vitkit_model.config
    kwargs = dict(img_size=tuple(config.image_size), patch_size=config.patch_size, in_chans=config.in_chans,
                  num_classes=config.num_classes, embed_dim=config.dim, depth=config.depth,
                  num_heads=config.num_heads, mlp_ratio=config.mlp_dim / config.dim, qkv_bias=config.qkv_bias,
                  class_token=config.class_token, global_pool="avg" if config.pool == "gap" else "token",
                  fc_norm=config.fc_norm, drop_path_rate=config.drop_path)
    conv = partial(StdConv2dSame, eps=1e-8)  # timm's hybrids: weight standardisation sqrt(var + 1e-8)
    norm = partial(GroupNormAct, num_groups=config.gn_groups)

    def make():
        extra = {}
        if config.backbone is not None:
            if config.backbone:
                backbone = ResNetV2(layers=config.backbone, channels=tuple(4 * config.backbone_width * 2 ** i
                                                                          for i in range(len(config.backbone))),
                                    num_classes=0, global_pool="", in_chans=config.in_chans, preact=False,
                                    stem_type="same", stem_chs=config.backbone_width, conv_layer=conv, norm_layer=norm)
            else:
                backbone = create_resnetv2_stem(config.in_chans, out_chs=config.backbone_width, stem_type="same",
                                                preact=False, conv_layer=conv, norm_layer=norm)
            extra["embed_layer"] = partial(HybridEmbed, backbone=backbone)
        return (VisionTransformerDistilled if distilled else VisionTransformer)(**kwargs, **extra)

    model = make()
    path = RUNS / "architecture-check.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(path))
    read = vitkit.load(str(path), num_heads=config.num_heads, pool=config.pool)
    path.unlink()
    for name in ARCHITECTURE_FIELDS:
        mine, theirs = getattr(config, name), getattr(read.config, name)
        assert mine == theirs, f"timm's model differs from the preset's in {name}: {theirs} against {mine}"
    x = torch.randn(2, config.in_chans, *config.image_size)
    with torch.no_grad():
        ours, peer = read.eval()(x), model.eval()(x)
        torch.testing.assert_close(ours, peer if not isinstance(peer, tuple) else (peer[0] + peer[1]) / 2,
                                   atol=1e-4, rtol=0)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in vitkit_model.parameters())
    fresh = make()  # timm's own initialisation, not the weights checked above
    mean, std = config.input_statistics
    fresh.pretrained_cfg = {"mean": tuple(mean), "std": tuple(std)}  # the student's normalisation (TokenDistillation)
    return fresh, {**kwargs, **({"embed_layer": f"HybridEmbed(ResNetV2 {config.backbone or 'stem'}, width "
                                                f"{config.backbone_width})"} if config.backbone is not None else {})}


class Images(torch.utils.data.Dataset):
    """uint8 (N, C, H, W) images and labels through a per-image transform (PIL for timm's, tensors otherwise)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform, pil: bool) -> None:
        self.images, self.labels, self.transform, self.pil = images, labels, transform, pil

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.pil:
            from PIL import Image
            array = image.permute(1, 2, 0).numpy()
            image = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
        return self.transform(image), int(self.labels[index])


def timm_transforms(recipe, size: tuple[int, int], channels: int) -> tuple[Any, bool, str]:
    """The training transform of timm's side matching the recipe's augment section: timm's create_transform for the
    Inception crop (``pretrain``) with RandAugment and random erasing; torchvision's pad-and-crop for ``finetune``,
    which timm's factory lacks. Returns (transform, takes PIL, description)."""
    from torchvision.transforms import v2
    from timm.data import create_transform

    augment = recipe.augment
    mean, std = normalization(augment.normalization or "google", channels)
    randaug, _ = augreg_level(augment.aug_level)
    if augment.transform == "pretrain":
        # torchvision's RandAugment magnitude m of 31 bins is timm's m * 10 / 30 (timm's scale tops at 10)
        auto = f"rand-m{round(randaug[1] * 10 / 30)}-n{randaug[0]}" if randaug else None
        transform = create_transform(tuple(size), is_training=True, scale=tuple(augment.crop_scale), ratio=(3 / 4, 4 / 3),
                                     hflip=0.5 if augment.hflip else 0.0, color_jitter=None, auto_augment=auto,
                                     interpolation="bilinear", mean=mean, std=std, re_prob=augment.random_erasing,
                                     re_mode="pixel", re_count=1)
        said = (f"timm create_transform: RandomResizedCrop scale {tuple(augment.crop_scale)}, "
                f"hflip {0.5 if augment.hflip else 0}, auto_augment {auto}, random erasing p={augment.random_erasing} "
                f"(pixel mode), no colour jitter")
        return transform, True, said
    if augment.transform != "finetune" or randaug or augment.random_erasing:
        raise SystemExit(f"no timm counterpart written for the augment section {augment}")
    pad = max(1, min(size) // 8)
    steps = [v2.RandomCrop(list(size), padding=pad)] + ([v2.RandomHorizontalFlip()] if augment.hflip else [])
    transform = v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    return transform, False, (f"torchvision v2: RandomCrop {size[0]} with padding {pad}"
                              f"{', hflip' if augment.hflip else ''}, ToDtype, Normalize (timm's factory has no "
                              f"pad-and-crop)")


def normalised(images: torch.Tensor, channels: int, family: str, size: tuple[int, int]) -> torch.Tensor:
    """The test images as both sides' evaluation sees them: resized to the model's size (bilinear, antialiased, as
    vitkit's evaluation transform does at crop_pct 1) and normalised."""
    from torchvision.transforms.v2 import functional as TF

    if tuple(images.shape[-2:]) != tuple(size):
        images = TF.resize(images, list(size), antialias=True)
    mean, std = normalization(family, channels)
    return (images.float() / 255 - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


@torch.no_grad()
def accuracy_of(model, images: torch.Tensor, labels: torch.Tensor, batch: int = 512) -> float:
    was = model.training
    model.eval()
    right = 0
    for start in range(0, len(images), batch):
        logits = model(images[start:start + batch])
        if isinstance(logits, tuple):
            logits = (logits[0] + logits[1]) / 2
        right += int((logits.argmax(-1) == labels[start:start + batch]).sum())
    model.train(was)
    return right / len(images)


def timm_setup(recipe, epochs: float, teacher=None, workers: int = 0, seed: int = 0) -> dict:
    """Data, model, task, optimiser, scheduler, Mixup and EMA of timm's side for ``recipe``, as train.py builds them."""
    from timm.data import Mixup
    from timm.data.distributed_sampler import RepeatAugSampler
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.task import ClassificationTask, TokenDistillationTask

    torch.manual_seed(seed)
    train_set, test_set = splits_of(recipe)
    classes = train_set.classes
    vitkit_model = build_model(recipe, classes, image_geometry(train_set), say=False)
    config = vitkit_model.config
    model, kwargs = timm_model_like(vitkit_model, distilled=teacher is not None)
    size, channels = tuple(config.image_size), config.in_chans
    transform, pil, said = timm_transforms(recipe, size, channels)
    family = recipe.augment.normalization or "google"
    test_images = normalised(test_set.images, channels, family, size)
    test_labels = test_set.labels
    dataset = Images(train_set.images, train_set.labels, transform, pil)
    batch = recipe.schedule.batch_size
    repeats = recipe.augment.repeated_aug
    sampler = RepeatAugSampler(dataset, num_replicas=1, rank=0, num_repeats=repeats, selected_round=batch) \
        if repeats > 1 else torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                                         drop_last=True, persistent_workers=workers > 0)
    updates = len(loader)
    _, mixup_alpha = augreg_level(recipe.augment.aug_level)
    smoothing = recipe.objective.label_smoothing
    mixing = mixup_alpha > 0 or recipe.augment.cutmix_alpha > 0
    mixup = Mixup(mixup_alpha=mixup_alpha, cutmix_alpha=recipe.augment.cutmix_alpha, label_smoothing=smoothing,
                  num_classes=len(classes)) if mixing else None
    criterion = dict(soft_targets=True) if mixing else dict(smoothing=smoothing)
    if teacher is None:
        task = ClassificationTask(model, criterion_kwargs=criterion, verbose=False)
    else:
        goal = recipe.objective
        task = TokenDistillationTask(model, teacher, criterion_kwargs=criterion, distill_type=goal.distill_kind or "hard",
                                     task_loss_weight=1 - goal.distill_alpha, temperature=goal.distill_temperature,
                                     verbose=False)
    optim = recipe.optim
    optimizer = create_optimizer_v2(model, opt=optim.optimizer, lr=optim.lr, weight_decay=optim.weight_decay,
                                    betas=tuple(optim.betas) if optim.optimizer == "adamw" else None,
                                    momentum=optim.momentum)
    warmup_epochs = recipe.schedule.warmup_steps / updates
    scheduler, _ = create_scheduler_v2(optimizer, sched=recipe.schedule.decay, num_epochs=max(1, math.ceil(epochs)),
                                       warmup_epochs=warmup_epochs, warmup_lr=0.0, min_lr=recipe.schedule.end_lr,
                                       step_on_epochs=False, updates_per_epoch=updates)
    total_updates = round(epochs * updates)
    scheduler.t_initial = total_updates  # epochs need not be whole: the cosine ends at the last update
    if optim.ema_decay:
        task.setup_ema(decay=optim.ema_decay)
    return dict(task=task, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, mixup=mixup,
                test=(test_images, test_labels), updates=updates, total_updates=total_updates, transform=said,
                kwargs=kwargs, train_size=len(train_set), sampler=sampler)


def timm_step(parts: dict, images: torch.Tensor, labels: torch.Tensor, clip: float, update: int) -> float:
    from timm.utils import dispatch_clip_grad

    task, optimizer = parts["task"], parts["optimizer"]
    if parts["mixup"] is not None:
        images, labels = parts["mixup"](images, labels)
    output = task(images, labels)
    optimizer.zero_grad()
    output["loss"].backward()
    if clip:
        dispatch_clip_grad(task.get_clip_parameters(), value=clip, mode="norm")
    optimizer.step()
    task.update_ema(step=update)
    parts["scheduler"].step_update(num_updates=update)
    return output["loss"]


def timm_rate(recipe, seconds: float, teacher=None, workers: int = 0) -> float:
    """Updates per second of timm's side on this machine now (a short run, not recorded as a result)."""
    parts = timm_setup(recipe, epochs=1, teacher=teacher, workers=workers)
    parts["task"].train()
    clip = recipe.optim.clip_norm
    done, started = 0, None
    for images, labels in parts["loader"]:
        timm_step(parts, images, labels, clip, done + 1)
        done += 1
        if done == 3:
            started = time.perf_counter()
        elif started and time.perf_counter() - started >= seconds:
            break
    return (done - 3) / (time.perf_counter() - started)


def run_timm(recipe, epochs: float, every_s: float = 0, every_steps: int = 0, teacher=None, workers: int = 0,
             budget_s: float | None = None) -> dict:
    """timm's side: a train.py-style loop over its task for ``epochs``, measured at the checkpoints, stopped at
    ``budget_s`` of its clock if it gets there first."""
    load_before = load()
    clock = Clock()
    checkpoints = Checkpoints(clock, every_s, every_steps)
    parts = timm_setup(recipe, epochs, teacher, workers, seed=recipe.run.seed)
    task, (test_images, test_labels) = parts["task"], parts["test"]
    clip = recipe.optim.clip_norm

    def measure() -> float:
        return accuracy_of(task.get_eval_model(ema=task.has_ema()), test_images, test_labels)

    task.train()
    update, images_seen, stopped = 0, 0, False
    epoch = 0
    while update < parts["total_updates"] and not stopped:
        if hasattr(parts["sampler"], "set_epoch"):
            parts["sampler"].set_epoch(epoch)
        for images, labels in parts["loader"]:
            timm_step(parts, images, labels, clip, update + 1)
            update += 1
            images_seen += len(images)
            if update >= parts["total_updates"]:
                break
            if budget_s and clock.seconds() >= budget_s:
                stopped = True
                break
            if checkpoints.due(update):
                checkpoints.record(update, images_seen, measure)
        epoch += 1
    accuracy = measure()
    seconds = clock.seconds()
    final = {"seconds": round(seconds, 1), "step": update, "images": images_seen, "test_accuracy": accuracy,
             "eval_seconds": round(clock.paused_for, 1)}
    print(f"   {seconds:7.1f} s  step {update:6d}  test {100 * accuracy:6.2f}% (end{', budget' if stopped else ''})",
          flush=True)
    return {"side": "timm", "points": checkpoints.points + [final], "final": final, "steps": update,
            "epochs": round(epochs, 2), "stopped_at_budget": stopped, "transform": parts["transform"],
            "timm_model_kwargs": {k: (list(v) if isinstance(v, tuple) else v) for k, v in parts["kwargs"].items()},
            "task": type(task).__name__, "load": [load_before, load()]}


# --------------------------------------------------------------------------------------------------------- teacher
TEACHER_ARCH = "resnet18"


def train_teacher(recipe, epochs: int, path: Path, workers: int = 0) -> dict:
    """A CNN teacher for the distillation runs: timm's ``resnet18`` (ImageNet layout: 7x7 stride-2 stem and max
    pool, so a 1x1 map after the last stage at 32 px) trained from scratch with timm's ClassificationTask on the
    same training images: SGD (momentum 0.9, nesterov) lr 0.1, weight decay 5e-4, cosine per update after one
    epoch of warm-up, batch 128, label smoothing 0.1, random crops with 4 px padding and flips (the classic CIFAR
    ResNet recipe), in ImageNet normalisation (what timm's resnet18 declares, so what vitkit and timm's
    DistillationTeacher bring the student's images to). Written as a safetensors file for
    ``--distill-teacher timm:resnet18=PATH``."""
    import timm
    from safetensors.torch import save_file
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.task import ClassificationTask
    from torchvision.transforms import v2

    started = time.perf_counter()
    torch.manual_seed(0)
    train_set, test_set = splits_of(recipe)
    model = timm.create_model(TEACHER_ARCH, pretrained=False, num_classes=len(train_set.classes))
    mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
    transform = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize(mean, std)])
    loader = torch.utils.data.DataLoader(Images(train_set.images, train_set.labels, transform, False), batch_size=128,
                                         shuffle=True, drop_last=True, num_workers=workers,
                                         generator=torch.Generator().manual_seed(0))
    task = ClassificationTask(model, criterion_kwargs=dict(smoothing=0.1), verbose=False)
    optimizer = create_optimizer_v2(model, opt="sgd", lr=0.1, weight_decay=5e-4, momentum=0.9)
    scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=epochs, warmup_epochs=1, warmup_lr=0.0,
                                       step_on_epochs=False, updates_per_epoch=len(loader))
    test_images = (test_set.images.float() / 255 - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    update = 0
    task.train()
    for epoch in range(epochs):
        for images, labels in loader:
            loss = task(images, labels)["loss"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            update += 1
            scheduler.step_update(num_updates=update)
        if (epoch + 1) % 10 == 0 or epoch + 1 == epochs:
            print(f"   teacher epoch {epoch + 1}: test {100 * accuracy_of(model, test_images, test_set.labels):.2f}%",
                  flush=True)
    accuracy = accuracy_of(model, test_images, test_set.labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(path))
    return {"architecture": f"timm {TEACHER_ARCH}", "epochs": epochs, "updates": update,
            "test_accuracy": accuracy, "seconds": round(time.perf_counter() - started, 1),
            "path": repo_relative(path), "normalisation": "ImageNet (timm's pretrained_cfg)"}


def load_teacher_module(path: Path, classes: int):
    import timm
    from safetensors.torch import load_file

    model = timm.create_model(TEACHER_ARCH, pretrained=False, num_classes=classes)
    model.load_state_dict(load_file(str(path)))
    return model.eval()


# --------------------------------------------------------------------------------------------------------- records
def machine() -> dict:
    import timm
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "machine": platform.machine(), "torch": torch.__version__,
            "timm": timm.__version__, "python": platform.python_version()}


def load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def wait_for_quiet(limit: float, most_s: float) -> dict:
    """Poll the load average every minute until it is at most ``limit`` or ``most_s`` have passed."""
    began, seen = time.monotonic(), [load()]
    while seen[-1][0] > limit and time.monotonic() - began < most_s:
        print(f"load {seen[-1]} above {limit}: waiting", flush=True)
        time.sleep(60)
        seen.append(load())
    return {"limit": limit, "waited_s": round(time.monotonic() - began), "polls": seen}


def timm_budgeted(recipe, budget_s: float, every_s: float, teacher=None, workers: int = 0) -> dict:
    """timm's side with its epochs sized so that its schedule ends at the budget: its speed and its setup (data,
    model) measured just before, off the record."""
    began = time.perf_counter()
    train_set, _ = splits_of(recipe)
    setup_s = time.perf_counter() - began
    rate = timm_rate(recipe, 20, teacher, workers)
    per_epoch = len(train_set) // recipe.schedule.batch_size
    epochs = max(0.05, (0.97 * budget_s - 2 * setup_s - 3) * rate / per_epoch)
    print(f"   timm: {rate:.2f} updates/s measured, {epochs:.2f} epochs fit the {budget_s:.0f} s budget", flush=True)
    result = run_timm(recipe, epochs, every_s, teacher=teacher, workers=workers, budget_s=budget_s)
    return {**result, "calibrated_updates_per_s": round(rate, 3)}


def summarise(name: str, target: float, budget_s: float, sides: list[dict]) -> dict:
    for side in sides:
        points = side["points"]
        side["time_to_target_s"] = first_at(points, target)
        side["accuracy_at_budget"] = at_time(points, budget_s)
    return {"scenario": name, "target": target, "budget_s": budget_s, "sides": sides}


def write_results(record: dict) -> None:
    with atomic_file(RESULTS / "time_to_accuracy.json") as handle:
        json.dump(record, handle, indent=1)
    lines = ["# Time to accuracy: vitkit's small-data presets against timm's training tasks", "",
             f"One run of `{record['command']}` on {record['date']}: {record['machine']['cpu']}, "
             f"{record['machine']['cores']} cores, torch {record['machine']['torch']}, timm {record['machine']['timm']}, "
             f"{record['threads']} torch threads on both sides; load average {record['load_start']} at the start, "
             f"{record['load_end']} at the end (waited {record['quiet']['waited_s']} s for it to fall to "
             f"{record['quiet']['limit']}).", ""]
    for result in record["results"]:
        lines += [f"## {result['title']}", "", result["setup"], ""]
        sides = result["sides"]
        lines += ["| side | " + " | ".join(side["label"] for side in sides) + " |",
                  "|---|" + "---:|" * len(sides)]
        lines.append("| steps (epochs) | " + " | ".join(f"{side['final']['step']} ({side.get('epochs_done', '')})"
                                                      for side in sides) + " |")
        for mark in result["marks"]:
            cells = [at_time(side["points"], mark) for side in sides]
            lines.append(f"| test accuracy at {mark:.0f} s | " +
                         " | ".join("-" if c is None else f"{100 * c:.2f}%" for c in cells) + " |")
        lines.append("| final test accuracy (at s) | " + " | ".join(
            f"{100 * side['final']['test_accuracy']:.2f}% ({side['final']['seconds']:.0f} s)" for side in sides) + " |")
        lines.append(f"| time to {100 * result['target']:.0f}% | " + " | ".join(
            "not reached" if side["time_to_target_s"] is None else f"{side['time_to_target_s']:.0f} s"
            for side in sides) + " |")
        lines.append("| load average (1 min) before -> after | " + " | ".join(
            f"{side['load'][0][0]:.2f} -> {side['load'][1][0]:.2f}" for side in sides) + " |")
        lines += [""] + result.get("notes", []) + [""]
    with atomic_file(RESULTS / "time_to_accuracy.md") as handle:
        handle.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="+", choices=["mnist", "cifar", "distill"])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="timm's DataLoader workers")
    parser.add_argument("--quiet-load", type=float, default=1.0, help="wait for the load average to fall to this")
    parser.add_argument("--quiet-wait", type=float, default=1200, help="... for at most this many seconds")
    parser.add_argument("--teacher-epochs", type=int, default=60)
    parser.add_argument("--tune", choices=["vitkit", "timm", "teacher"], help="one side, with --set changes, "
                        "no results file")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=JSON")
    parser.add_argument("--every-steps", type=int, default=0)
    parser.add_argument("--epochs", type=float, default=0, help="--tune timm: epochs (default: the recipe's)")
    parser.add_argument("--preset", help="--tune: this preset instead of the scenario's")
    args = parser.parse_args()
    changes: dict = {}
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        changes.setdefault(section, {})[name] = json.loads(value)
    torch.set_num_threads(args.threads)
    if args.tune:
        tune(args, changes)
        return
    run_all(args)


def tune(args, changes: dict) -> None:
    scenario = SCENARIOS[args.which[0]]
    if args.preset:
        scenario = Scenario(scenario.name, args.preset, scenario.budget_s, scenario.every_s, scenario.target, "")
    recipe = recipe_for(scenario, args.data_dir, args.threads, changes, RUNS / f"tune-{scenario.name}-{os.getpid()}")
    print(json.dumps(recipe.to_dict()["schedule"]), json.dumps(recipe.to_dict()["model"]["args"]), flush=True)
    if args.tune == "vitkit":
        run_vitkit(recipe, scenario.every_s if not args.every_steps else 0, args.every_steps)
    elif args.tune == "teacher":
        print(train_teacher(recipe, args.teacher_epochs, RUNS / f"tune-teacher-{os.getpid()}.safetensors",
                            args.workers))
    else:
        from vitkit.train.run import total_steps
        train_set, _ = splits_of(recipe)
        epochs = args.epochs or total_steps(recipe, len(train_set)) * recipe.schedule.batch_size / len(train_set)
        run_timm(recipe, epochs, scenario.every_s if not args.every_steps else 0, args.every_steps,
                 workers=args.workers)


def epochs_done(side: dict, train_size: int) -> str:
    return f"{side['final']['images'] / train_size:.1f}"


def compare(scenario: Scenario, args) -> tuple[dict, Any]:
    """vitkit's preset, then timm's task on the same budget."""
    recipe = recipe_for(scenario, args.data_dir, args.threads, {}, RUNS / f"{scenario.name}-vitkit")
    train_set, test_set = splits_of(recipe)
    print(f"== {scenario.name}: vitkit --preset {scenario.preset} (load {load()})", flush=True)
    mine = {**run_vitkit(recipe, scenario.every_s), "label": f"vitkit `--preset {scenario.preset}`"}
    print(f"== {scenario.name}: timm ClassificationTask (load {load()})", flush=True)
    theirs = {**timm_budgeted(recipe, scenario.budget_s, scenario.every_s, workers=args.workers),
              "label": "timm ClassificationTask"}
    for side in (mine, theirs):
        side["epochs_done"] = epochs_done(side, len(train_set))
    result = summarise(scenario.name, scenario.target, scenario.budget_s, [mine, theirs])
    result.update(title=scenario.title, setup=describe(recipe, theirs, len(train_set), len(test_set)),
                  notes=[f"Target {100 * scenario.target:.0f}%: {scenario.why_target}."],
                  marks=[scenario.every_s * k for k in range(1, int(scenario.budget_s // scenario.every_s) + 1)],
                  recipe=recipe.to_dict(), train_images=len(train_set))
    return result, recipe


def describe(recipe, timm_side: dict, train_images: int, test_images: int) -> str:
    """What both sides trained, in words: the model, the data, the recipe and each side's augmentation."""
    model = recipe.model.args
    augment = recipe.augment
    randaug, mixup = augreg_level(augment.aug_level)
    vitkit_aug = (f"{augment.transform} transform" + (f" (crop area {tuple(augment.crop_scale)})"
                                                      if augment.transform == "pretrain" else "")
                  + (", hflip" if augment.hflip else "") + (f", RandAugment n{randaug[0]} m{randaug[1]} (torchvision)"
                                                            if randaug else "")
                  + (f", Mixup {mixup}" if mixup else "") + (f", CutMix {augment.cutmix_alpha}" if augment.cutmix_alpha else "")
                  + (f", random erasing {augment.random_erasing}" if augment.random_erasing else "")
                  + (f", repeated augmentation x{augment.repeated_aug}" if augment.repeated_aug > 1 else ""))
    timm_aug = timm_side.get("transform", "") + (f"; timm Mixup {mixup}" if mixup else "") + \
        (f", RepeatAugSampler x{augment.repeated_aug}" if augment.repeated_aug > 1 else "")
    return (f"Model: {json.dumps(model)} at {recipe.model.image_size} px ({timm_side.get('timm_model_kwargs')} on timm's "
            f"side, checked to be the same architecture). Data: {train_images} training images, {test_images} test "
            f"images, both sides the same arrays. Recipe (both sides): {recipe.optim.optimizer} lr {recipe.optim.lr} "
            f"weight decay {recipe.optim.weight_decay} (not on biases, norms, embeddings), clip {recipe.optim.clip_norm}, "
            f"batch {recipe.schedule.batch_size}, {recipe.schedule.warmup_steps} warm-up steps then {recipe.schedule.decay} "
            f"to 0, label smoothing {recipe.objective.label_smoothing}, drop path {model.get('drop_path', 0)}, "
            f"EMA {recipe.optim.ema_decay or 'off'}. vitkit's augmentation: {vitkit_aug}. timm's: {timm_aug}.")


def distill(args) -> dict:
    """Teacher, then vitkit's distilled student at the preset's steps against the same student without a teacher,
    then timm's TokenDistillationTask for as long as vitkit's distilled run took. The students pool the [class]
    token (``pool=token``, DeiT's design and what timm's distilled ViT requires), so the distilled one gets DeiT's
    distillation token; the student without a teacher is the same model without that token."""
    scenario = SCENARIOS["cifar"]
    recipe = recipe_for(scenario, args.data_dir, args.threads, {"model": {"args": {"pool": "token"}}},
                        RUNS / "distill-vitkit")
    train_set, test_set = splits_of(recipe)
    teacher_path = RUNS / "teacher" / f"{TEACHER_ARCH}.safetensors"  # relative: no record names the machine
    print(f"== distill: teacher {TEACHER_ARCH}, {args.teacher_epochs} epochs (load {load()})", flush=True)
    teacher = train_teacher(recipe, args.teacher_epochs, teacher_path, args.workers)
    goal = dict(kind="distill", distill_teacher=f"timm:{TEACHER_ARCH}={teacher_path}", distill_kind="hard",
                distill_alpha=0.5)
    distilled = recipe.replace(objective=goal)
    print(f"== distill: vitkit --objective distill (load {load()})", flush=True)
    mine = {**run_vitkit(distilled, scenario.every_s), "label": "vitkit, distilled (hard, alpha 0.5)"}
    print(f"== distill: vitkit without a teacher (load {load()})", flush=True)
    baseline = {**run_vitkit(recipe.replace(run={"dir": str(RUNS / "distill-baseline")}), scenario.every_s),
                "label": f"vitkit `--preset {scenario.preset} --set pool=token`, no teacher"}
    budget = mine["final"]["seconds"]
    print(f"== distill: timm TokenDistillationTask, {budget:.0f} s (load {load()})", flush=True)
    module = load_teacher_module(teacher_path, len(train_set.classes))
    theirs = {**timm_budgeted(distilled, budget, scenario.every_s, teacher=module, workers=args.workers),
              "label": "timm TokenDistillationTask (hard, task weight 0.5)"}
    sides = [mine, baseline, theirs]
    for side in sides:
        side["epochs_done"] = epochs_done(side, len(train_set))
    result = summarise("distill", scenario.target, budget, sides)
    result.update(title="CIFAR-10 subset, distilled from a CNN teacher trained here", teacher=teacher,
                  setup=(f"Teacher: {teacher['architecture']} trained from scratch with timm's ClassificationTask "
                         f"for {teacher['epochs']} epochs ({teacher['seconds']:.0f} s on this machine, before the "
                         f"students): {100 * teacher['test_accuracy']:.2f}% test accuracy. Students: the "
                         f"`{scenario.preset}` preset's model, with a distillation token; both vitkit runs take the "
                         f"preset's {mine['steps']} steps. " + describe(distilled, theirs, len(train_set), len(test_set))),
                  marks=[scenario.every_s * k for k in range(1, int(budget // scenario.every_s) + 1)],
                  recipe=distilled.to_dict(), notes=[])
    return result


def run_all(args) -> None:
    command = "PYTHONPATH=src python benchmarks/time_to_accuracy.py " + " ".join(sys.argv[1:])
    quiet = wait_for_quiet(args.quiet_load, args.quiet_wait)
    started = time.perf_counter()
    record: dict[str, Any] = {"command": command, "date": datetime.date.today().isoformat(), "machine": machine(),
                              "threads": args.threads, "timm_workers": args.workers, "quiet": quiet,
                              "load_start": load(), "results": []}
    probe = subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import vitkit.cli, "
                            "vitkit.train; print(time.perf_counter() - t)"], capture_output=True, text=True)
    record["vitkit_import_s"] = float(probe.stdout.strip() or "nan")
    for which in args.which:
        if which == "distill":
            result = distill(args)
        else:
            result, _ = compare(SCENARIOS[which], args)
        record["results"].append(result)
        record["load_end"] = load()
        record["total_s"] = round(time.perf_counter() - started)
        write_results(record)
    print(f"== done in {record['total_s']} s (load {load()})", flush=True)


if __name__ == "__main__":
    main()
