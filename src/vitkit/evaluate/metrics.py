"""Classification metrics as the paper reports them (top-1, top-5) plus per-class accuracy and the
confusion matrix, from one pass over a loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..classnames import escape_name
from ..progress import track
from ..runtime import autocast


@dataclass
class Evaluation:
    """Counts of one evaluation pass: the (K, K) confusion matrix (rows the true class, columns the predicted
    one), the top-5 hits and the summed loss; accuracies and the mean loss follow from them."""
    confusion: torch.Tensor  # (K, K) counts, rows = true class, columns = predicted class
    top5_correct: int
    loss_sum: float

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
             dtype: torch.dtype = torch.float32) -> Evaluation:
    """Run ``model`` (switched to eval mode, already on ``device``) over ``(images, labels)`` batches, its matrix
    products in ``dtype``."""
    device = torch.device(device)
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)
    top5, loss_sum = 0, 0.0
    k = min(5, num_classes)
    for images, labels in track(loader, "evaluate"):
        with autocast(device, dtype):
            logits = model(images.to(device, non_blocking=True)).float().cpu()
        loss_sum += float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
        predicted = logits.argmax(dim=-1)
        confusion += torch.bincount(labels * num_classes + predicted, minlength=num_classes ** 2).view(
            num_classes, num_classes)
        top5 += int((logits.topk(k, dim=-1).indices == labels[:, None]).any(dim=-1).sum())
    return Evaluation(confusion, top5, loss_sum)


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


def write_report(evaluation: Evaluation, classes: list[str], out_dir: str | Path | None, split: str) -> dict:
    """``eval-<split>.json`` (top-1, top-5, loss, per-class accuracy, confusion matrix) and
    ``confusion-<split>.png`` in ``out_dir`` (None: nowhere); returns the JSON content."""
    import json

    from ..atomic import atomic_file

    report = {"split": split, "images": evaluation.count, "top1": evaluation.top1, "top5": evaluation.top5,
              "loss": evaluation.loss,
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
