"""A model measured on a split of a named dataset, as ``vitkit eval`` does: the split chosen, the evaluation
refused before its first batch when it cannot fit or the classes differ, then top-1/top-5, per-class accuracy and
a confusion matrix, kept in a folder on request."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoints.inference import SURGERY
from ..checkpoints.runnable import EXPORTED, check_graph_inputs, checkpoint_config
from ..data import ALL, SplitSpec, default_split, evaluation_loader, load_dataset
from ..data.dense import task_of
from ..data.survey import conversions, image_geometry
from ..data.transforms import dense_transform
from ..errors import ConfigError
from ..memory import Plan, check, check_workers, estimate
from ..models.config import pair
from ..models.vit import VisionTransformer
from ..runtime import resolve_precision, select_device
from .dense import evaluate_dense, write_dense_report
from .metrics import evaluate, real_top1, write_report
from .preprocessing import checkpoint_transform, naflex_loader
from .slide import slide_for

logger = logging.getLogger(__name__)

DEFAULT_VAL_FRACTION = 0.1  # images held out where the dataset lacks the split and nothing else says how many


@dataclass
class DatasetEvaluation:
    """What ``evaluate_dataset`` measured: the dataset and split, whether the split was the whole of a dataset
    that names none (``ALL`` without asking), and the report (see ``metrics.write_report``)."""

    dataset: str
    split: str
    whole: bool
    report: dict


def evaluate_dataset(model: torch.nn.Module, dataset: str, split: str | None = None, *,
                     data_dir: str | Path | None = None, val_fraction: float = DEFAULT_VAL_FRACTION,
                     corrupt: str = "fail", batch_size: int = 256, num_workers: int = 0, out: str | Path | None = None,
                     resize: str = "crop", max_patches: int | None = None, device: torch.device | str = "cpu",
                     dtype: torch.dtype = torch.float32, source: str = "the model", command: str = "vitkit eval",
                     real_labels: str | Path | None = None, scales: tuple[float, ...] = (1.0,),
                     flip: bool = False, slide: bool | int | None = None) -> DatasetEvaluation:
    """Measure ``model`` (a ``VisionTransformer`` or an exported graph, already on ``device``, computing in
    ``dtype``) on ``split`` of ``dataset`` (default: its test split, else its validation split, else all of it;
    a split it lacks is held out of its training images, ``val_fraction`` of them): top-1/top-5, per-class
    accuracy and the confusion matrix, written as ``eval-<split>.json`` and ``confusion-<split>.png`` into
    ``out`` when given. The images are prepared as the checkpoint wants them (``resize``), or with
    ``max_patches`` each at its own aspect ratio (NaFlex). ``real_labels``: ImageNet's reassessed labels
    (``real.json``), whose ReaL top-1 the report adds. A dense model's outputs may be averaged over the image
    resized by each of ``scales`` and mirrored (``flip``), and evaluated by windows sliding over the image resized
    at its aspect ratio (``slide``: True, or the stride in pixels; see ``evaluate_dense``). ``source`` names the
    model and ``command`` the command in refusals; the conversions the images need are logged."""
    device = torch.device(device)
    config = model.config
    chosen = split or default_split(dataset)
    data = load_dataset(dataset, chosen, data_dir, SplitSpec(val_fraction), corrupt)
    check_eval_size(model, len(data), batch_size, num_workers, max_patches, device, dtype, command)
    task = dense_task_of(config, data, dataset, source)
    if task and (max_patches or real_labels is not None):
        raise ConfigError(f"{source} is a {task} model, whose images are stretched whole to its size: "
                          f"--max-patches and --real-labels are for classifiers")
    if not task and (tuple(scales) != (1.0,) or flip):
        raise ConfigError(f"{source} is a classifier: --scales and --flip (test-time augmentation) are for "
                          f"segmentation and depth models")
    if not task and slide not in (None, False):
        raise ConfigError(f"{source} is a classifier: --slide (sliding-window evaluation) is for segmentation and "
                          f"depth models")
    if task:
        sliding = slide not in (None, False)
        if sliding:
            slide_for(config.image_size, None if slide is True else slide)  # a bad stride, before any image is read
        loader = evaluation_loader(data, dense_transform(task, False, config.image_size, config.in_chans,
                                                         config.provenance.normalization, keep_ratio=sliding),
                                   1 if sliding else batch_size, num_workers, corrupt, device=device)
        evaluation = evaluate_dense(model, loader, task, config.num_classes, device, dtype,
                                    ignore_index=getattr(data, "ignore_index", 255),
                                    max_depth=config.depth_max if task == "depth" else None,
                                    eval_crop=getattr(data, "eval_crop", None), scales=scales, flip=flip,
                                    slide=slide, windows_per_pass=batch_size)
        report = write_dense_report(evaluation, data.classes, out, chosen)
        return DatasetEvaluation(dataset, chosen, chosen == ALL and split is None, report)
    if config.num_classes != len(data.classes):
        raise ConfigError(f"{source} predicts {config.num_classes} classes but {dataset} has {len(data.classes)}")
    for conversion in [] if max_patches else conversions(image_geometry(data), config.in_chans, config.image_size):
        logger.info(f"{dataset}: {conversion}")
    check_graph_inputs(model, source, max_patches)
    if max_patches:
        loader = naflex_loader(data, config, max_patches, batch_size, num_workers, corrupt, device)
    else:
        loader = evaluation_loader(data, checkpoint_transform(config, resize), batch_size, num_workers, corrupt,
                                   device=device)
    evaluation = evaluate(model, loader, config.num_classes, device, dtype, keep_predictions=real_labels is not None)
    real = real_top1(evaluation, real_labels, data, config.num_classes) if real_labels is not None else None
    report = write_report(evaluation, data.classes, out, chosen, real)
    return DatasetEvaluation(dataset, chosen, chosen == ALL and split is None, report)


def dense_task_of(config, data, dataset: str, source: str) -> str | None:
    """The dense task a model with a dense head is measured on (None for a classifier), refused where the dataset
    holds another kind of label or other classes."""
    holds = task_of(data)
    task = None if config.dense_head == "none" else "depth" if config.dense_output == "depth" else "segmentation"
    if task != holds and (task or holds != "classification"):
        has = f"a {task} head" if task else "a classifier"
        raise ConfigError(f"{source} has {has} and {dataset} holds {holds} labels; expected a "
                          f"{task or 'classification'} dataset")
    if task == "segmentation" and config.num_classes != len(data.classes):
        raise ConfigError(f"{source} predicts {config.num_classes} classes per pixel but {dataset} has "
                          f"{len(data.classes)}")
    return task


def check_model_memory(checkpoint: str, overrides: dict[str, Any] | None, device: str | torch.device | None,
                       precision: str, *, adapter: str | None = None, command: str) -> None:
    """Refuse, before a weight is allocated, a checkpoint whose weights and the pass of one image exceed the memory
    the machine has, from its config alone (a position table resampled for ``--set image_size=100000`` asks for
    tens of GB), naming the estimate and an ``image_size`` that fits. Only the user's numbers are checked: without
    an override of the size, patch or classes the model is the file's own (whose config most formats give only by
    reading the weights, which loading does anyway), and an exported graph runs as it was exported."""
    overrides = overrides or {}
    if Path(checkpoint).suffix in EXPORTED or not set(SURGERY) & set(overrides):
        return
    config = checkpoint_config(checkpoint, overrides, adapter=adapter)
    chosen = select_device(device)
    dtype = resolve_precision(precision, chosen)
    size = pair(overrides.get("image_size", config.image_size))  # a checkpoint's table is resized after loading

    def measure(plan: Plan):
        return estimate(config, plan.batch, plan.image_size, dtype=dtype, device=chosen.type)

    check(Plan(1, size, stride=config.effective_patch_size, image_flag="--set image_size={}", batch_flag=None),
          measure, command, device=chosen)


def check_eval_size(model: torch.nn.Module, images: int, batch_size: int, num_workers: int, max_patches: int | None,
                    device: torch.device, dtype: torch.dtype, command: str = "vitkit eval") -> None:
    """Refuse an evaluation that cannot fit before its first batch: more loader processes than CPUs, or a peak
    memory (``vitkit.memory``) above what the machine has for batches of ``batch_size`` or all ``images``,
    named with the flags that would fit."""
    check_workers(num_workers)
    config = model.config
    native = isinstance(model, VisionTransformer)

    def measure(plan: Plan):
        return estimate(config, plan.batch, plan.image_size, workers=num_workers, dtype=dtype, patches=max_patches,
                        device=device.type)

    plan = Plan(min(batch_size, max(images, 1)), config.image_size, stride=config.effective_patch_size,
                image_flag="--set image_size={}" if native and not max_patches else None)
    check(plan, measure, command, device=device)
