"""From a dataset to the loaders of a run, whatever its kind: map-style datasets go through the
step-indexed ``StepSampler``, sharded ones (``ShardedSplit``) through their streams. Both give
training micro-batches ``(images, labels, names of files replaced)`` fixed by (seed, step), and
evaluation batches ``(images, labels)`` over every image once."""

from __future__ import annotations

import os

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


def training_loader(dataset, preset: Preset, *, global_batch: int, total_steps: int, start_step: int, seed: int,
                    accum_steps: int = 1, rank: int = 0, world_size: int = 1, num_workers: int = 0,
                    corrupt: str = "fail") -> DataLoader:
    """This rank's micro-batches for steps ``start_step .. total_steps - 1``."""
    if not isinstance(dataset, ShardedSplit):
        sampler = StepSampler(len(dataset), global_batch, total_steps, seed=seed, start_step=start_step,
                              accum_steps=accum_steps, rank=rank, world_size=world_size)
        return step_loader(Transformed(dataset, preset, seed, corrupt), sampler, num_workers)
    micro = StepSampler.micro_batch(global_batch, world_size, accum_steps)
    if len(dataset) < global_batch:
        raise ConfigError(f"dataset of {len(dataset)} images is smaller than the global batch {global_batch}")
    stream = TrainingStream(dataset, preset, seed=seed, micro_batch=micro, start_micro_batch=start_step * accum_steps,
                            rank=rank, world_size=world_size, num_workers=num_workers, corrupt=corrupt)
    return DataLoader(stream, batch_size=micro, collate_fn=stream.collate_training,  # leaves the global RNG alone
                      generator=torch.Generator().manual_seed(seed), **worker_options(num_workers))


def evaluation_loader(dataset, preset: Preset, batch_size: int, num_workers: int = 0,
                      corrupt: str = "fail") -> DataLoader:
    """Every image of ``dataset`` once, in its order (``corrupt='skip'`` leaves unreadable ones out)."""
    if not isinstance(dataset, ShardedSplit):
        return eval_loader(Transformed(dataset, preset, corrupt=corrupt), batch_size, num_workers)
    stream = EvaluationStream(dataset, preset, corrupt)
    workers = min(num_workers, len(dataset.shards))  # a worker without a shard would idle
    return DataLoader(stream, batch_size=batch_size, collate_fn=stream.collate, generator=torch.Generator(),
                      **worker_options(workers))
