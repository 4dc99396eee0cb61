"""torchrun support: the same command trains on one process or many (DDP).

``torchrun --nproc_per_node=N`` sets RANK / WORLD_SIZE / LOCAL_RANK; without them the run is a
single process. Backend: NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Average a tensor over ranks (identity on one process)."""
        if self.enabled:
            values = values.clone()
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            values /= self.world_size
        return values


def setup(device: str | None = None) -> Distributed:
    """Join the process group torchrun describes (if any) and pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    target = torch.device("cuda", local_rank) if use_cuda else torch.device(device or "cpu")
    if use_cuda:
        torch.cuda.set_device(target)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Distributed(rank, world_size, local_rank, target)


def wrap(model: nn.Module, env: Distributed) -> nn.Module:
    """The module the loop calls: ``model`` itself on one process, else DDP."""
    if not env.enabled:
        return model
    ids = [env.device.index] if env.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)
