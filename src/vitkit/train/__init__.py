"""Training: optimisers and schedules, objectives, the loop (checkpoints, resume, DDP), recipes."""

from ..errors import TrainingDiverged
from .ema import EMA
from .objectives import Classification, Objective
from .optim import decay_mask, learning_rate, make_optimizer
from .recipes import RECIPE_PRESETS, Recipe, resolve
from .run import build_model, run
from .trainer import LoopConfig, Trainer

__all__ = ["EMA", "RECIPE_PRESETS", "Classification", "LoopConfig", "Objective", "Recipe", "Trainer",
           "TrainingDiverged", "build_model", "decay_mask", "learning_rate", "make_optimizer", "resolve", "run"]
