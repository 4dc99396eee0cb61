"""k-nearest-neighbour classification of frozen representations, as DINO evaluates its features (Caron et al.
2021), beside the paper's linear probe: features are L2-normalised, a test image's k most cosine-similar
training images vote for their classes, each with weight ``exp(similarity / T)``, and the class with the most
weight is the prediction. The training features are the memory bank: all of them, or a few per class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from .fewshot import sample_shots

DEFAULT_K, DEFAULT_TEMPERATURE = 20, 0.07  # DINO's
MAX_SIMILARITIES = 2 ** 24  # entries of the (test rows, bank) similarity matrix held at once: 64 MiB in float32


def check_knn(ks: Sequence[int], bank_size: int, temperature: float) -> None:
    """Refuse neighbour counts below 1 or beyond the ``bank_size`` training features, and temperatures <= 0."""
    for k in ks:
        if k < 1:
            raise ConfigError(f"k={k}: expected at least 1 neighbour")
        if k > bank_size:
            raise ConfigError(f"k={k} neighbours, but the memory bank holds {bank_size} training features")
    if not temperature > 0:
        raise ConfigError(f"temperature={temperature}: expected a positive number")


def neighbours(train_features: np.ndarray, test_features: np.ndarray, k: int,
               max_similarities: int = MAX_SIMILARITIES) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarities ``(M, k)``, in descending order, and bank indices ``(M, k)`` of the ``k`` training
    features ``(N, d)`` nearest to each test feature ``(M, d)``; a block of test rows at a time, so that at most
    ``max_similarities`` similarities exist at once."""
    bank = F.normalize(torch.as_tensor(train_features).float(), dim=1)
    queries = F.normalize(torch.as_tensor(test_features).float(), dim=1)
    rows = max(1, max_similarities // len(bank))
    found = [(queries[start:start + rows] @ bank.T).topk(k, dim=1) for start in range(0, len(queries), rows)]
    return torch.cat([f.values for f in found]), torch.cat([f.indices for f in found])


def class_votes(similarities: torch.Tensor, neighbour_labels: torch.Tensor, temperature: float,
                num_classes: int) -> torch.Tensor:
    """``(M, C)``: per class, the sum of ``exp(similarity / T)`` over the neighbours ``(M, k)`` of that class,
    divided by the nearest neighbour's weight. The factor is one per row: it changes no ranking, and keeps the
    weights finite at any temperature (``exp(1 / 0.001)`` overflows)."""
    weights = ((similarities.double() - similarities[:, :1].double()) / temperature).exp()
    votes = torch.zeros(len(similarities), num_classes, dtype=torch.float64)
    return votes.scatter_add_(1, neighbour_labels.long(), weights)


def _accuracies(votes: torch.Tensor, labels: np.ndarray) -> tuple[float, float | None]:
    """Top-1 and top-5 accuracy of the classes ranked by their votes (equal votes: the lower class first, as
    ``argmax``); top-5 is None with fewer than 5 classes."""
    ranked = np.argsort(-votes.numpy(), axis=1, kind="stable")
    hits = ranked == np.asarray(labels)[:, None]
    top5 = float(hits[:, :5].any(axis=1).mean()) if votes.shape[1] >= 5 else None
    return float(hits[:, 0].mean()), top5


def _num_classes(train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                 test_labels: np.ndarray, num_classes: int | None) -> int:
    """``num_classes``, or one more than the largest label, once the shapes have been checked: features
    ``(N, d)`` and ``(M, d)``, one label each, labels in ``[0, num_classes)``."""
    if train_features.ndim != 2 or test_features.ndim != 2 or train_features.shape[1] != test_features.shape[1] \
            or train_labels.shape != train_features.shape[:1] or test_labels.shape != test_features.shape[:1]:
        raise ValueError(f"expected features (N, d) and (M, d) with labels (N,) and (M,), got {train_features.shape}"
                         f", {test_features.shape}, {train_labels.shape} and {test_labels.shape}")
    labels = np.concatenate([train_labels, test_labels])
    num_classes = num_classes or int(labels.max() + 1)
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]")
    return num_classes


@dataclass
class KnnResult:
    """Test accuracy of k-NN with ``k`` neighbours, averaged over the seeds of the memory bank (one seed for a
    whole split)."""

    k: int
    shots: int | None  # training images per class in the memory bank; None: every one
    top1: float
    top5: float | None  # None with fewer than 5 classes
    std: float  # of top1 over the seeds
    per_seed: list[float]  # top1


def knn_evaluate(train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                 test_labels: np.ndarray, ks: Sequence[int] = (DEFAULT_K,), temperature: float = DEFAULT_TEMPERATURE,
                 shots: Sequence[int] | None = None, seeds: Sequence[int] = (0,),
                 num_classes: int | None = None) -> list[KnnResult]:
    """k-NN for every ``k`` of ``ks``: from the whole training split, or (``shots``) from banks of that many
    training images per class, drawn per seed as the few-shot probe draws them. One neighbour search per bank
    serves every ``k`` (the nearest k are the first k of the nearest max(ks))."""
    train_features, train_labels = np.asarray(train_features), np.asarray(train_labels)
    test_features, test_labels = np.asarray(test_features), np.asarray(test_labels)
    num_classes = _num_classes(train_features, train_labels, test_features, test_labels, num_classes)
    banks = [(None, [slice(None)])] if shots is None else [  # the whole split as a view: not copied
        (shot, [sample_shots(train_labels, shot, num_classes, np.random.default_rng(seed)) for seed in seeds])
        for shot in shots]
    results = []
    for shot, picks in banks:
        check_knn(ks, len(train_labels[picks[0]]), temperature)
        scores: dict[int, list[tuple[float, float | None]]] = {k: [] for k in ks}
        for picked in picks:
            similarities, index = neighbours(train_features[picked], test_features, max(ks))
            labels = torch.as_tensor(train_labels[picked])[index]
            for k, found in scores.items():
                found.append(_accuracies(class_votes(similarities[:, :k], labels[:, :k], temperature, num_classes),
                                         test_labels))
        for k, found in scores.items():
            top1, top5 = [one for one, _ in found], [five for _, five in found]
            results.append(KnnResult(k, shot, float(np.mean(top1)), None if top5[0] is None else float(np.mean(top5)),
                                     float(np.std(top1)), top1))
    return results


def knn_classify(train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                 test_labels: np.ndarray, k: int = DEFAULT_K, temperature: float = DEFAULT_TEMPERATURE,
                 num_classes: int | None = None) -> tuple[float, float | None]:
    """Top-1 and top-5 test accuracy (top-5 None with fewer than 5 classes) of k-NN with the whole of
    ``train_features`` as the memory bank."""
    result, = knn_evaluate(train_features, train_labels, test_features, test_labels, (k,), temperature,
                           num_classes=num_classes)
    return result.top1, result.top5
