"""Batches in an order fixed by (seed, step): what makes resume and data-parallel runs exact.

The global batch of step ``s`` is a slice of epoch ``s // steps_per_epoch``'s permutation, itself
drawn from ``(seed, epoch)``; each rank takes its contiguous share and cuts it into micro-batches for
gradient accumulation. Random augmentations are seeded per (seed, epoch, index), so an image gets
the same crop whichever rank, worker or resumed process loads it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate

from ..errors import ConfigError, DatasetError
from .slots import BatchSlots, SlotBatch
from .splits import seeded_permutation
from .transforms import Preset, ToModelInput

Key = tuple[int, int]  # (index, epoch)
CORRUPT = ("fail", "skip")
"""What an unreadable image does: ``fail`` stops with its name; ``skip`` replaces it in training and leaves it
out of evaluation."""
Item = tuple[torch.Tensor | None, int, tuple[str, ...]]  # (image, label, names of the files skipped for it)


def check_corrupt(corrupt: str) -> str:
    if corrupt not in CORRUPT:
        raise DatasetError(f"corrupt={corrupt!r}; expected one of {CORRUPT}")
    return corrupt


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return hash((seed, epoch, index)) & 0x7FFF_FFFF_FFFF_FFFF  # hash of ints: the same in every process


def transformed(preset: Preset, image: torch.Tensor, label):
    """``(image, label)`` through ``preset.per_image``: the image alone, or with its dense target (a joint
    preset), which then moves with it."""
    if preset.joint:
        return preset.per_image(image, label)
    return preset.per_image(image), label


def seeded_transform(preset: Preset, image: torch.Tensor, label, seed: int) -> tuple:
    """``transformed(preset, image, label)`` with torchvision's random draws seeded, leaving the global RNG as it
    was."""
    generator = torch.default_generator  # what torchvision's random transforms draw from
    state = generator.get_state()
    try:
        generator.manual_seed(seed)
        return transformed(preset, image, label)
    finally:
        generator.set_state(state)


def finished_batch(preset: Preset, images: Sequence[torch.Tensor],
                   slots: BatchSlots | None = None) -> torch.Tensor | SlotBatch:
    """``images`` through ``preset.per_batch``, each converted straight into its row of the batch (no float
    copy of an image made only to be stacked), in a free one of ``slots`` if there is one; stacked as they are
    where the step is the identity (uint8 for an accelerator: see ``pipelines``)."""
    shapes = {tuple(image.shape) for image in images}
    if len(shapes) > 1:
        raise DatasetError(f"images of shapes {' and '.join(map(str, sorted(shapes)))} in one batch")
    if not isinstance(preset.per_batch, ToModelInput):
        return default_collate(list(images))
    shape = (len(images), *images[0].shape)
    slot = slots.take(shape) if slots is not None else None
    batch = slot.images if slot is not None else torch.empty(shape, dtype=torch.float32)
    try:
        for row, image in zip(batch, images):
            preset.per_batch(image, out=row)
    except BaseException:
        if slot is not None:
            slot.abandon()
        raise
    return slot.handed_on() if slot is not None else batch


def collate_training(preset: Preset, items: list[Item],
                     slots: BatchSlots | None = None) -> tuple[torch.Tensor | SlotBatch, torch.Tensor, list[str]]:
    """A training micro-batch and the names of the files replaced in it; dense targets (cropped to one size)
    stacked as plain tensors."""
    images, labels, skipped = zip(*items)
    targets = torch.stack([label.as_subclass(torch.Tensor) for label in labels]) \
        if isinstance(labels[0], torch.Tensor) else torch.tensor(labels)
    return finished_batch(preset, images, slots), targets, [n for names in skipped for n in names]


def collate_evaluation(preset: Preset, items: list[Item], slots: BatchSlots | None = None
                       ) -> tuple[torch.Tensor | SlotBatch, torch.Tensor | list[torch.Tensor]]:
    """An evaluation batch; the images that could not be read (``--corrupt skip``) are left out, with a warning.
    Dense targets stay a list of plain tensors, each at its image's own size."""
    images, labels, _ = zip(*readable(items))
    targets = [label.as_subclass(torch.Tensor) for label in labels] \
        if isinstance(labels[0], torch.Tensor) else torch.tensor(labels)
    return finished_batch(preset, images, slots), targets


