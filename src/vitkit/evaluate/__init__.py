"""Evaluation: top-1/top-5, per-class accuracy, confusion matrices, predictions for image files; and what the
``eval``, ``fewshot``, ``predict`` and ``analyze`` commands do, as functions of a model and a dataset name or files."""

from .accuracy import DatasetEvaluation, evaluate_dataset
from .analyze import CheckpointAnalysis, analyze_checkpoint
from .metrics import Evaluation, confusion_figure, evaluate
from .predict import Prediction, predict, predict_files
from .probes import ProbeEvaluation, probe_dataset

__all__ = ["CheckpointAnalysis", "DatasetEvaluation", "Evaluation", "Prediction", "ProbeEvaluation",
           "analyze_checkpoint", "confusion_figure", "evaluate", "evaluate_dataset", "predict", "predict_files",
           "probe_dataset"]
