"""A run's input sized from its data and, when fine-tuning, its checkpoint: what `vitkit train` and
`vitkit finetune` do with the sizes a recipe leaves open (``image_size`` null, no ``patch_size`` or
``in_chans`` in ``model_args``), each decision said in one line, and every conversion of the images too."""

from __future__ import annotations

import logging

from ..data.survey import Geometry, conversions
from ..errors import ConfigError, DatasetError
from ..models import ViTConfig, model_config
from ..models.config import pair
from .recipes import Recipe

logger = logging.getLogger(__name__)

PATCHES = (2, 4, 8, 16)  # the patches a model sized from the data may get
MIN_GRID = 8  # the grid (sides in patches) the largest of them must still leave
CHANNELS = {"rgb": 3, "grey": 1}  # --channels
PAPER_SIZE = 384  # the paper's fine-tuning resolution: the paper-finetune preset's


def patch_for(size: tuple[int, int]) -> int:
    """The largest of ``PATCHES`` that leaves a grid of at least ``MIN_GRID`` x ``MIN_GRID`` on ``size``; the
    smallest where none does (8 px digits: patch 2, a 4 x 4 grid)."""
    fitting = [patch for patch in PATCHES if min(size) // patch >= MIN_GRID]
    return fitting[-1] if fitting else PATCHES[0]


def data_channels(geometry: Geometry, dataset: str, asked: str) -> int:
    """The channels a model takes: ``--channels`` where given, else the data's, which must agree."""
    if asked:
        return CHANNELS[asked]
    if len(geometry.channels) > 1:
        met = ", ".join(f"{name} has {count}" for count, name in sorted(geometry.channels.items()))
        raise DatasetError(f"{dataset}: images differ in channels ({met}); pass --channels rgb (grey images "
                           f"repeated) or --channels grey (colour images turned grey)")
    return next(iter(geometry.channels))


def fresh_model_args(recipe: Recipe, geometry: Geometry) -> dict:
    """``image_size`` and the ``model_args`` of a new model, what the recipe leaves open taken from the data:
    its channels, its size (rounded to a multiple of the patch), and the largest patch of ``PATCHES`` that
    leaves an 8 x 8 grid (a named variant keeps its own patch)."""
    args = dict(recipe.model.args)
    channels = recipe.model.channels
    if channels and args.get("in_chans", CHANNELS[channels]) != CHANNELS[channels]:
        raise ConfigError(f"--channels {recipe.model.channels} and --set in_chans={args['in_chans']}: pick one")
    if "in_chans" not in args:
        args["in_chans"] = data_channels(geometry, recipe.data.dataset, recipe.model.channels)
    asked = pair(recipe.model.image_size) if recipe.model.image_size is not None else None
    if "patch_size" not in args and not recipe.model.name:
        args["patch_size"] = patch_for(asked or geometry.size)
    patch = args.get("patch_size") or model_config(recipe.model.name).patch_size
    if asked:
        check_size(asked, patch, "--image-size")
        return {**args, "image_size": asked}
    return {**args, "image_size": tuple(max(patch, round(side / patch) * patch) for side in geometry.size)}


def check_size(size: tuple[int, int], patch: int, named: str) -> None:
    """Refuse a size below the patch, or not a multiple of it, naming the sizes that would do."""
    if min(size) < patch:
        raise ConfigError(f"{named} {size[0]}x{size[1]} is smaller than the patch ({patch} px); pass {named} "
                          f"{patch} or more, or a smaller --set patch_size")
    if size[0] % patch or size[1] % patch:
        near = "x".join(str(max(patch, round(side / patch) * patch)) for side in size)
        raise ConfigError(f"{named} {size[0]}x{size[1]} is not a multiple of the patch ({patch} px); pass "
                          f"{named} {near}")


def finetune_size(recipe: Recipe, config: ViTConfig, geometry: Geometry) -> tuple[int, int]:
    """The resolution of a fine-tuning run: the recipe's where it gives one, else the data's, at the
    checkpoint's patch (or the ``patch_size`` the recipe resamples it to), which must divide it."""
    patch = recipe.model.args.get("patch_size", config.patch_size) * (config.effective_patch_size // config.patch_size)
    if recipe.model.image_size is not None:
        size = pair(recipe.model.image_size)
        check_size(size, patch, "--image-size")
        return size
    size = geometry.size
    if size[0] % patch or size[1] % patch:
        near = "x".join(str(max(patch, round(side / patch) * patch)) for side in size)
        raise ConfigError(f"{recipe.model.init} has {patch} px patches, which do not divide {recipe.data.dataset}'s "
                          f"{size[0]}x{size[1]} images; pass --image-size {near} (or --preset paper-finetune for "
                          f"the paper's {PAPER_SIZE} px)")
    return size


def finetune_channels(recipe: Recipe, config: ViTConfig, geometry: Geometry) -> int:
    """The channels a fine-tuned model takes: the checkpoint's, or ``--channels``; a checkpoint whose
    channels are not the data's is refused until ``--channels`` says which way to convert."""
    if recipe.model.channels:
        return CHANNELS[recipe.model.channels]
    have = data_channels(geometry, recipe.data.dataset, recipe.model.channels)
    if have != config.in_chans:
        model_side = "rgb" if have == 3 else "grey"
        data_side = "grey" if config.in_chans == 1 else "rgb"
        raise ConfigError(f"{recipe.model.init} takes {config.in_chans}-channel images and the images of "
                          f"{recipe.data.dataset} have {have} channel{'s' * (have > 1)}; pass --channels {model_side} "
                          f"(the model's patch kernel mapped to {have}) or --channels {data_side} (the images "
                          f"converted to {config.in_chans})")
    return have


def say_sizing(recipe: Recipe, config: ViTConfig, geometry: Geometry, kept_head: bool) -> None:
    """One line on how the model was sized, and one on any conversion of the images for it."""
    height, width = config.image_size
    grid = f"{height}x{width} px, patch {config.patch_size} ({config.grid_size[0]}x{config.grid_size[1]} grid)"
    dense = config.dense_head != "none"
    if recipe.model.init:
        chosen = "--image-size" if recipe.model.image_size is not None else "the checkpoint's size; choose with " \
            "--image-size" if dense else f"the data's size; --preset paper-finetune for the paper's {PAPER_SIZE} px"
        head = "its head kept (the same classes)" if kept_head else f"a new {config.num_classes}-class head"
        if dense:
            head = f"a new {config.dense_head} " + ("depth head" if config.dense_output == "depth" else
                                                     f"segmentation head ({config.num_classes} classes)")
        logger.info(f"fine-tuning {recipe.model.init} at {grid} ({chosen}), {config.in_chans}-channel input, {head}")
    else:
        sized = recipe.model.image_size is None or not {"in_chans", "patch_size"} <= recipe.model.args.keys()
        logger.info(f"model{f' sized from {recipe.data.dataset}' if sized else ''}: {config.in_chans}x{grid}, "
                    f"{config.num_classes} classes, D={config.dim}, {config.depth} layers; choose with --image-size, "
                    f"--channels, --set patch_size=N, --model or --preset")
    for conversion in conversions(geometry, config.in_chans, config.image_size):
        logger.info(f"{recipe.data.dataset}: {conversion}")
