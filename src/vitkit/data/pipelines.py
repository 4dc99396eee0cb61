"""From a dataset to the loaders of a run, whatever its kind: map-style datasets go through the
step-indexed ``StepSampler``, sharded ones (``ShardedSplit``) through their streams. Both give
training micro-batches ``(images, labels, names of files replaced)`` fixed by (seed, step), and
evaluation batches ``(images, labels)`` over every image once.

The workers decode and transform images and send them as uint8, a quarter of float32's bytes; the
preset's per-batch step (float conversion, normalisation) runs where the batch arrives: on an accelerator
after a non-blocking copy, on the CPU into a batch buffer that is reused once the batch before is dropped.
Fresh memory is what a float batch costs most on the CPU (on this project's 2-core VM a new 64 x 224 px
batch takes over 10x the time of one already touched), and the folder loader built this way runs at 1.23x
torchvision's ImageFolder loader for a fifth of a core in the main process (both in
benchmarks/results/data.md, from benchmarks/bench_data.py).
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError
from .loading import StepSampler, Transformed, eval_loader, step_loader, worker_options
from .shards import EvaluationStream, ShardedSplit, TrainingStream
from .transforms import Preset, ToModelInput

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


class BatchBuffers:
    """Float batches for the per-batch step to write into on the CPU, each reused once the batch it held is
    dropped everywhere: the tensor lent out wraps a numpy view of a kept buffer, and torch holds that view
    until the tensor's storage (any view of it, anything autograd saved) is freed. A batch still held when
    the next arrives never has its buffer written over. Up to ``keep`` idle buffers are kept, of any size
    (a smaller batch takes the front of a larger buffer); ``clear`` lets them go."""

    def __init__(self, keep: int = 2):
        self.keep, self.idle = keep, []

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        size = math.prod(shape)
        fits = [i for i in reversed(range(len(self.idle))) if self.idle[i].size >= size]  # the latest returned first
        if fits:
            buffer = self.idle.pop(min(fits, key=lambda i: self.idle[i].size))
        else:
            buffer = np.empty(size, dtype=np.float32)
        lent = buffer[:size].reshape(shape)
        weakref.finalize(lent, self._return, buffer)
        return torch.from_numpy(lent)

    def _return(self, buffer: np.ndarray) -> None:
        if len(self.idle) < self.keep:
            self.idle.append(buffer)

    def clear(self) -> None:
        self.idle.clear()


class Arrived:
    """The batches of ``loader`` (uint8 images) finished where they arrive: moved to ``device`` (if any), then
    ``per_batch`` applied to the images (into a reused buffer on the CPU)."""

    def __init__(self, loader: DataLoader, per_batch: ToModelInput | torch.nn.Identity,
                 device: torch.device | None = None):
        self.loader, self.per_batch, self.device, self.buffers = loader, per_batch, device, BatchBuffers()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple]:
        try:
            for images, *rest in self.loader:
                if self.device is not None:
                    images = images.to(self.device, non_blocking=True)
                yield self.finish(images), *rest
        finally:  # an evaluation loader lives as long as its run: its buffers need not
            self.buffers.clear()

    def finish(self, images: torch.Tensor) -> torch.Tensor:
        if isinstance(self.per_batch, ToModelInput) and images.device.type == "cpu":
            return self.per_batch(images, out=self.buffers.take(tuple(images.shape)))
        return self.per_batch(images)


def for_workers(preset: Preset) -> Preset:
    """What the loader's workers run of ``preset``: the per-image steps; the per-batch step waits for the
    batch's arrival (see the module doc)."""
    return Preset(preset.per_image, torch.nn.Identity())


def training_loader(dataset, preset: Preset, *, global_batch: int, total_steps: int, start_step: int, seed: int,
                    accum_steps: int = 1, rank: int = 0, world_size: int = 1, num_workers: int = 0,
                    corrupt: str = "fail", device: torch.device | None = None) -> Arrived:
    """This rank's micro-batches for steps ``start_step .. total_steps - 1`` (images on ``device`` if given)."""
    preset, arrival = for_workers(preset), preset.per_batch
    if not isinstance(dataset, ShardedSplit):
        sampler = StepSampler(len(dataset), global_batch, total_steps, seed=seed, start_step=start_step,
                              accum_steps=accum_steps, rank=rank, world_size=world_size)
        loader = step_loader(Transformed(dataset, preset, seed, corrupt), sampler, num_workers)
        return Arrived(loader, arrival, device)
    micro = StepSampler.micro_batch(global_batch, world_size, accum_steps)
    if len(dataset) < global_batch:
        raise ConfigError(f"dataset of {len(dataset)} images is smaller than the global batch {global_batch}")
    stream = TrainingStream(dataset, preset, seed=seed, micro_batch=micro, rank=rank,
                            start_micro_batch=start_step * accum_steps, world_size=world_size,
                            num_workers=num_workers, corrupt=corrupt)
    loader = DataLoader(stream, batch_size=micro, collate_fn=stream.collate_training,  # leaves the global RNG alone
                        generator=torch.Generator().manual_seed(seed), **worker_options(num_workers))
    return Arrived(loader, arrival, device)


def evaluation_loader(dataset, preset: Preset, batch_size: int, num_workers: int = 0, corrupt: str = "fail",
                      device: torch.device | None = None) -> Arrived:
    """Every image of ``dataset`` once, in its order (``corrupt='skip'`` leaves unreadable ones out)."""
    preset, arrival = for_workers(preset), preset.per_batch
    if not isinstance(dataset, ShardedSplit):
        loader = eval_loader(Transformed(dataset, preset, corrupt=corrupt), batch_size, num_workers)
        return Arrived(loader, arrival, device)
    stream = EvaluationStream(dataset, preset, corrupt)
    workers = min(num_workers, len(dataset.shards))  # a worker without a shard would idle
    loader = DataLoader(stream, batch_size=batch_size, collate_fn=stream.collate, generator=torch.Generator(),
                        **worker_options(workers))
    return Arrived(loader, arrival, device)
