"""Few-shot linear evaluation as the paper does it: regularised least squares from frozen representations
onto {-1, 1}^C targets, solved in closed form (section 4.1, "few-shot accuracies").

One eigendecomposition of the (centred) Gram matrix serves every regulariser: with
``G = U diag(s) U^T`` the ridge solution for any ``l2`` is ``U diag(1 / (s + l2)) U^T`` times the
right-hand side. The Gram matrix is the smaller of ``X^T X`` (d x d) and ``X X^T`` (n x n), so a
1-shot problem over 768-d features costs an n x n eigendecomposition, not a d x d one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ConfigError
from ..progress import track

DEFAULT_L2_REGS = tuple(2.0 ** k for k in range(-10, 11, 2))
DEFAULT_SHOTS = (1, 5, 10, 25)
VALIDATION_PER_CLASS = 10  # held-out training examples of each class that choose the regulariser


def ridge_solutions(features: np.ndarray, labels: np.ndarray, num_classes: int,
                    l2_regs: Sequence[float]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Weights ``(d, C)`` and bias ``(C,)`` minimising ``|X W + b - Y|^2 + l2 |W|^2`` for each ``l2``,
    with ``Y`` the {-1, 1} one-hot targets and an unpenalised bias (as scikit-learn's ``Ridge``)."""
    x = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels)
    if x.ndim != 2 or labels.shape != (x.shape[0],):
        raise ValueError(f"expected features (n, d) and labels (n,), got {x.shape} and {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]")
    y = 2.0 * np.eye(num_classes)[labels] - 1.0
    x_mean, y_mean = x.mean(axis=0), y.mean(axis=0)
    xc, yc = x - x_mean, y - y_mean
    dual = x.shape[0] < x.shape[1]
    gram = xc @ xc.T if dual else xc.T @ xc
    eigenvalues, eigenvectors = np.linalg.eigh(gram)
    eigenvalues = np.clip(eigenvalues, 0.0, None)
    # Project the right-hand side once; each regulariser then only rescales it.
    rhs = eigenvectors.T @ (yc if dual else xc.T @ yc)
    solutions = []
    for l2 in l2_regs:
        denominator = eigenvalues + l2
        inverse = np.divide(1.0, denominator, out=np.zeros_like(denominator),
                            where=denominator > 1e-10 * max(eigenvalues.max(initial=0.0), 1.0))
        solved = eigenvectors @ (inverse[:, None] * rhs)
        weights = xc.T @ solved if dual else solved
        solutions.append((weights, y_mean - x_mean @ weights))
    return solutions


