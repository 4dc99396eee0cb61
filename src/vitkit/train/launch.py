"""Starting a run as the ``vitkit train``/``finetune`` commands do: a run that cannot fit this machine is refused
before any data or weights are loaded, then trained (``run``)."""

from __future__ import annotations

from typing import Any

import torch

from ..checkpoints.runnable import source_config
from ..memory import check_workers
from ..models import ViTConfig, model_config
from ..models.config import pair
from ..runtime import select_device
from .recipes import DENSE_OBJECTIVES, Recipe
from .run import check_run_memory, run
from .sizing import check_size, patch_for


def check_run_size(recipe: Recipe, device: torch.device, command: str = "vitkit train") -> None:
    """Refuse a run that cannot fit before any data or weights are loaded: more loader processes than CPUs, or a
    peak memory (``vitkit.memory``) above what the machine has, named with the flags that would fit. A run sized
    from its data is checked once the data has said its size, a dense run once it has said its classes, which size
    the head (``train.run.prepare``)."""
    check_workers(recipe.data.num_workers)
    if recipe.model.image_size is None or recipe.objective.kind in DENSE_OBJECTIVES:
        return
    size = pair(recipe.model.image_size)
    if recipe.model.init:
        config = source_config(recipe.model.init, {"image_size": size, **recipe.model.args})
    elif recipe.model.name:
        config = model_config(recipe.model.name, image_size=size, **recipe.model.args)
    else:  # the patch a new model takes at this size (train.sizing), so that the estimate counts its tokens
        args = {"patch_size": patch_for(size), **recipe.model.args}
        if "patch_size" not in recipe.model.args:  # the chosen patch, refused as sizing refuses it
            check_size(size, args["patch_size"], "--image-size")
        config = ViTConfig().replace(image_size=size, **args)
    check_run_memory(recipe, config, device, command)


def train(recipe: Recipe, resume: bool = False, device: str | None = None,
          command: str = "vitkit train") -> dict[str, Any]:
    """Train (or fine-tune) as ``recipe`` says on ``device`` (default: the best available), after refusing a run
    that cannot fit (``check_run_size``; ``command`` names it in the refusal); returns the run's summary (see
    ``run``). Under torchrun, the entry point leaves the process group afterwards (``distributed.leave``)."""
    chosen = select_device(device)
    check_run_size(recipe, chosen, command)
    return run(recipe, resume=resume, device=device and str(chosen))