def readable(items: list[Item]) -> list[Item]:
    """The items of an evaluation batch whose images could be read; the others are named in a warning."""
    kept = [item for item in items if item[0] is not None]
    skipped = [name for item in items for name in item[2]]
    if skipped:
        warnings.warn(f"left out {len(skipped)} unreadable image(s): {', '.join(skipped)}", stacklevel=2)
    if not kept:  # nothing to give the model a batch's shape
        raise DatasetError(f"a whole evaluation batch is unreadable ({', '.join(skipped[:5])}, ...); check the "
                           f"data with `vitkit data verify`")
    return kept


class Transformed(Dataset):
    """Apply a transform preset to a dataset's images: its per-image part here, seeded by keys
    ``(index, epoch)``, its per-batch part in ``collate``.

    An image that fails to decode stops the run naming its file (``corrupt='fail'``), or with
    ``'skip'``: in training (keys with an epoch) the next readable index stands in for it, a choice
    fixed by the data alone so that resume stays exact; in evaluation (plain indices) it is left out.
    Either way its name travels with the item. With ``reuse_batches``, batches are finished in reused memory
    (``slots.py``): from a worker they come as ``SlotBatch``es, which ``pipelines.Arrived`` lends."""

    def __init__(self, dataset: Dataset, preset: Preset, seed: int = 0, corrupt: str = "fail",
                 reuse_batches: bool = False):
        self.dataset, self.preset, self.seed, self.corrupt = dataset, preset, seed, check_corrupt(corrupt)
        self.classes, self.batch_slots = getattr(dataset, "classes", None), BatchSlots() if reuse_batches else None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int | Key) -> Item:
        index, epoch = (key, None) if isinstance(key, int) else key
        skipped: list[str] = []
        while True:
            try:
                image, label = self.dataset[index]
                break
            except DatasetError as error:
                if self.corrupt == "fail":
                    raise DatasetError(f"{error} (pass --corrupt skip to go on without such files)") from None
                skipped.append(str(self.dataset.path(index)) if hasattr(self.dataset, "path") else str(error))
                if epoch is None:
                    return None, -1, tuple(skipped)
                if len(skipped) == len(self.dataset):
                    raise DatasetError(f"{getattr(self.dataset, 'name', 'dataset')}: no image is readable") from None
                index = (index + 1) % len(self.dataset)
        if epoch is None:
            return *transformed(self.preset, image, label), tuple(skipped)
        return *seeded_transform(self.preset, image, label, sample_seed(self.seed, epoch, key[0])), tuple(skipped)

    def collate(self, items: list[Item]) -> tuple[torch.Tensor | SlotBatch, torch.Tensor]:
        """Stack evaluation items into (images, labels), left-out (unreadable) images dropped."""
        return collate_evaluation(self.preset, items, self.batch_slots)

    def collate_training(self, items: list[Item]) -> tuple[torch.Tensor | SlotBatch, torch.Tensor, list[str]]:
        """Stack training items into (images, labels, names of the files skipped for them)."""
        return collate_training(self.preset, items, self.batch_slots)


