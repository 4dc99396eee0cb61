"""Size and cost of a model, measured on the meta device so that even ViT-H costs no memory or time."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from .config import ViTConfig
from .vit import VisionTransformer


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def config_parameters(config: ViTConfig) -> int:
    """Parameter count of the model a config describes, without allocating it."""
    with torch.device("meta"):
        return count_parameters(VisionTransformer(config))


def forward_flops(config: ViTConfig, image_size: tuple[int, int] | None = None) -> int:
    """FLOPs (2 x multiply-adds) of one image's forward pass, counted by torch's FlopCounterMode."""
    height, width = image_size or config.image_size
    with torch.device("meta"):
        model = VisionTransformer(config)
        images = torch.empty(1, config.in_chans, height, width)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return counter.get_total_flops()
