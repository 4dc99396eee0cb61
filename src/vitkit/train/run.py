"""A recipe run end to end: ``prepare`` makes its sections into the data, the model (fresh or fine-tuned from a
checkpoint) and a ``Trainer``; ``run`` trains, saves the final model and evaluates it on the test split."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..atomic import atomic_file
from ..checkpoints.adapters import AdapterSpec, adapt, parameter_counts, save_adapter, save_model
from ..checkpoints.loading import build, read_checkpoint
from ..data import (ALL, STREAMED, ShardedSplit, SplitSpec, build_transform, default_num_workers, default_split,
                    evaluation_loader, load_splits, split_names, training_loader)
from ..data.dense import task_of
from ..data.map_style import held_part
from ..data.splits import seeded_permutation
from ..data.survey import Geometry, image_geometry
from ..data.transforms import augreg_level, dense_transform
from ..errors import ConfigError
from ..evaluate.dense import BEST, HEADLINE, DenseEvaluation, evaluate_dense, write_dense_report
from ..evaluate.metrics import Evaluation, evaluate, write_report
from ..evaluate.preprocessing import checkpoint_transform
from ..evaluate.slide import Slide, slide_for
from ..memory import Limit, Plan, available_memory, check, estimate
from ..models import ViTConfig, VisionTransformer, create_model, model_config
from ..models.config import pair
from ..paths import own_folder
from ..runtime import DTYPES
from .checkpointing import list_checkpoints
from .distributed import setup, shard
from .feature_cache import CachedFeatures
from .mpp import MaskedPatchPrediction
from .objectives import Classification, DepthRegression, Distillation, MaskedPatches, Segmentation
from .optim import learning_rate, make_optimizer
from .presets import RECIPE_FILE, read_config_file
from .recipes import DENSE_OBJECTIVES, Recipe
from .sizing import fresh_model_args, finetune_channels, finetune_size, say_sizing
from .skipped import SkippedFiles
from .teacher import Teacher, load_teacher, record
from .trainer import LoopConfig, Trainer

logger = logging.getLogger(__name__)

DENSE_FORMS = {"segmentation": "voc:, cityscapes:, ade20k: or maskfolder:DIR", "depth": "nyu: or depthfolder:DIR"}
DEPTH_MAX = 10.0  # metres: the last depth bin where neither the recipe nor the data caps depth

# What a run writes into its folder besides RECIPE_FILE (which marks a run): a folder holding only these is a run
# cut short before its recipe was saved, which may be used again; one holding anything else is not a run's.
RUN_ENTRIES = re.compile(r"metrics\.jsonl|summary\.json|checkpoints|model|best|adapter|teacher\.json|skipped|eval-.+\.json|"
                         r"confusion-.+\.png|events\.out\.tfevents\..+")

TORCH_THREADS = torch.get_num_threads()  # torch's choice at start-up: what threads=0 stands for


def build_model(recipe: Recipe, classes: list[str], geometry: Geometry, say: bool = True) -> VisionTransformer:
    """A fresh model, or (``recipe.model.init``) a checkpoint prepared for fine-tuning as in section 3.2:
    position embeddings interpolated to the new resolution, pre-logits dropped, a new zero head unless the
    checkpoint's classes are the data's. What the recipe leaves open is sized from the data's ``geometry``
    (``train.sizing``), and said (where ``say``: by one rank of several)."""
    kept_head = False
    dense = dense_head(recipe, classes)
    if recipe.model.init:
        config, state, source = read_checkpoint(recipe.model.init, recipe.model.args)
        # a dense run takes crops of the data's varied sizes: at the checkpoint's size unless asked
        size = config.image_size if dense and recipe.model.image_size is None else finetune_size(recipe, config,
                                                                                                  geometry)
        channels = finetune_channels(recipe, config, geometry)
        model = build(config, state, {**recipe.model.args, "image_size": size}, source)
        model.map_channels(channels)
        kept_head = not dense and model.config.provenance.classes == tuple(classes) \
            and model.config.num_classes == len(classes)
        if dense:
            model.make_dense(**dense)
        elif not kept_head:
            model.reset_head(len(classes))
    else:
        args = fresh_model_args(recipe, geometry)
        if recipe.objective.kind == "distill":
            args = {**distillation_token(recipe.model.name or ViTConfig(), args, say), **args}
        if dense:
            args = {**args, "dense_head": dense["head"], "dense_output": dense["output"],
                    "depth_min": dense["depth_min"], "depth_max": dense["depth_max"]}
        model = create_model(recipe.model.name or ViTConfig(), num_classes=dense["outputs"] if dense else len(classes),
                             **args)
    if say:
        say_sizing(recipe, model.config, geometry, kept_head)
    family = recipe.augment.normalization or (model.config.provenance.normalization if recipe.model.init else "google")
    # vitkit's presets train on the whole image brought to the model's size, so it is evaluated whole too.
    named = tuple(classes) if model.config.dense_output == "classes" else None  # depth bins have no names
    provenance = model.config.provenance.replace(classes=named, normalization=family, crop_pct=1.0)
    model.config = model.config.replace(provenance=provenance)
    if recipe.peft.method != "none":
        adapt(model, adapter_spec(recipe))
    model.grad_checkpointing = recipe.run.grad_checkpointing
    return model


def dense_task(recipe: Recipe, dataset) -> str | None:
    """The dense task of a run (``segmentation`` or ``depth``; None for the others), which its dataset must hold:
    per-pixel targets for a dense objective, image labels for the others."""
    kind, holds = recipe.objective.kind, task_of(dataset)
    if kind in DENSE_OBJECTIVES and holds != kind:
        raise ConfigError(f"--objective {kind} needs a {kind} dataset ({DENSE_FORMS[kind]}); "
                          f"{recipe.data.dataset} holds {holds} labels")
    if kind not in DENSE_OBJECTIVES and holds in DENSE_OBJECTIVES:
        raise ConfigError(f"{recipe.data.dataset} is a {holds} dataset: pass --objective {holds} (and --head)")
    return kind if kind in DENSE_OBJECTIVES else None


def evaluation_slide(stride: int, task: str | None, image_size: tuple[int, int]) -> Slide | None:
    """The sliding window of a dense run's validation and test passes (``--eval-slide STRIDE``; None: 0, the whole
    image stretched), refused for a run without a dense objective or a stride outside 1..the model's size."""
    if not stride:
        return None
    if task is None:
        raise ConfigError(f"--eval-slide {stride}: sliding-window evaluation is for --objective segmentation or "
                          f"depth; a classifier is evaluated on whole images")
    return slide_for(image_size, stride, flag="--eval-slide")


