"""Exponential moving average (Polyak averaging) of a model's weights, kept beside training and evaluated
in place of the trained weights when a recipe asks for it (``ema_decay``)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .distributed import gathered, sharded_like


class EMA:
    """Polyak averaging of the weights: ``shadow <- decay * shadow + (1 - decay) * weights``. Under
    FSDP each rank averages its own shards; the state dict holds whole tensors."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.names = [n for n, t in model.state_dict().items() if t.is_floating_point()]
        self.shadow = [t.detach().clone() for n, t in model.state_dict().items() if n in self.names]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model``'s current weights by ``1 - decay``."""
        current = model.state_dict()
        torch._foreach_lerp_(self.shadow, [current[n] for n in self.names], 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights by name, whole tensors (gathered from FSDP shards), for a checkpoint."""
        return {name: gathered(tensor) for name, tensor in zip(self.names, self.shadow)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Take the averaged weights from a checkpoint's ``state`` (sharded again under FSDP)."""
        for tensor, name in zip(self.shadow, self.names):
            tensor.copy_(sharded_like(state[name], tensor))

    @contextlib.contextmanager
    def swapped_into(self, model: nn.Module):
        """Run a block with the averaged weights in ``model``, then put the trained ones back."""
        backup = {n: t.detach().clone() for n, t in model.state_dict().items()}
        model.load_state_dict({**backup, **dict(zip(self.names, self.shadow))})
        try:
            yield model
        finally:
            model.load_state_dict(backup)
