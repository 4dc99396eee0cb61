"""Classification metrics as the paper reports them (top-1, top-5) plus per-class accuracy and the
confusion matrix, from one pass over a loader."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..classnames import escape_name
from ..data.sources.imagenet import val_number
from ..errors import DatasetError, parse_json
from ..paths import read_text
from ..progress import track
from ..runtime import autocast


@dataclass
class Evaluation:
    """Counts of one evaluation pass: the (K, K) confusion matrix (rows the true class, columns the predicted
    one), the top-5 hits and the summed loss; accuracies and the mean loss follow from them."""
    confusion: torch.Tensor  # (K, K) counts, rows = true class, columns = predicted class
    top5_correct: int
    loss_sum: float
    predictions: torch.Tensor | None = None  # (N,) top-1 class of each image in the loader's order, when kept

    @property
    def count(self) -> int:
        """Images evaluated."""
        return int(self.confusion.sum())

    @property
    def top1(self) -> float:
        """Top-1 accuracy, a fraction of 1."""
        return float(self.confusion.diagonal().sum()) / max(self.count, 1)

    @property
    def top5(self) -> float:
        """Top-5 accuracy, a fraction of 1."""
        return self.top5_correct / max(self.count, 1)

    @property
    def loss(self) -> float:
        """Mean cross-entropy per image."""
        return self.loss_sum / max(self.count, 1)

    @property
    def per_class(self) -> torch.Tensor:
        """Accuracy of each true class (NaN for a class with no images)."""
        totals = self.confusion.sum(dim=1).double()
        return self.confusion.diagonal().double() / totals

    def summary(self, prefix: str) -> dict[str, float]:
        """``{prefix}/accuracy``, ``{prefix}/top5`` and ``{prefix}/loss``, as metrics.jsonl and summary.json
        hold them."""
        return {f"{prefix}/accuracy": self.top1, f"{prefix}/top5": self.top5, f"{prefix}/loss": self.loss}


@torch.no_grad()
def evaluate(model: nn.Module, loader, num_classes: int, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32, keep_predictions: bool = False) -> Evaluation:
    """Run ``model`` (switched to eval mode, already on ``device``) over ``(images, labels)`` batches, its matrix
    products in ``dtype``; with ``keep_predictions`` the top-1 class of every image is kept (for ReaL top-1)."""
    device = torch.device(device)
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)
    top5, loss_sum, kept = 0, 0.0, []
    k = min(5, num_classes)
    for images, labels in track(loader, "evaluate"):
        with autocast(device, dtype):
            logits = model(images.to(device, non_blocking=True)).float().cpu()
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        predicted = logits.argmax(dim=-1)
        if keep_predictions:
            kept.append(predicted)
        confusion += torch.bincount(labels * num_classes + predicted, minlength=num_classes ** 2).view(
            num_classes, num_classes)
        top5 += int((logits.topk(k, dim=-1).indices == labels[:, None]).any(dim=-1).sum())
    return Evaluation(confusion, top5, loss_sum, torch.cat(kept) if keep_predictions and kept else None)


def real_accuracy(predictions: Sequence[int] | torch.Tensor, real_labels: Sequence[Sequence[int]]) -> tuple[float, int]:
    """ReaL top-1 (Beyer et al. 2020, "Are we done with ImageNet?"): a prediction is right when it is one of its
    image's reassessed labels; images whose label set is empty are left out. Returns (accuracy as a fraction of
    1, images counted); ``predictions`` and ``real_labels`` are in the same (the validation set's) order."""
    predictions = [int(p) for p in predictions]
    if len(predictions) != len(real_labels):
        raise ValueError(f"{len(predictions)} predictions for {len(real_labels)} ReaL label sets")
    counted = [(p, labels) for p, labels in zip(predictions, real_labels) if len(labels)]
    right = sum(p in labels for p, labels in counted)
    return right / max(len(counted), 1), len(counted)


def read_real_labels(path: str | Path, images: int, num_classes: int) -> list[list[int]]:
    """The reassessed labels of ImageNet's validation set from ``real.json`` (google-research/reassessed-imagenet:
    a JSON list holding, for each validation image in file order, the list of its label indices), checked
    against the ``images`` of the validation set and its ``num_classes``; a DatasetError naming the file and
    what was expected otherwise."""
    expected = f"expected a JSON list of {images} lists of class indices in 0..{num_classes - 1}"
    try:
        data = parse_json(read_text(path, "ReaL labels"))
    except ValueError as error:  # not JSON, or not UTF-8
        raise DatasetError(f"{path}: not a ReaL label file ({error}); {expected}") from error
    if not isinstance(data, list):
        raise DatasetError(f"{path}: holds a JSON {type(data).__name__}; {expected}")
    if len(data) != images:
        raise DatasetError(f"{path}: holds {len(data)} label sets for a validation set of {images} images; "
                           f"{expected}")
    for index, labels in enumerate(data):
        if not (isinstance(labels, list) and all(type(label) is int and 0 <= label < num_classes
                                                  for label in labels)):
            raise DatasetError(f"{path}: entry {index} is {str(labels)[:60]}; {expected}")
    return data


def real_labels_in_order(real_labels: list[list[int]], names: Sequence[str]) -> list[list[int]]:
    """``real_labels`` (in ImageNet's validation file order) in the order of the images named ``names``: by the
    number of each ``ILSVRC2012_val_NNNNNNNN`` file where every name has one (a ``val/`` folder of class
    folders lists them class by class), else as they are (a set in file order)."""
    numbers = [val_number(name) for name in names]
    if not names or None in numbers:
        return real_labels
    ordered = []
    for name, number in zip(names, numbers):
        if not 1 <= number <= len(real_labels):
            raise DatasetError(f"{name}: validation image {number} has no ReaL label set (the file holds "
                               f"{len(real_labels)}); expected ImageNet's validation files")
        ordered.append(real_labels[number - 1])
    return ordered


def real_top1(evaluation: Evaluation, path: str | Path, dataset, num_classes: int) -> dict[str, float | int]:
    """ReaL top-1 of an ``evaluation`` made with ``keep_predictions`` over ``dataset`` (the validation set, in
    the loader's order), its labels read from ``path`` (``read_real_labels``) and put in the images' order."""
    real = read_real_labels(path, len(dataset), num_classes)
    names = [dataset.path(index).name for index in range(len(dataset))] if hasattr(dataset, "path") else []
    accuracy, counted = real_accuracy(evaluation.predictions, real_labels_in_order(real, names))
    return {"real_top1": accuracy, "real_images": counted}


TICK_CHARACTERS = 24  # longer class names are shortened on the axes (the JSON report keeps them whole)


def confusion_figure(confusion: torch.Tensor, classes: list[str], path: str | Path, title: str = "") -> Path:
    """Draw the row-normalised confusion matrix (``confusion_plot``) and save it as a PNG (atomically), cropped
    to everything drawn, so that no label is clipped."""
    import matplotlib.pyplot as plt

    from ..atomic import atomic_file

    figure = confusion_plot(confusion, classes, title)
    path = Path(path)
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=120, bbox_inches="tight", pad_inches=0.1)
    plt.close(figure)
    return path


