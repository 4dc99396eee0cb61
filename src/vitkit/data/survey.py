"""What a dataset holds (``vitkit data info``) and whether every image of it decodes (``vitkit data verify``,
the up-front check that listing no longer makes, spread over DataLoader workers)."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils.data import DataLoader

from ..progress import track
from .loading import Transformed, worker_options
from .shards import EvaluationStream, ShardedSplit
from .transforms import Preset

AS_IS = Preset(torch.nn.Identity(), torch.nn.Identity())


def class_counts(dataset) -> Counter:
    """Images per label: from the index pass for shards, from the labels for the others."""
    if isinstance(dataset, ShardedSplit):
        return Counter(dataset.class_counts)
    labels = dataset.labels if hasattr(dataset, "labels") else [label for _, label in dataset]
    return Counter(torch.as_tensor(labels).tolist())


def describe(splits: dict[str, object]) -> dict:
    """Split sizes, class names and the images of each class per split."""
    report = {"classes": list(next(iter(splits.values())).classes), "splits": {}}
    for name, dataset in splits.items():
        counts = class_counts(dataset)
        report["splits"][name] = {"images": len(dataset),
                                  "per_class": {dataset.classes[c]: n for c, n in sorted(counts.items())}}
        if isinstance(dataset, ShardedSplit):
            report["splits"][name].update(shards=len(dataset.shards), unusable=dataset.bad)
    return report


def _unreadable(items) -> list[str]:
    return [name for _, _, names in items for name in names]


def unreadable_images(dataset, num_workers: int = 0, batch_size: int = 64) -> list[str]:
    """Decode every image of ``dataset`` (in ``num_workers`` processes); the names of those that fail."""
    if isinstance(dataset, ShardedSplit):
        source = EvaluationStream(dataset, AS_IS, corrupt="skip")
        num_workers = min(num_workers, len(dataset.shards))
    else:
        source = Transformed(dataset, AS_IS, corrupt="skip")
    loader = DataLoader(source, batch_size=batch_size, collate_fn=_unreadable, **worker_options(num_workers))
    return [name for names in track(loader, "verify") for name in names]