def cached_features(recipe: Recipe, model: VisionTransformer, env) -> CachedFeatures | None:
    """The frozen backbone's features kept per image (``train.feature_cache``), where they cannot change: the
    backbone frozen (``--peft linear``) and without dropout, the same pixels every epoch (``--transform eval``),
    one process (under DDP the head must run through the wrapped model) and no compilation. Up to a quarter of the
    memory there is; None otherwise."""
    c = model.config
    if not (recipe.peft.method == "linear" and recipe.augment.transform == "eval" and env.world_size == 1
            and not recipe.run.compile and c.dropout == c.attn_dropout == c.drop_path == 0):
        return None
    limit = available_memory().bytes // 4
    if env.is_main:
        logger.info(f"frozen backbone and fixed inputs: each image's features computed once and kept (up to "
                    f"{limit / 2**30:.1f} GiB)")
    return CachedFeatures(model, limit)


def dense_head(recipe: Recipe, classes: list[str]) -> dict[str, Any] | None:
    """What ``VisionTransformer.make_dense`` puts on for a segmentation or depth run (None for the others): the
    recipe's head, one output per class or ``depth_bins`` bins from 1 mm to ``max_depth``."""
    goal = recipe.objective
    if goal.kind not in DENSE_OBJECTIVES:
        return None
    depth = goal.kind == "depth"
    return dict(head=goal.dense_head or "linear", outputs=goal.depth_bins if depth else len(classes),
                output="depth" if depth else "classes", depth_min=ViTConfig.depth_min,
                depth_max=goal.max_depth or DEPTH_MAX)