def confusion_plot(confusion: torch.Tensor, classes: list[str], title: str = ""):
    """The row-normalised confusion matrix with its counts (up to 20 classes) as a matplotlib figure. The cells
    keep a size that stays legible from 2 to 100+ classes; the predicted classes' names stand upright and names
    longer than ``TICK_CHARACTERS`` shortened, so that no two labels overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = confusion.numpy()
    rates = counts / counts.sum(axis=1, keepdims=True).clip(min=1)
    count, few = len(classes), len(classes) <= 20
    side = max(3.0, (0.5 if few else 0.2) * count)  # inches: room for a count in each cell, or for a 6 pt name
    fontsize = 8 if few else 6
    figure, axes = plt.subplots(figsize=(side + 1.5, side))
    shown = axes.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    figure.colorbar(shown, ax=axes, fraction=min(0.046, 0.4 / side), pad=0.02, label="fraction of the true class")
    names = [escape_name(name) for name in classes]  # one line each, and drawable: no surrogate, no control
    names = [name if len(name) <= TICK_CHARACTERS else name[:TICK_CHARACTERS - 1] + "\N{HORIZONTAL ELLIPSIS}"
             for name in names]
    axes.set_xticks(range(count), names, fontsize=fontsize, rotation=90)
    axes.set_yticks(range(count), names, fontsize=fontsize)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    if few:
        for row in range(count):
            for col in range(count):
                if counts[row, col]:
                    axes.text(col, row, str(counts[row, col]), ha="center", va="center", fontsize=7,
                              color="white" if rates[row, col] > 0.5 else "black")
    axes.set_title(title)
    return figure


def write_report(evaluation: Evaluation, classes: list[str], out_dir: str | Path | None, split: str,
                 extra: dict | None = None) -> dict:
    """``eval-<split>.json`` (top-1, top-5, loss, per-class accuracy, confusion matrix, and the ``extra`` fields:
    ReaL top-1 where measured, a zero-shot run's prompts) and ``confusion-<split>.png`` in ``out_dir`` (None:
    nowhere); returns the JSON content."""
    import json

    from ..atomic import atomic_file

    report = {"split": split, "images": evaluation.count, "top1": evaluation.top1, "top5": evaluation.top5,
              "loss": evaluation.loss, **(extra or {}),
              "per_class": {name: (None if acc != acc else acc)
                            for name, acc in zip(classes, evaluation.per_class.tolist())},
              "confusion": evaluation.confusion.tolist()}
    if out_dir is None:
        return report
    out_dir = Path(out_dir)
    with atomic_file(out_dir / f"eval-{split}.json") as handle:
        json.dump(report, handle, indent=1)
    confusion_figure(evaluation.confusion, classes, out_dir / f"confusion-{split}.png",
                     title=f"{split}: top-1 {100 * evaluation.top1:.2f}%")
    return report
