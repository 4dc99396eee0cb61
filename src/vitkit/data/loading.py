"""Batches in an order fixed by (seed, step): what makes resume and data-parallel runs exact.

The global batch of step ``s`` is a slice of epoch ``s // steps_per_epoch``'s permutation, itself
drawn from ``(seed, epoch)``; each rank takes its contiguous share and cuts it into micro-batches for
gradient accumulation. Random augmentations are seeded per (seed, epoch, index), so an image gets
the same crop whichever rank, worker or resumed process loads it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .transforms import Preset

Key = tuple[int, int]  # (index, epoch)


class Transformed(Dataset):
    """Apply a transform preset to a dataset's images: its per-image part here, seeded by keys
    ``(index, epoch)``, its per-batch part in ``collate``."""

    def __init__(self, dataset: Dataset, preset: Preset, seed: int = 0):
        self.dataset, self.preset, self.seed = dataset, preset, seed
        self.classes = getattr(dataset, "classes", None)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int | Key) -> tuple[torch.Tensor, int]:
        index, epoch = (key, None) if isinstance(key, int) else key
        image, label = self.dataset[index]
        if epoch is None:
            return self.preset.per_image(image), label
        generator = torch.default_generator  # what torchvision's random transforms draw from
        state = generator.get_state()
        try:
            generator.manual_seed(hash((self.seed, epoch, index)) & 0x7FFF_FFFF_FFFF_FFFF)
            return self.preset.per_image(image), label
        finally:
            generator.set_state(state)

    def collate(self, items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = zip(*items)
        return self.preset.per_batch(torch.stack(images)), torch.tensor(labels)


class StepSampler(Sampler[list[Key]]):
    """Micro-batches of keys for steps ``start_step .. total_steps - 1`` of one rank."""

    def __init__(self, size: int, global_batch: int, total_steps: int, *, seed: int = 0,
                 start_step: int = 0, accum_steps: int = 1, rank: int = 0, world_size: int = 1):
        per_rank, rest = divmod(global_batch, world_size * accum_steps)
        if rest or per_rank == 0:
            raise ValueError(f"global batch {global_batch} must be a positive multiple of "
                             f"world size {world_size} x accumulation steps {accum_steps}")
        if size < global_batch:
            raise ValueError(f"dataset of {size} images is smaller than the global batch {global_batch}")
        self.size, self.global_batch, self.total_steps = size, global_batch, total_steps
        self.seed, self.start_step, self.accum_steps = seed, start_step, accum_steps
        self.rank, self.world_size = rank, world_size
        self.steps_per_epoch = size // global_batch

    def __len__(self) -> int:
        return max(0, self.total_steps - self.start_step) * self.accum_steps

    def permutation(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))

    def __iter__(self) -> Iterator[list[Key]]:
        epoch, order = -1, None
        share = self.global_batch // self.world_size
        micro = share // self.accum_steps
        for step in range(self.start_step, self.total_steps):
            if step // self.steps_per_epoch != epoch:
                epoch = step // self.steps_per_epoch
                order = self.permutation(epoch)
            start = (step % self.steps_per_epoch) * self.global_batch + self.rank * share
            mine = order[start:start + share].tolist()
            for offset in range(0, share, micro):
                yield [(index, epoch) for index in mine[offset:offset + micro]]


def step_loader(dataset: Transformed, sampler: StepSampler, num_workers: int = 0) -> DataLoader:
    """A loader over ``sampler``'s micro-batches; its own generator leaves the global RNG untouched."""
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=dataset.collate,
                      generator=torch.Generator().manual_seed(sampler.seed),
                      persistent_workers=False, pin_memory=torch.cuda.is_available())


def eval_loader(dataset: Transformed, batch_size: int, num_workers: int = 0) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      collate_fn=dataset.collate, generator=torch.Generator(), pin_memory=torch.cuda.is_available())