def distillation_token(name: str | ViTConfig, args: dict[str, Any], say: bool) -> dict[str, Any]:
    """DeiT's distillation token for a model trained from scratch to distil, unless ``args`` say otherwise
    (``dist_token=false``); a model pooled otherwise than by its [class] token has no place for one: it distils
    through its head, said in one line (where ``say``)."""
    if "dist_token" in args:
        return {}
    pool = args.get("pool", (model_config(name) if isinstance(name, str) else name).pool)
    if pool == "token":
        return {"dist_token": True}
    if say:
        logger.info(f"distilling through the head: a distillation token needs pool='token' (this model's is "
                    f"{pool!r}; --set pool=token gives it one)")
    return {}


def make_teacher(recipe: Recipe, classes: list[str], student: ViTConfig, mixup_alpha: float) -> Teacher:
    """The teacher of a distillation run, its outputs kept per image when every epoch shows the same images (the
    ``eval`` transform, no flips, RandAugment, Mixup or CutMix)."""
    augment = recipe.augment
    same = augment.transform == "eval" and not augment.hflip and augment.aug_level == "none" \
        and not mixup_alpha and not augment.cutmix_alpha
    goal = recipe.objective
    return load_teacher(goal.distill_teacher, classes, student, goal.distill_teacher_size, cached=same)


def adapter_spec(recipe: Recipe) -> AdapterSpec:
    """The recipe's ``peft`` section as the method ``checkpoints.adapters`` applies."""
    peft = recipe.peft
    return AdapterSpec(peft.method, peft.lora_rank, peft.lora_alpha, peft.lora_dropout, peft.targets,
                       peft.prompt_tokens, peft.adapter_dim, peft.adapter_scale)


def say_trained(model: torch.nn.Module, method: str) -> dict[str, Any]:
    """One line before the first step: how many of the model's parameters the run trains (all of them, or those
    of the PEFT method and the head); returned as the summary's ``params/`` entries."""
    trained, total = parameter_counts(model)
    logger.info(f"training {trained:,} of {total:,} parameters ({100 * trained / total:.2f}%)"
                + ("" if method == "none" else f": {method} and the head, the rest frozen"))
    return {"params/trained": trained, "params/total": total, "params/trained_share": trained / total,
            "peft/method": method}


def default_run_dir(recipe: Recipe) -> str:
    tag = recipe.data.dataset.split(":")[-1].strip("/").replace("/", "-")[-40:]
    return f"runs/{tag}-{time.strftime('%Y%m%d-%H%M%S')}"


