"""Batch memory that a loader fills again and again rather than taking anew for every batch.

On the CPU, memory touched for the first time is what a float batch costs most: on a 2-core VM a new
64 x 3 x 224 x 224 batch takes over 10x the time of one already touched ("Filling a ... float batch" in
benchmarks/results/data.md), and a batch made anew in a loader's worker is new shared memory twice over, once
in the worker and once where the main process maps it. Here each process that finishes batches (a
worker, or the main process when there are none) keeps up to ``SLOTS`` of them, in shared memory when it is a
worker; the main process maps each slot once a pass (``pipelines.Arrived`` holds them, so torch's shared-memory
cache finds a slot again when the next batch in it is sent).

A batch is lent as a ``SlotBatch``, and its slot is written again only once that object is gone everywhere:
the tensor lent out wraps a numpy view whose base is the ``SlotBatch``, and torch keeps that view until the
tensor's storage (any view of it, anything autograd saved) is freed. When every slot is still held, the batch
goes into fresh memory instead, so a consumer that keeps batches costs speed, never correctness.

The price is shared memory held for the life of the workers: up to ``SLOTS`` float batches a worker and loader
(4 x 38.5 MB for 64 images at 224 px), where a container's default ``/dev/shm`` (64 MB in Docker) is too small:
give it more (``--shm-size``), as PyTorch's own loader needs too.
"""

from __future__ import annotations

import math
import os
import weakref

import numpy as np
import torch
from torch.utils.data import get_worker_info

SLOTS = 4  # the loader's prefetch (2 a worker), the batch in use, and the one before it, not yet dropped


def _free(busy: torch.Tensor, index: int) -> None:
    busy[index] = 0


class SlotBatch:
    """The images of a finished batch, in slot ``index`` of a ``BatchSlots`` whose flags are ``busy``; the slot
    is freed when this object is collected where the batch is consumed (never in the worker that sent it)."""

    def __init__(self, images: torch.Tensor, busy: torch.Tensor, index: int):
        self.images, self.busy, self.index = images, busy, index

    @classmethod
    def consumed_here(cls, images: torch.Tensor, busy: torch.Tensor, index: int) -> "SlotBatch":
        batch = cls(images, busy, index)
        weakref.finalize(batch, _free, busy, index)
        return batch

    def __reduce__(self):  # sent by a worker: rebuilt in the main process, which frees the slot
        return SlotBatch.consumed_here, (self.images, self.busy, self.index)

    @property
    def __array_interface__(self) -> dict:
        return self.images.numpy().__array_interface__

    def lend(self) -> torch.Tensor:
        """The images as a tensor that keeps this batch, hence its slot, for as long as torch keeps its storage."""
        return torch.from_numpy(np.asarray(self))

    def abandon(self) -> None:
        """Free a slot that a worker took but will not send (its batch failed); where the batch is consumed, the
        ``SlotBatch`` frees it when collected (an error's traceback may hold it until then)."""
        if get_worker_info() is not None:
            self.busy[self.index] = 0

    def handed_on(self) -> SlotBatch | torch.Tensor:
        """What a collation gives the loader: from a worker this batch, to be sent; elsewhere its images, lent."""
        return self if get_worker_info() is not None else self.lend()


class BatchSlots:
    """Up to ``count`` float batches' memory of the process that fills them, each made when first needed and
    taken again as soon as its batch is freed; made anew in each process (a forked worker does not write into its
    parent's), after ``clear`` and when a larger batch comes (a smaller one takes the front of a slot)."""

    def __init__(self, count: int = SLOTS):
        self.count = count
        self.clear()

    def __getstate__(self) -> dict:  # a spawned worker starts with none of its parent's slots
        return {"count": self.count}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["count"])

    def clear(self) -> None:
        """Let the slots go (a batch still lent keeps its own); the next batch starts afresh, with new flags.
        Calls nothing of torch's: it may run as the interpreter shuts down, from a loader's ``finally``."""
        self.owner, self.memory, self.busy = None, [], None

    def take(self, shape: tuple[int, ...]) -> SlotBatch | None:
        """A free slot for a batch of ``shape``, or None when every slot is still held."""
        size, in_worker = math.prod(shape), get_worker_info() is not None
        if self.owner != os.getpid() or (self.memory and len(self.memory[0]) < size):
            self.owner, self.memory = os.getpid(), []
            self.busy = torch.zeros(self.count, dtype=torch.uint8)
            if in_worker:
                self.busy.share_memory_()
        busy = self.busy.tolist()
        index = next((i for i in range(len(self.memory)) if not busy[i]), len(self.memory))
        if index == self.count:
            return None
        if index == len(self.memory):  # as large as the others, whatever this batch's size
            room = max([size, *(len(slot) for slot in self.memory)])
            self.memory.append(_shared_floats(room) if in_worker else torch.empty(room, dtype=torch.float32))
        self.busy[index] = 1
        images = self.memory[index][:size].view(shape)
        return SlotBatch(images, self.busy, index) if in_worker else SlotBatch.consumed_here(images, self.busy, index)


def _shared_floats(size: int) -> torch.Tensor:
    """Float memory made in shared memory, as DataLoader's own collation makes it, rather than made and then
    copied there by ``share_memory_`` (which touches every page twice before the first batch)."""
    storage = torch.UntypedStorage._new_shared(size * torch.float32.itemsize)
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, (size,))
