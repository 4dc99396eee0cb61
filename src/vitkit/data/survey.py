"""What a dataset holds (``vitkit data info``), the size and channels of its images (which size a new model),
and whether every image of it decodes (``vitkit data verify``, the up-front check that listing no longer
makes, spread over DataLoader workers)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..errors import DatasetError
from ..progress import track
from .dense import task_of
from .map_style import ArrayDataset
from .loading import Transformed, worker_options
from .shards import EvaluationStream, ShardedSplit
from .transforms import Preset, input_conversion

AS_IS = Preset(torch.nn.Identity(), torch.nn.Identity())


def class_counts(dataset) -> Counter:
    """Images per label: from the index pass for shards, from the labels for the others."""
    if isinstance(dataset, ShardedSplit):
        return Counter(dataset.class_counts)
    labels = dataset.labels if hasattr(dataset, "labels") else [label for _, label in dataset]
    return Counter(torch.as_tensor(labels).tolist())


def describe(splits: dict[str, object]) -> dict:
    """Split sizes, class names and the images of each class per split. A dense dataset (masks or depth maps)
    has no label an image to count: its report names its task and counts no images per class."""
    first = next(iter(splits.values()))
    report = {"classes": list(first.classes), "splits": {}}
    dense = task_of(first) != "classification"
    if dense:
        report["task"] = first.task
    for name, dataset in splits.items():
        counts = {} if dense else class_counts(dataset)
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


@dataclass(frozen=True)
class Geometry:
    """What a dataset's images look like, from a sample of them: ``size`` (height, width; the median of each
    side where the sample's sizes differ) and, for each channel count met, an image that has it."""

    size: tuple[int, int]
    channels: dict[int, str]


GEOMETRY_SAMPLE = 32  # images read to size a dataset held as files: spread over it, decoded in well under a second


def image_geometry(dataset) -> Geometry:
    """The :class:`Geometry` of ``dataset``: exact for images held in one array, from ``GEOMETRY_SAMPLE``
    images spread over a dataset of files, and from the first readable sample of a sharded one."""
    if isinstance(dataset, ArrayDataset):
        channels, height, width = dataset.images.shape[1:]
        return Geometry((height, width), {channels: f"{dataset.name} #0"})
    if isinstance(dataset, ShardedSplit):
        shard = dataset.shards[0]
        found = dataset.first_usable(shard)
        if found is None:
            raise DatasetError(f"{shard.path}: no readable sample to size the model from")
        return _geometry([(dataset.decode(shard, *found)[0], f"{shard.path}:{found[0]}")])
    picks = np.unique(np.linspace(0, len(dataset) - 1, min(len(dataset), GEOMETRY_SAMPLE)).round().astype(int))
    return _geometry([(dataset[int(index)][0], _image_name(dataset, int(index))) for index in picks])


def conversions(geometry: Geometry, channels: int, size: tuple[int, int]) -> list[str]:
    """How the images of ``geometry`` are converted for a model of ``channels`` x ``size``, in words: one
    entry per channel count met that needs it (see ``input_conversion``)."""
    found = (input_conversion(have, geometry.size, channels, size) for have in geometry.channels)
    return [text for text in found if text]


def _image_name(dataset, index: int) -> str:
    return str(dataset.path(index)) if hasattr(dataset, "path") else f"{dataset.name} #{index}"


def _geometry(images: list[tuple[torch.Tensor, str]]) -> Geometry:
    heights = [image.shape[-2] for image, _ in images]
    widths = [image.shape[-1] for image, _ in images]
    channels: dict[int, str] = {}
    for image, name in images:
        channels.setdefault(image.shape[-3], name)
    return Geometry((int(np.median(heights)), int(np.median(widths))), channels)
