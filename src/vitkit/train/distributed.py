"""torchrun support: the same command trains on one process or many (DDP or FSDP).

``torchrun --nproc_per_node=N`` sets RANK / WORLD_SIZE / LOCAL_RANK; without them the run is a
single process. Backend: NCCL on GPUs, gloo on CPU. DDP keeps a whole replica on every rank; FSDP
(``parallel="fsdp"``, PyTorch's FSDP2) keeps 1/N of every parameter, gradient and optimiser moment
per rank, for the large variants. The loop stays one: the few places where the two differ (gradient
sync while accumulating, the global gradient norm, whole state dicts for checkpoints) are the small
functions below.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ..runtime import select_device

PARALLEL = ("ddp", "fsdp")

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

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank (a one-item list on one process)."""
        if not self.enabled:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """Average a tensor over ranks (identity on one process)."""
        if self.enabled:  # on the rank's device: NCCL groups reduce no CPU tensors
            values = values.to(self.device, copy=True)
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
            values /= self.world_size
        return values


def setup(device: str | None = None) -> Distributed:
    """Join the process group torchrun describes (if any) and pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    chosen = select_device(device) if device else None
    use_cuda = torch.cuda.is_available() if chosen is None else chosen.type == "cuda"
    if use_cuda:  # under torchrun each rank takes the GPU of its local rank
        index = local_rank if world_size > 1 or chosen is None or chosen.index is None else chosen.index
        target = torch.device("cuda", index)
    else:
        target = chosen or torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(target)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Distributed(rank, world_size, local_rank, target)


def leave() -> None:
    """Leave the process group when a process has trained normally. Left to the interpreter's exit,
    gloo's worker threads can outlive Python and abort the process ("terminate called without an
    active exception"). The entry point calls this, not ``run``: a script may train several times in
    one group, and re-joining a group left in the same process races on its stale rendezvous keys.
    Not called after an error: leaving while other ranks wait in a collective can hang them."""
    if dist.is_initialized():
        gc.collect()  # the group's last holders (DDP's reducer, in reference cycles) go first: it is destroyed now
        dist.destroy_process_group()


@contextlib.contextmanager
def rank_loss_explained(env: Distributed, advice: Callable[[], str]) -> Iterator[None]:
    """Run a block whose collectives fail when another rank is gone (killed, its machine lost): that failure
    becomes one ``ConnectionError`` naming this rank, the cause and ``advice()`` (how to go on), where torch
    would print its traceback. Errors of other kinds pass as they are."""
    try:
        yield
    except RuntimeError as error:
        if not (env.enabled and lost_rank(error)):
            raise
        raise ConnectionError(f"rank {env.rank} of {env.world_size}: another rank is gone ({cause(error)}); "
                              f"{advice()}") from error


def lost_rank(error: RuntimeError) -> bool:
    """Whether ``error`` is a collective's report of a rank that stopped answering: torch's distributed errors,
    and gloo's, which reach Python as plain ``RuntimeError``s naming gloo's source files."""
    return isinstance(error, dist.DistError) or "gloo/" in str(error)


def cause(error: RuntimeError) -> str:
    """The first sentence of a distributed error, without the source location gloo puts before it."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip())
    return re.split(r"\.\s", text, maxsplit=1)[0].splitlines()[0][:200] if text else type(error).__name__


def shard(model: nn.Module, env: Distributed, parallel: str) -> nn.Module:
    """With ``parallel="fsdp"`` on several ranks, shard ``model`` in place: each encoder block is one
    FSDP unit (its parameters are gathered for its forward and backward only), the root holds the rest
    (embeddings, final norm, head, a pre-training wrapper's own weights). Sharding replaces the
    parameters, so build the optimiser after this call. DDP wraps later, in ``wrap``."""
    if parallel not in PARALLEL:
        raise ValueError(f"unknown parallel={parallel!r}; expected one of {PARALLEL}")
    if parallel == "fsdp" and env.enabled:
        for block in getattr(model, "encoder", model).blocks:
            fully_shard(block)
        fully_shard(model)
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)  # seen through torch.compile


