"""Frozen representations of a model measured on a named dataset, as ``vitkit fewshot`` does: the paper's few-shot
linear evaluation, on request the full linear probe and k-NN classification (DINO's protocol), from one pass of
feature extraction over the support and query images; the numbers kept as ``fewshot.json`` on request."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_file
from ..data import ALL, SplitSpec, default_split, evaluation_loader, load_splits
from ..runtime import autocast
from .fewshot import (DEFAULT_L2_REGS, DEFAULT_SHOTS, VALIDATION_PER_CLASS, FewShotResult, SupportQuery,
                      extract_features, fewshot_evaluate, linear_probe, split_support_query)
from .knn import DEFAULT_TEMPERATURE, KnnResult, check_knn, knn_evaluate
from .preprocessing import checkpoint_transform

FEWSHOT_FILE = "fewshot.json"


@dataclass
class ProbeEvaluation:
    """What ``probe_dataset`` measured: the few-shot results (one per shot count), the full linear probe's
    (accuracy, l2) when asked for, the k-NN results when asked for, how support and query were drawn from one
    split (``drawn``; None when they are the train split and the split measured), the JSON report and the file
    it was written to."""

    dataset: str
    split: str
    fewshot: list[FewShotResult]
    linear_probe: tuple[float, float] | None
    knn: list[KnnResult] | None
    drawn: SupportQuery | None
    report: dict
    written: Path | None


def probe_dataset(model: torch.nn.Module, dataset: str, split: str | None = None, *,
                  data_dir: str | Path | None = None, shots: Sequence[int] | None = None, seeds: int = 5,
                  l2_regs: Sequence[float] = DEFAULT_L2_REGS, full_probe: bool = False,
                  knn: Sequence[int] | None = None, knn_temperature: float = DEFAULT_TEMPERATURE,
                  batch_size: int = 256, resize: str = "crop", device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32, source: str = "", out: str | Path | None = None
                  ) -> ProbeEvaluation:
    """Few-shot linear evaluation of ``model``'s frozen representations (``model`` on ``device``, computing in
    ``dtype``) on ``split`` of ``dataset`` (default: its test split, else validation, else all), ``seeds``
    repeats of each shot count (default: ``DEFAULT_SHOTS``) with the regulariser chosen among ``l2_regs``; the
    support images come from the train split, or are drawn from the images measured when ``split`` is train or
    all. ``full_probe`` also fits on every support image; ``knn`` adds k-NN with each k (memory banks of
    ``shots`` per class, else every support image). The report names ``source`` as the checkpoint and is
    written to ``out/fewshot.json`` when ``out`` is given."""
    device = torch.device(device)
    chosen = split or default_split(dataset)
    drawing = chosen in (ALL, "train")  # support and query are drawn from the same images
    splits = load_splits(dataset, (chosen,) if drawing else ("train", chosen), data_dir, SplitSpec(0.0))
    if knn:  # before the features are computed: a bank too small for k is known from the split's size
        train = next(iter(splits.values()))
        check_knn(knn, min(shots) * len(train.classes) if shots else len(train), knn_temperature)
    transform = checkpoint_transform(model.config, resize)
    features = {}
    for name, data in splits.items():
        with autocast(device, dtype):
            features[name] = extract_features(model, evaluation_loader(data, transform, batch_size, device=device),
                                              device)
    drawn = split_support_query(features[chosen][1], shots, seed=0) if drawing else None
    if drawn:
        support, query = _rows(features[chosen], drawn.support), _rows(features[chosen], drawn.query)
        shot_counts, validation = drawn.shots, drawn.validation_per_class
    else:
        support, query = features["train"], features[chosen]
        shot_counts, validation = list(shots or DEFAULT_SHOTS), VALIDATION_PER_CLASS
    results = fewshot_evaluate(*support, *query, shots=shot_counts, seeds=range(seeds), l2_regs=l2_regs,
                               validation_per_class=validation)
    report: dict = {"checkpoint": source, "dataset": dataset, "split": chosen,
                    "fewshot": {r.shots: {"mean": r.mean, "std": r.std, "l2": r.selected_l2, "per_seed": r.selected}
                                for r in results}}
    probe = linear_probe(*support, *query, l2_regs=l2_regs) if full_probe else None
    if probe:
        report["linear_probe"] = {"accuracy": probe[0], "l2": probe[1]}
    found = knn_evaluate(*support, *query, knn, knn_temperature, shots, range(seeds)) if knn else None
    if found is not None:
        report["knn"] = {"temperature": knn_temperature, "results": [dataclasses.asdict(r) for r in found]}
    written = None
    if out:
        written = Path(out) / FEWSHOT_FILE
        with atomic_file(written) as handle:
            json.dump(report, handle, indent=1)
    return ProbeEvaluation(dataset, chosen, results, probe, found, drawn, report, written)


def _rows(pair: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (features, labels) of ``rows``."""
    features, labels = pair
    return features[rows], labels[rows]
