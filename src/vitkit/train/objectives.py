"""Training objectives: what the loop minimises, computed from a model and a batch.

The loop knows nothing but this interface, so a new recipe (masked patch prediction, distillation)
is a new objective, not a new loop.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.transforms import v2


class Objective(Protocol):
    """What the training loop minimises: a callable ``(model, batch) -> (loss, metrics)``; a new recipe is a
    new objective (``Classification``, masked patch prediction)."""
    def __call__(self, model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The scalar loss to minimise and detached metrics to log (averaged over steps)."""
        ...


class Classification:
    """Softmax cross-entropy with optional label smoothing and Mixup/CutMix (soft targets)."""

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, mixup_alpha: float = 0.0,
                 cutmix_alpha: float = 0.0):
        self.num_classes, self.label_smoothing = num_classes, label_smoothing
        mixers = [v2.MixUp(alpha=mixup_alpha, num_classes=num_classes)] if mixup_alpha > 0 else []
        if cutmix_alpha > 0:
            mixers.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        self.mix = v2.RandomChoice(mixers) if mixers else None

    def __call__(self, model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        images, labels = batch
        targets = labels
        if self.mix is not None and model.training:
            images, targets = self.mix(images, labels)
        logits = model(images)
        loss = F.cross_entropy(logits.float(), targets, label_smoothing=self.label_smoothing)
        accuracy = (logits.detach().argmax(dim=-1) == labels).float().mean()
        return loss, {"accuracy": accuracy}


class MaskedPatches:
    """Masked patch prediction (section 4.6): the model is a ``MaskedPatchPrediction`` wrapper that
    corrupts, encodes and scores the images itself; labels are ignored."""

    def __call__(self, model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return model(batch[0])
