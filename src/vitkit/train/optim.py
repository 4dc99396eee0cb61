"""Optimisers and learning-rate schedules of the paper (section 3, appendix B.1), and the layer-wise
learning-rate decay with which BEiT, MAE, DINOv2 and EVA fine-tune."""

from __future__ import annotations

import math

import torch
from torch import nn

SCHEDULES = ("cosine", "linear", "constant")


def decay_mask(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed): weight decay acts on the weight matrices of dense and convolutional
    layers only, never on biases, norms, the [class] token or position embeddings."""
    decayed = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    params = [p for p in model.parameters() if p.requires_grad]
    return [p for p in params if id(p) in decayed], [p for p in params if id(p) not in decayed]


def step_kernel(params: list[nn.Parameter]) -> dict[str, bool]:
    """One fused kernel per step for plain CPU or CUDA tensors (16% off a digits step on the CPU, where the
    default loops over the parameters in Python); sharded (FSDP) parameters take the multi-tensor path."""
    plain = all(type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda") for p in params)
    return {"fused": True} if plain else {"foreach": True}


# Layer-wise learning-rate decay counts a ViT's layers from the input: the top-level parameters and modules
# named here are the embedding, layer 0; block i is layer i + 1; the rest (final norm, fc_norm, attention
# pool, pre-logits, heads, and any top-level name added later) is the head, layer depth + 1.
EMBEDDING_NAMES = frozenset({"cls_token", "dist_token", "reg_token", "pos_embed", "patch_embed", "norm_pre", "rope"})


def layer_id(name: str, depth: int) -> int:
    """The layer of the parameter ``name`` (as ``named_parameters`` spells it) in a ViT of ``depth`` blocks:
    0 for the embedding, i + 1 for ``blocks.{i}.``, depth + 1 for everything after the blocks."""
    top, _, rest = name.partition(".")
    if top in EMBEDDING_NAMES:
        return 0
    if top == "blocks":
        return int(rest.partition(".")[0]) + 1
    return depth + 1


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """The optimiser's parameter groups: weight decay on the weight matrices only (``decay_mask``); with
    ``layer_decay``, that split within each layer, and each group's ``lr_scale = layer_decay ** (depth + 1 -
    layer)`` (the head learns at the full rate, the embedding at ``layer_decay ** (depth + 1)``). Groups come
    in layer order, decayed first, each with its parameters in the model's order: built from the names, they
    are the same before and after FSDP sharding, and a saved optimiser state loads back into them."""
    decayed, plain = decay_mask(model)
    if layer_decay is None:
        return [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    if not 0 < layer_decay <= 1:
        raise ValueError(f"layer_decay={layer_decay}: expected a number in (0, 1]")
    if not isinstance(getattr(model, "blocks", None), nn.ModuleList):
        raise ValueError(f"layer_decay needs a ViT with its blocks at .blocks; {type(model).__name__} has none")
    depth, decays = len(model.blocks), {id(p) for p in decayed}
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            layer, decay = layer_id(name, depth), id(param) in decays
            group = groups.setdefault((layer, not decay), {"params": [], "weight_decay": weight_decay if decay else 0.0,
                                                           "lr_scale": layer_decay ** (depth + 1 - layer)})
            group["params"].append(param)
    return [groups[key] for key in sorted(groups)]


def make_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.999), momentum: float = 0.9,
                   layer_decay: float | None = None) -> torch.optim.Optimizer:
    """``adamw`` (pre-training: decoupled weight decay on weight matrices) or ``sgd`` with momentum
    (fine-tuning); ``layer_decay`` scales each layer's learning rate (``param_groups``), applied by the
    schedule of the training loop."""
    groups = param_groups(model, weight_decay, layer_decay)
    kernel = step_kernel([p for group in groups for p in group["params"]])
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), **kernel)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, **kernel)
    raise ValueError(f"unknown optimizer {name!r}; expected 'adamw' or 'sgd'")


def learning_rate(step: int, base_lr: float, total_steps: int, warmup_steps: int = 0,
                  decay: str = "cosine", end_lr: float = 0.0) -> float:
    """Linear warm-up from 0 over ``warmup_steps``, then cosine or linear decay to ``end_lr`` at
    ``total_steps`` (0-based steps, as in Google's vit_jax)."""
    if decay not in SCHEDULES:
        raise ValueError(f"unknown schedule {decay!r}; expected one of {SCHEDULES}")
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    if decay == "constant":
        return base_lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if decay == "cosine" else 1.0 - progress
    return end_lr + (base_lr - end_lr) * shape