def accuracy(features: np.ndarray, labels: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> float:
    predictions = (np.asarray(features, dtype=np.float64) @ weights + bias).argmax(axis=1)
    return float((predictions == np.asarray(labels)).mean())


def sample_shots(labels: np.ndarray, shots: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``shots`` random examples of each class."""
    chosen = []
    for label in range(num_classes):
        pool = np.flatnonzero(labels == label)
        if pool.size < shots:
            raise ConfigError(f"class {label} has {pool.size} training examples, fewer than {shots} shots")
        chosen.append(rng.choice(pool, size=shots, replace=False))
    return np.concatenate(chosen)


@dataclass
class FewShotResult:
    """Test accuracy of one shot count: per regulariser and seed, and at the regulariser chosen on a
    validation split held out from the training features (never on the test set)."""

    shots: int
    l2_regs: list[float]
    accuracies: np.ndarray  # (len(l2_regs), seeds)
    selected_l2: float
    selected: list[float] = field(default_factory=list)  # test accuracy per seed at selected_l2

    @property
    def mean(self) -> float:
        return float(np.mean(self.selected))

    @property
    def std(self) -> float:
        return float(np.std(self.selected))


def fewshot_evaluate(train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                     test_labels: np.ndarray, shots: Sequence[int] = DEFAULT_SHOTS,
                     seeds: Sequence[int] = (0, 1, 2), l2_regs: Sequence[float] = DEFAULT_L2_REGS,
                     num_classes: int | None = None, validation_per_class: int = VALIDATION_PER_CLASS
                     ) -> list[FewShotResult]:
    """For each shot count and seed: sample the shots, solve every regulariser in closed form, score on
    held-out training examples (to choose the regulariser) and on the test split."""
    train_labels, test_labels = np.asarray(train_labels), np.asarray(test_labels)
    num_classes = num_classes or int(max(train_labels.max(), test_labels.max()) + 1)
    results = []
    for shot in shots:
        test_acc = np.zeros((len(l2_regs), len(seeds)))
        val_acc = np.zeros((len(l2_regs), len(seeds)))
        for column, seed in enumerate(seeds):
            rng = np.random.default_rng(seed)
            picked = sample_shots(train_labels, shot + validation_per_class, num_classes, rng)
            picked = picked.reshape(num_classes, shot + validation_per_class)
            fit, held_out = picked[:, :shot].ravel(), picked[:, shot:].ravel()
            solutions = ridge_solutions(train_features[fit], train_labels[fit], num_classes, l2_regs)
            for row, (weights, bias) in enumerate(solutions):
                val_acc[row, column] = accuracy(train_features[held_out], train_labels[held_out], weights, bias)
                test_acc[row, column] = accuracy(test_features, test_labels, weights, bias)
        best = int(val_acc.mean(axis=1).argmax())
        results.append(FewShotResult(shot, list(l2_regs), test_acc, float(l2_regs[best]), test_acc[best].tolist()))
    return results


def draw_support(labels: np.ndarray, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``per_class`` random examples of each class (the support images, drawn from ``seed``), and the
    rows of the others (the query images), each sorted: the two parts of one set of images with no split."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    support = []
    for label in np.unique(labels):
        pool = np.flatnonzero(labels == label)
        if pool.size <= per_class:
            raise ConfigError(f"class {label} has {pool.size} images: {per_class} support images leave none to query")
        support.append(rng.choice(pool, size=per_class, replace=False))
    chosen = np.zeros(len(labels), dtype=bool)
    chosen[np.concatenate(support)] = True
    return np.flatnonzero(chosen), np.flatnonzero(~chosen)


@dataclass
class SupportQuery:
    """One set of images split for few-shot evaluation: the shot counts measured, the examples of each class
    that choose the regulariser, and the rows of the support and query images."""

    shots: list[int]
    validation_per_class: int
    support: np.ndarray
    query: np.ndarray

    @property
    def per_class(self) -> int:
        return max(self.shots) + self.validation_per_class


def split_support_query(labels: np.ndarray, shots: Sequence[int] | None, seed: int) -> SupportQuery:
    """Support and query images drawn from one set (``labels``, one per image) with ``seed``: of each class the
    largest shot count and ``VALIDATION_PER_CLASS`` to choose the regulariser, the rest to query. A small set
    keeps at least one image of each class to query: fewer choose the regulariser, and without ``shots`` the
    default shot counts that fit are measured."""
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    smallest = int(counts.min())
    shots = list(shots or [shot for shot in DEFAULT_SHOTS if shot + 2 <= smallest])
    if not shots or max(shots) + 2 > smallest:
        needed = max(shots, default=1) + 2
        raise ConfigError(f"class {classes[counts.argmin()]} has {smallest} images; {needed} are needed (the shots, "
                          f"one to choose the regulariser and one to query)")
    validation = min(VALIDATION_PER_CLASS, smallest - max(shots) - 1)
    return SupportQuery(shots, validation, *draw_support(labels, max(shots) + validation, seed))


def linear_probe(train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                 test_labels: np.ndarray, l2_regs: Sequence[float] = DEFAULT_L2_REGS,
                 validation_fraction: float = 0.1, seed: int = 0) -> tuple[float, float]:
    """The full linear probe: the same closed form on every training example; the regulariser is chosen
    on a random ``validation_fraction`` of them, then refit on all. Returns (test accuracy, l2)."""
    train_labels = np.asarray(train_labels)
    num_classes = int(max(train_labels.max(), np.max(test_labels)) + 1)
    order = np.random.default_rng(seed).permutation(len(train_labels))
    cut = max(1, int(len(order) * validation_fraction))
    val, fit = order[:cut], order[cut:]
    solutions = ridge_solutions(train_features[fit], train_labels[fit], num_classes, l2_regs)
    scores = [accuracy(train_features[val], train_labels[val], w, b) for w, b in solutions]
    l2 = float(l2_regs[int(np.argmax(scores))])
    weights, bias = ridge_solutions(train_features, train_labels, num_classes, [l2])[0]
    return accuracy(test_features, test_labels, weights, bias), l2


@torch.inference_mode()
def extract_features(model: torch.nn.Module, batches: Iterable, device: str | torch.device = "cpu"
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Frozen representations (the pre-logits, i.e. the input of the head) and labels of every batch."""
    model.eval().to(device)
    features, labels = [], []
    for images, targets in track(batches, "features"):
        tokens = model.forward_features(images.to(device))
        # a model of several pooled tokens (Gemma 4's soft tokens) is represented by all of them side by side
        features.append(model.forward_head(tokens, pre_logits=True).flatten(1).float().cpu().numpy())
        labels.append(np.asarray(targets))
    return np.concatenate(features), np.concatenate(labels)
