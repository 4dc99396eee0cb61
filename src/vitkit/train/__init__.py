"""Training: recipes, a run wired from one (``run``, ``launch``), the ``Trainer`` with its EMA, metrics log and
signal handling beside it, run checkpoints and resume, DDP/FSDP, optimisers, schedules and objectives."""

from ..errors import TrainingDiverged
from .ema import EMA
from .launch import check_run_size, train
from .objectives import Classification, Objective
from .optim import decay_mask, learning_rate, make_optimizer
from .presets import RECIPE_PRESETS, resolve
from .recipes import Recipe
from .records import RunData, recorded_data
from .run import build_model, run
from .trainer import LoopConfig, Trainer

__all__ = ["EMA", "RECIPE_PRESETS", "Classification", "LoopConfig", "Objective", "Recipe", "RunData", "Trainer",
           "TrainingDiverged", "build_model", "check_run_size", "decay_mask", "learning_rate", "make_optimizer",
           "recorded_data", "resolve", "run", "train"]