def total_steps(recipe: Recipe, train_size: int) -> int:
    schedule = recipe.schedule
    return schedule.steps or max(1, math.ceil(schedule.epochs * (train_size // schedule.batch_size)))


def fitted_warmup(warmup_steps: int, steps: int, say: bool = True) -> int:
    """The warm-up of a run of ``steps``: as asked, unless it is as long as the run or longer (the learning
    rate would never peak), then a tenth of the run, said in one line (where ``say``)."""
    if warmup_steps < steps:
        return warmup_steps
    fitted = steps // 10
    if say:
        logger.info(f"warm-up of {warmup_steps} steps in a run of {steps}: a tenth of the run ({fitted}) instead, so "
                    f"that the learning rate peaks; set --warmup-steps to choose")
    return fitted


def evaluated_splits(recipe: Recipe, pretraining: bool) -> tuple[str, ...]:
    """The splits a run measures, the final one last: validation when the dataset has or can hold out one, then
    after classification the test split, or val where the dataset has none (ImageNet's ``train/`` + ``val/``:
    the split timm and big_vision report their final numbers on). A dataset that names no split, with nothing
    held out of it (``val_fraction`` 0), is measured on all of its images: its training images."""
    if pretraining:
        return ()
    if recipe.data.val_fraction == 0 and default_split(recipe.data.dataset) == ALL:
        return (ALL,)
    available = split_names(recipe.data.dataset)
    held = recipe.data.train_split != "train"  # validation held out of the split trained on
    validation = ("val",) if recipe.data.val_fraction > 0 and ("val" in available or held) else ()
    return tuple(dict.fromkeys((*validation, "test" if "test" in available else "val")))


TRAINING = "training"  # the key of the images a run trains on, beside the splits it measures


def training_splits(recipe: Recipe, evaluated: tuple[str, ...], spec: SplitSpec) -> dict:
    """The images a run trains on (under ``TRAINING``) and the splits it measures. A run trained on a split
    other than ``train`` (Pets' ``trainval``, VTAB-1k's ``train800val200``) holds its validation images out of
    that split, never reading the dataset's own ``val`` (part of ``trainval``), so none is trained on."""
    data = recipe.data
    held = data.train_split != "train" and "val" in evaluated
    named = tuple(split for split in evaluated if not (held and split == "val"))
    splits = load_splits(data.dataset, (data.train_split, *named), data.data_dir, spec, data.corrupt)
    training = splits[data.train_split] if data.train_split in named else splits.pop(data.train_split)
    if held:
        name = f"{data.dataset}[{data.train_split}]"
        splits["val"] = held_part(training, spec.val_fraction, spec.seed, True, f"{name}[val]")
        training = held_part(training, spec.val_fraction, spec.seed, False, name)
    return {TRAINING: training, **splits}


@dataclass
class Experiment:
    """A recipe made concrete: the trainer, the class names and how to measure a model on a split."""

    recipe: Recipe
    run_dir: Path
    trainer: Trainer
    classes: list[str]
    measure: Callable[[VisionTransformer, str], Evaluation]
    skipped: SkippedFiles
    final_split: str | None  # the split the final numbers come from (None when pre-training)
    trained: dict[str, Any]  # how many parameters the run trains (``say_trained``), for its summary
    teacher: Teacher | None = None  # what a distillation run learns from


def check_run_memory(recipe: Recipe, config: ViTConfig, device: torch.device, command: str) -> None:
    """Refuse a run of ``config`` whose peak memory (``vitkit.memory``: a training step at the recipe's batch per
    rank, its optimiser, precision, loader workers and checkpointing) is above what the machine has (shared by
    torchrun's ranks on it), naming the flags that would fit."""
    optimizer = recipe.optim.optimizer if recipe.optim.optimizer == "adamw" or recipe.optim.momentum else None
    ranks = int(os.environ.get("WORLD_SIZE", 1))
    trained = None
    if recipe.peft.method != "none":  # frozen weights need no gradients or optimiser state
        with torch.device("meta"):
            trained, _ = adapt(VisionTransformer(config), adapter_spec(recipe))

    def measure(plan: Plan):
        return estimate(config, plan.micro_batch, plan.image_size, training=True, optimizer=optimizer,
                        workers=max(recipe.data.num_workers, 0),
                        dtype=DTYPES.get(recipe.run.precision, torch.float32),
                        grad_checkpointing=plan.grad_checkpointing, device=device.type,
                        weight_copies=2 if recipe.optim.ema_decay else 1, trained=trained,
                        frozen_blocks=recipe.peft.method == "linear")

    plan = Plan(max(1, recipe.schedule.batch_size // ranks), pair(recipe.model.image_size),
                recipe.schedule.accum_steps, recipe.run.grad_checkpointing, config.effective_patch_size,
                checkpointing_flag="--grad-checkpointing")
    machine, here = available_memory(), int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # torchrun's ranks on this machine
    share = Limit(machine.bytes // here, f"{machine.source}, shared by {here} ranks") if here > 1 else machine
    check(plan, measure, command, share, device=device)


def prepare(recipe: Recipe, device: str | None = None) -> Experiment:
    """Data, model, optimiser, schedule and objective of ``recipe``, wired into a ``Trainer`` on ``device``
    (default: a GPU when there is one)."""
    env = setup(device)
    torch.set_num_threads(recipe.run.threads or TORCH_THREADS)  # 0 restores torch's own, whatever a run before set
    torch.manual_seed(recipe.run.seed)
    run_dir = Path(recipe.run.dir or default_run_dir(recipe))
    own_folder(run_dir, RECIPE_FILE, RUN_ENTRIES, "a training run", ConfigError)
    spec = SplitSpec(recipe.data.val_fraction, seed=0)
    pretraining = recipe.objective.kind == "mpp"
    evaluated = evaluated_splits(recipe, pretraining)
    splits = training_splits(recipe, evaluated, spec)  # once per run, every evaluation reuses them
    train_set = splits.pop(TRAINING)
    if recipe.data.train_subset:
        if isinstance(train_set, ShardedSplit):
            raise ConfigError(f"train_subset needs a dataset with random access, not the shards of "
                              f"{recipe.data.dataset}")
        keep = np.sort(seeded_permutation(len(train_set), recipe.run.seed).numpy()[:recipe.data.train_subset])
        train_set = train_set.subset(keep, f"{train_set.name}[subset]")
    classes = train_set.classes
    task = dense_task(recipe, train_set)
    if task and not (recipe.model.init or recipe.model.name):
        raise ConfigError(f"--objective {task} puts a head on a backbone: fine-tune a checkpoint (vitkit finetune "
                          f"CHECKPOINT) or name a model (--model NAME)")
    if task == "depth" and recipe.objective.max_depth is None:  # saved with the run: the bins end at the data's cap
        cap = getattr(train_set, "max_depth", None)
        if cap is None and env.is_main:
            logger.info(f"{recipe.data.dataset} has no depth cap: depth up to {DEPTH_MAX:g} m is learnt and measured, "
                        f"deeper pixels are left out; set --max-depth for other scenes")
        recipe = recipe.replace(objective={"max_depth": cap or DEPTH_MAX})
    model = build_model(recipe, [] if pretraining else classes, image_geometry(train_set), env.is_main)
    config = model.config
    slide = evaluation_slide(recipe.run.eval_slide, task, config.image_size)
    if recipe.peft.method in ("lora", "dora") and set(recipe.peft.targets) & {"q", "k", "v"} and env.enabled \
            and recipe.run.parallel == "fsdp":
        raise ConfigError(f"--peft-targets {','.join(recipe.peft.targets)}: a LoRA on rows of qkv is kept to them by "
                          f"gradient masks, which FSDP's sharded parameters do not carry; target qkv, or run "
                          f"--parallel ddp")
    if recipe.model.image_size is None or task:  # checked now that the data has said its size (and a head's classes)
        command = "vitkit " + ("pretrain" if pretraining else "finetune" if recipe.model.init else "train")
        check_run_memory(recipe.replace(model={"image_size": config.image_size}), config, env.device, command)
    recipe = recipe.replace(model={"image_size": config.image_size})  # saved with the run: a resumed run is sized alike
    if pretraining:  # the encoder learns from the images alone; a head is put on at fine-tuning
        objective = recipe.objective
        model = MaskedPatchPrediction(model, objective.mpp_target, objective.mpp_bits, objective.mpp_ratio,
                                      objective.mpp_mask_prob, objective.mpp_random_prob, *config.input_statistics)
    model = shard(model.to(env.device), env, recipe.run.parallel)
    if env.rank:  # the same initial weights everywhere, then a random stream per rank (dropout, masking)
        torch.manual_seed(recipe.run.seed + env.rank)
    if task:  # --transform eval: whole images, the same pixels every epoch
        train_transform = dense_transform(task, True, config.image_size, config.in_chans,
                                          config.provenance.normalization, recipe.augment.hflip,
                                          random=recipe.augment.transform != "eval")
        eval_transform = dense_transform(task, False, config.image_size, config.in_chans,
                                         config.provenance.normalization, keep_ratio=slide is not None)
    else:
        train_transform = build_transform(recipe.augment.transform, config.image_size, config.in_chans,
                                          config.provenance.normalization, recipe.augment.hflip,
                                          recipe.augment.crop_scale, recipe.augment.aug_level,
                                          recipe.augment.random_erasing)
        eval_transform = checkpoint_transform(config)
    steps = total_steps(recipe, len(train_set))
    recipe = recipe.replace(schedule={"warmup_steps": fitted_warmup(recipe.schedule.warmup_steps, steps, env.is_main)})
    if recipe.data.num_workers < 0:  # resolved once and saved with the run: a stream's order depends on it
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        recipe = recipe.replace(data={"num_workers": default_num_workers(train_set, ranks_here, env.world_size)})
    workers = recipe.data.num_workers
    skipped = SkippedFiles(run_dir, env.rank, env.world_size)

    def batches(start_step: int):
        loader = training_loader(train_set, train_transform, global_batch=recipe.schedule.batch_size,
                                 total_steps=steps, start_step=start_step, seed=recipe.run.seed,
                                 accum_steps=recipe.schedule.accum_steps, rank=env.rank, world_size=env.world_size,
                                 num_workers=workers, corrupt=recipe.data.corrupt,
                                 device=env.device, repeats=recipe.augment.repeated_aug)
        skipped.resume(start_step)
        for index, (images, labels, names) in enumerate(loader):
            if names:
                skipped.record(start_step + index // recipe.schedule.accum_steps + 1, names, trainer.record)
            yield images, labels

    eval_batch = 1 if slide is not None else recipe.run.eval_batch_size  # sliding: images of their own sizes
    loaders = {name: evaluation_loader(dataset, eval_transform, eval_batch, workers,
                                       recipe.data.corrupt, env.device) for name, dataset in splits.items()}

    ignore_index = getattr(train_set, "ignore_index", None)

    def measure(network: VisionTransformer, split_name: str) -> Evaluation | DenseEvaluation:
        if task:
            return evaluate_dense(network, loaders[split_name], task, config.num_classes, env.device,
                                  ignore_index=ignore_index, max_depth=recipe.objective.max_depth,
                                  eval_crop=getattr(splits[split_name], "eval_crop", None),
                                  slide=slide,
                                  windows_per_pass=recipe.run.eval_batch_size)
        return evaluate(network, loaders[split_name], len(classes), env.device)

    def validate(network: VisionTransformer) -> dict[str, float]:
        return measure(network, "val").summary("val") if "val" in loaders else {}

    optim = recipe.optim
    optimizer = make_optimizer(model, optim.optimizer, optim.lr, optim.weight_decay, optim.betas, optim.momentum,
                               optim.layer_decay)  # after sharding (its parameters), before DDP (their names)
    lr_at = functools.partial(learning_rate, base_lr=optim.lr, total_steps=steps,
                              warmup_steps=recipe.schedule.warmup_steps, decay=recipe.schedule.decay,
                              end_lr=recipe.schedule.end_lr)
    _, mixup_alpha = augreg_level(recipe.augment.aug_level)
    teacher = None
    if pretraining:
        objective = MaskedPatches()
    elif recipe.objective.kind == "distill":
        teacher = make_teacher(recipe, classes, config, mixup_alpha).to(env.device)
        goal = recipe.objective
        objective = Distillation(teacher, goal.distill_kind or "hard", goal.distill_temperature, goal.distill_alpha,
                                 len(classes), goal.label_smoothing, mixup_alpha, recipe.augment.cutmix_alpha)
    elif task == "segmentation":
        objective = Segmentation(ignore_index, cached_features(recipe, model, env))
    elif task == "depth":
        objective = DepthRegression(recipe.objective.max_depth, cached_features(recipe, model, env))
    else:
        objective = Classification(len(classes), recipe.objective.label_smoothing, mixup_alpha,
                                   recipe.augment.cutmix_alpha)
    loop = LoopConfig(steps, recipe.optim, recipe.schedule, recipe.run,
                      **({"best_metric": f"val/{BEST[task]}"} if task else {}))
    trainer = Trainer(model, objective, optimizer, lr_at, batches, run_dir, loop, validate, env)
    trained = say_trained(model, recipe.peft.method) if env.is_main else {}
    return Experiment(recipe, run_dir, trainer, classes, measure, skipped, evaluated[-1] if evaluated else None,
                      trained, teacher)


def run(recipe: Recipe, resume: bool = False, device: str | None = None) -> dict[str, Any]:
    """Train (or fine-tune) as ``recipe`` says, then save the final model and evaluate it on the test
    split (val where there is none: ``test/split`` in the summary says which); returns the summary also
    written to ``summary.json``."""
    experiment = prepare(recipe, device)
    trainer, run_dir = experiment.trainer, experiment.run_dir
    with contextlib.closing(trainer):  # TensorBoard's thread ends with the run, whether it finishes or fails
        found = list_checkpoints(run_dir)
        if found and not resume:
            raise ConfigError(f"{run_dir} already holds a run (checkpoints up to {found[-1].name}); continue it with "
                              f"--resume, or choose another --run-dir")
        saved = run_dir / RECIPE_FILE
        if resume and trainer.env.is_main and saved.is_file():
            before = read_config_file(saved).get("data", {}).get("num_workers")
            if before != experiment.recipe.data.num_workers and recipe.data.dataset.startswith(STREAMED):
                warnings.warn(f"{run_dir} was trained with {before} data workers, resumed with "
                              f"{experiment.recipe.data.num_workers}: the shards' sample order, which depends on it, "
                              f"will not be the uninterrupted run's", stacklevel=2)
        if trainer.env.is_main:
            if experiment.teacher is not None:  # a resumed run learns from the same teacher
                record(run_dir, recipe.objective.distill_teacher, experiment.teacher, resume)
            with atomic_file(run_dir / RECIPE_FILE) as handle:
                json.dump(experiment.recipe.to_dict(), handle, indent=1)
        started = time.perf_counter()
        last = trainer.fit(resume=resume)
        summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": trainer.config.total_steps,
                                   "train_seconds": round(time.perf_counter() - started, 1),
                                   **{k: v for k, v in last.items() if not k.startswith("train/images")},
                                   **experiment.trained}
        with trainer.rank_loss_explained(), trainer.final_model() as final:
            if trainer.env.is_main:
                save_model(final, run_dir / "model")
                # what the method trained, to apply to the base: far smaller (a dense head is saved with its model)
                if recipe.peft.method != "none" and final.config.dense_head == "none":
                    save_adapter(final, run_dir / "adapter", base=recipe.model.init)
                if recipe.objective.kind != "mpp":
                    split = experiment.final_split
                    evaluation = experiment.measure(final, split)
                    if isinstance(evaluation, DenseEvaluation):
                        report = write_dense_report(evaluation, experiment.classes, run_dir, split)
                        summary.update({f"test/{name}": report[name] for name in HEADLINE[evaluation.task]})
                    else:
                        report = write_report(evaluation, experiment.classes, run_dir, split)
                        summary.update({"test/accuracy": report["top1"], "test/top5": report["top5"]})
                    summary.update({"test/images": report["images"], "test/split": split})
                names = experiment.skipped.all_ranks()
                summary.update({"data/skipped": len(names), "data/skipped_files": names})
                with atomic_file(run_dir / "summary.json") as handle:
                    json.dump(summary, handle, indent=1)
        with trainer.rank_loss_explained():
            trainer.env.barrier()
        return summary