class StepSampler(Sampler[list[Key]]):
    """Micro-batches of keys for steps ``start_step .. total_steps - 1`` of one rank. With ``repeats`` > 1
    (repeated augmentation, Hoffer et al. 2020, as DeiT trains), an epoch draws 1 / repeats of the images, each
    ``repeats`` times in a row, every copy with a key (so an augmentation) of its own: ``(index, epoch *
    repeats + copy)``."""

    def __init__(self, size: int, global_batch: int, total_steps: int, *, seed: int = 0,
                 start_step: int = 0, accum_steps: int = 1, rank: int = 0, world_size: int = 1, repeats: int = 1):
        self.micro_batch(global_batch, world_size, accum_steps)
        if size < global_batch:
            raise ConfigError(f"dataset of {size} images is smaller than the global batch {global_batch}")
        self.size, self.global_batch, self.total_steps = size, global_batch, total_steps
        self.seed, self.start_step, self.accum_steps = seed, start_step, accum_steps
        self.rank, self.world_size, self.repeats = rank, world_size, repeats
        self.steps_per_epoch = size // global_batch

    @staticmethod
    def micro_batch(global_batch: int, world_size: int, accum_steps: int) -> int:
        """The images of one rank's micro-batch: the global batch shared by ranks and accumulation steps."""
        per_rank, rest = divmod(global_batch, world_size * accum_steps)
        if rest or per_rank == 0:
            raise ConfigError(f"global batch {global_batch} must be a positive multiple of "
                             f"world size {world_size} x accumulation steps {accum_steps}")
        return per_rank

    def __len__(self) -> int:
        return max(0, self.total_steps - self.start_step) * self.accum_steps

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of the dataset in ``epoch``: a permutation fixed by the seed and the epoch alone."""
        return seeded_permutation(self.size, self.seed * 100_003 + epoch)

    def keys(self, epoch: int) -> list[Key]:
        """Epoch ``epoch``'s keys in order: its permutation, or with repeats its first size / repeats images, each
        repeated, the copies keyed apart."""
        order = self.permutation(epoch).tolist()
        if self.repeats == 1:
            return [(index, epoch) for index in order]
        drawn = order[:-(-self.size // self.repeats)]
        return [(index, epoch * self.repeats + copy) for index in drawn for copy in range(self.repeats)][:self.size]

    def __iter__(self) -> Iterator[list[Key]]:
        epoch, order = -1, []
        share = self.global_batch // self.world_size
        micro = share // self.accum_steps
        for step in range(self.start_step, self.total_steps):
            if step // self.steps_per_epoch != epoch:
                epoch = step // self.steps_per_epoch
                order = self.keys(epoch)
            start = (step % self.steps_per_epoch) * self.global_batch + self.rank * share
            mine = order[start:start + share]
            for offset in range(0, share, micro):
                yield mine[offset:offset + micro]


def worker_options(num_workers: int, device: torch.device | None = None) -> dict:
    """Decoding in ``num_workers`` processes, started for each pass and stopped at its end; pinned host memory for
    non-blocking copies where the batches go to a GPU (only there: pinning copies a batch out of its slot).

    A training run is one pass (``StepSampler``, the shard streams); evaluation forks its workers again for each
    pass. Workers kept alive across passes stop only when their loader is garbage, which for a loader caught in a
    reference cycle is some later collection, in the middle of whatever runs then; and there torch waits 5 s for
    each worker (multiprocessing's queue finalizers run before the iterator's own, so the workers never receive
    the word to stop)."""
    return dict(num_workers=num_workers, persistent_workers=False,
                pin_memory=device is not None and device.type == "cuda")


def step_loader(dataset: Transformed, sampler: StepSampler, num_workers: int = 0,
                device: torch.device | None = None) -> DataLoader:
    """A loader over ``sampler``'s micro-batches ``(images, labels, skipped file names)`` bound for ``device``;
    its own generator leaves the global RNG untouched."""
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=dataset.collate_training,
                      generator=torch.Generator().manual_seed(sampler.seed), **worker_options(num_workers, device))


def eval_loader(dataset: Transformed, batch_size: int, num_workers: int = 0,
                device: torch.device | None = None) -> DataLoader:
    """A DataLoader over ``dataset`` in order, once, with the dataset's evaluation collation (no shuffling)."""
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=dataset.collate,
                      generator=torch.Generator(), **worker_options(num_workers, device))