def wrap(model: nn.Module, env: Distributed) -> nn.Module:
    """The module the loop calls: ``model`` itself on one process or when sharded, else DDP."""
    if not env.enabled or is_sharded(model):
        return model
    ids = [env.device.index] if env.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


@contextlib.contextmanager
def no_gradient_sync(network: nn.Module) -> Iterator[None]:
    """Backward without exchanging gradients: accumulation micro-batches before the last one."""
    module = getattr(network, "_orig_mod", network)
    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    elif isinstance(module, nn.parallel.DistributedDataParallel):
        with module.no_sync():
            yield
    else:
        yield


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global L2 norm of at most ``max_norm``; returns the norm before. With
    FSDP each rank holds a shard of every gradient, and the norm is reduced over all of them."""
    parameters = list(parameters)
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm


def _state_dicts():
    """torch's state-dict helpers for sharded models: imported on first use under FSDP, as they take 0.3 s to
    import and every ``vitkit`` command imports this module (through the recipes' choices)."""
    from torch.distributed.checkpoint import state_dict
    return state_dict


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with whole tensors. Under FSDP every rank must call it (the shards are
    gathered) and only the main rank gets them, on its CPU."""
    if not is_sharded(model):
        return model.state_dict()
    api = _state_dicts()
    return api.get_model_state_dict(model, options=_whole_on_cpu(api))


def _whole_on_cpu(api):
    """Gather whole tensors, onto the main rank's CPU."""
    return api.StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``full_weights`` and the optimiser's state dict alike, as a checkpoint stores them (under FSDP
    the optimiser's state is keyed by parameter name rather than position)."""
    if not is_sharded(model):
        return model.state_dict(), optimizer.state_dict()
    api = _state_dicts()
    return full_weights(model), api.get_optimizer_state_dict(model, optimizer, options=_whole_on_cpu(api))


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                    optimizer_state: dict[str, Any]) -> None:
    """Inverse of ``full_state``; under FSDP every rank passes the whole state and keeps its shard. The state
    may come from another number of ranks, sharded or not."""
    optimizer_state = with_our_kernels(optimizer_state, optimizer)
    if not is_sharded(model):
        model.load_state_dict(weights, strict=True)
        optimizer.load_state_dict(optimizer_state)
        return
    api = _state_dicts()
    options = api.StateDictOptions(full_state_dict=True, strict=True)
    api.set_model_state_dict(model, weights, options=options)
    api.set_optimizer_state_dict(model, optimizer, keyed_by_name(optimizer_state, model, optimizer), options=options)


KERNEL_OPTIONS = ("fused", "foreach")


def with_our_kernels(optimizer_state: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer_state`` with ``optimizer``'s choice of step kernel in each group (loading would take the saved
    one): the choice follows how the parameters are laid out here (FSDP's sharded ones have no fused kernel),
    not how they were on the ranks that saved the state."""
    groups = [{**saved, **{key: ours[key] for key in KERNEL_OPTIONS if key in ours}}
              for saved, ours in zip(optimizer_state["param_groups"], optimizer.param_groups)]
    return {**optimizer_state, "param_groups": groups}


def keyed_by_name(optimizer_state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
                  ) -> dict[str, Any]:
    """``optimizer_state`` with its parameters keyed by name, as torch's sharded loader reads them. A run saved
    by one process keys them by position in the optimiser's groups (a run resumed under FSDP on more ranks
    reads that); the groups list the parameters in the same order either way, so position ``i`` is the name of
    ``optimizer``'s ``i``-th parameter."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    ours = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    saved = [key for group in optimizer_state["param_groups"] for key in group["params"]]
    name = dict(zip(saved, ours))
    return {"state": {name[key]: value for key, value in optimizer_state["state"].items()},
            "param_groups": [{**group, "params": [name[key] for key in group["params"]]}
                             for group in optimizer_state["param_groups"]]}


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """A whole tensor from an FSDP shard (every rank must call it); other tensors as they are."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def sharded_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``whole``, laid out as ``like`` (inverse of ``gathered``)."""
    if not isinstance(like, DTensor):
        return whole
    return distribute_tensor(whole.to(like.device, like.dtype), like.device_mesh, like.placements)
