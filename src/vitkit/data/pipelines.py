"""From a dataset to the loaders of a run, whatever its kind: map-style datasets go through the
step-indexed ``StepSampler``, sharded ones (``ShardedSplit``) through their streams. Both give
training micro-batches ``(images, labels, names of files replaced)`` fixed by (seed, step), and
evaluation batches ``(images, labels)`` over every image once.

For the CPU, the workers decode, transform and normalise each image straight into its row of a batch kept in
shared memory and reused (``slots``): fresh memory is what a float batch costs most on the CPU (over 10x the time
of memory already touched on this project's 2-core VM), and the main process maps each of their slots once a pass and
lends each batch, so nearly all of its core is left to training. For an accelerator the workers send uint8, a
quarter of float32's bytes, and the per-batch step (float conversion, normalisation) runs on the device after a
non-blocking copy. Measured by benchmarks/bench_data.py (benchmarks/results/data.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError
from .loading import StepSampler, Transformed, eval_loader, step_loader, worker_options
from .shards import EvaluationStream, ShardedSplit, TrainingStream
from .slots import SlotBatch
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


class Arrived:
    """The batches of ``loader`` finished where they arrive: a batch the workers finished in one of their slots
    is lent (see ``slots``); uint8 images for an accelerator are moved to ``device`` and there go through
    ``per_batch``."""

    def __init__(self, loader: DataLoader, per_batch: ToModelInput | torch.nn.Identity,
                 device: torch.device | None = None):
        self.loader, self.per_batch, self.device = loader, per_batch, device
        self.mapped: dict[tuple[int, int], tuple] = {}  # workers' slots, held so that torch maps each once a pass

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple]:
        batches = iter(self.loader)
        try:
            for images, *rest in batches:
                yield self.finish(images), *rest
        finally:  # an evaluation loader lives as long as its run: its slots need not stay between passes
            stop_workers(batches)
            self.mapped.clear()
            if self.loader.dataset.batch_slots is not None:  # those filled here, without workers
                self.loader.dataset.batch_slots.clear()

    def finish(self, images: torch.Tensor | SlotBatch) -> torch.Tensor:
        if isinstance(images, SlotBatch):
            self.mapped[images.busy.data_ptr(), images.index] = images.images.untyped_storage(), images.busy
            return images.lend()
        if self.device is not None:
            images = images.to(self.device, non_blocking=True)
        return self.per_batch(images)


def stop_workers(batches: Iterator) -> None:
    """Stop the decoding workers of a loader's iterator now, where a pass ends early (an error, a stop): left to
    the garbage collector, an iterator that an exception's traceback holds is collected at some later time, in
    the middle of whatever runs then, and torch then waits 5 s for each worker. torch's own shutdown, which it
    runs itself at the end of a whole pass (a no-op then); Lightning calls it the same way."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def for_workers(preset: Preset, device: torch.device | None) -> tuple[Preset, ToModelInput | torch.nn.Identity]:
    """What the loader's workers run of ``preset``, and what is left for the batch's arrival: on the CPU all of
    it (into the workers' slots); for an accelerator the per-image steps, so that uint8 crosses to the device,
    a quarter of float32's bytes, and the per-batch step runs there."""
    if device is None or device.type == "cpu":
        return preset, torch.nn.Identity()
    return Preset(preset.per_image, torch.nn.Identity(), preset.joint), preset.per_batch


def training_loader(dataset, preset: Preset, *, global_batch: int, total_steps: int, start_step: int, seed: int,
                    accum_steps: int = 1, rank: int = 0, world_size: int = 1, num_workers: int = 0,
                    corrupt: str = "fail", device: torch.device | None = None, repeats: int = 1) -> Arrived:
    """This rank's micro-batches for steps ``start_step .. total_steps - 1`` (images on ``device`` if given);
    ``repeats``: repeated augmentation (``StepSampler``), for datasets with random access."""
    preset, arrival = for_workers(preset, device)
    if not isinstance(dataset, ShardedSplit):
        sampler = StepSampler(len(dataset), global_batch, total_steps, seed=seed, start_step=start_step,
                              accum_steps=accum_steps, rank=rank, world_size=world_size, repeats=repeats)
        items = Transformed(dataset, preset, seed, corrupt, reuse_batches=True)
        loader = step_loader(items, sampler, num_workers, device)
        return Arrived(loader, arrival, device)
    if repeats > 1:
        raise ConfigError(f"repeated augmentation needs a dataset with random access, not the shards of {dataset.name}")
    micro = StepSampler.micro_batch(global_batch, world_size, accum_steps)
    if len(dataset) < global_batch:
        raise ConfigError(f"dataset of {len(dataset)} images is smaller than the global batch {global_batch}")
    stream = TrainingStream(dataset, preset, seed=seed, micro_batch=micro, rank=rank,
                            start_micro_batch=start_step * accum_steps, world_size=world_size,
                            num_workers=num_workers, corrupt=corrupt, reuse_batches=True)
    loader = DataLoader(stream, batch_size=micro, collate_fn=stream.collate_training,  # leaves the global RNG alone
                        generator=torch.Generator().manual_seed(seed), **worker_options(num_workers, device))
    return Arrived(loader, arrival, device)


def evaluation_loader(dataset, preset: Preset, batch_size: int, num_workers: int = 0, corrupt: str = "fail",
                      device: torch.device | None = None) -> Arrived:
    """Every image of ``dataset`` once, in its order (``corrupt='skip'`` leaves unreadable ones out)."""
    preset, arrival = for_workers(preset, device)
    if not isinstance(dataset, ShardedSplit):
        items = Transformed(dataset, preset, corrupt=corrupt, reuse_batches=True)
        loader = eval_loader(items, batch_size, num_workers, device)
        return Arrived(loader, arrival, device)
    stream = EvaluationStream(dataset, preset, corrupt, reuse_batches=True)
    workers = min(num_workers, len(dataset.shards))  # a worker without a shard would idle
    loader = DataLoader(stream, batch_size=batch_size, collate_fn=stream.collate, generator=torch.Generator(),
                        **worker_options(workers, device))
    return Arrived(loader, arrival, device)
