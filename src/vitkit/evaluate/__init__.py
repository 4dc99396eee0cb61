"""Evaluation: top-1/top-5, per-class accuracy, confusion matrices, predictions for image files."""

from .metrics import Evaluation, confusion_figure, evaluate
from .predict import Prediction, predict

__all__ = ["Evaluation", "Prediction", "confusion_figure", "evaluate", "predict"]
