"""What a training run recorded about itself, read back for the commands that measure one of its checkpoints:
the run folder a checkpoint lies in, and the dataset (with its folder and held-out fraction) it was trained on."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .presets import read_config_file
from .recipes import Recipe
from .run import RECIPE_FILE

logger = logging.getLogger(__name__)


def run_folder(checkpoint: str | Path) -> Path | None:
    """The run a checkpoint was written by (its ``model``, ``best`` or ``checkpoints/step-N`` folder lies in
    a folder holding the run's recipe), or None."""
    path = Path(checkpoint)
    return next((folder for folder in (path.parent, path.parent.parent) if (folder / RECIPE_FILE).is_file()), None)


@dataclass(frozen=True)
class RunData:
    """The data a run was trained on, as its recipe records it, and the run's folder."""

    run_dir: Path
    dataset: str
    data_dir: str | None
    val_fraction: float


def recorded_data(checkpoint: str | Path) -> RunData:
    """The dataset the run beside ``checkpoint`` was trained on, from its recipe (read once), said in one line
    (logged); without a run, a ConfigError asking for the dataset."""
    run_dir = run_folder(checkpoint)
    if run_dir is None:
        raise ConfigError(f"{checkpoint}: no run beside it records the dataset it was trained on; pass "
                          f"--dataset (digits, mnist, cifar10, npz:PATH, imagefolder:PATH, ...)")
    recipe = Recipe.from_dict(read_config_file(run_dir / RECIPE_FILE), str(run_dir / RECIPE_FILE))
    logger.info(f"dataset {recipe.data.dataset}, as recorded by the run in {run_dir}")
    return RunData(run_dir, recipe.data.dataset, recipe.data.data_dir, recipe.data.val_fraction)
