"""Training objectives: what the loop minimises, computed from a model and a batch.

The loop knows nothing but this interface, so a new recipe (masked patch prediction, distillation)
is a new objective, not a new loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.transforms import v2

from ..models.dense import resized


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


class Distillation(Classification):
    """DeiT's distillation (Touvron et al. 2021): the class head learns the labels, the distillation head the
    teacher's outputs, loss = (1 - alpha) CE(class logits, labels) + alpha KD. ``hard``: KD = CE(distillation
    logits, the teacher's argmax) (DeiT's choice, alpha 1/2); ``soft``: KD = T^2 KL(softmax(teacher / T) ||
    softmax(distillation logits / T)), averaged over the batch as the paper writes it and timm computes it (DeiT's
    released code divides by the classes too, which only rescales alpha). A model
    without a distillation token distils through its one head (logit distillation). The teacher (``train.teacher``)
    sees the batch the student sees, Mixup and CutMix included."""

    def __init__(self, teacher, kind: str, temperature: float, alpha: float, num_classes: int,
                 label_smoothing: float = 0.0, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0):
        super().__init__(num_classes, label_smoothing, mixup_alpha, cutmix_alpha)
        self.teacher, self.kind, self.temperature, self.alpha = teacher, kind, temperature, alpha

    def __call__(self, model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        images, labels = batch
        targets = labels
        if self.mix is not None and model.training:
            images, targets = self.mix(images, labels)
        out = model(images, apart=True)
        own, distilled = out if isinstance(out, tuple) else (out, out)
        taught = self.teacher(images)
        if self.kind == "hard":
            kd = F.cross_entropy(distilled.float(), taught.argmax(dim=-1))
        else:
            t = self.temperature
            kd = F.kl_div(F.log_softmax(distilled.float() / t, dim=-1), F.log_softmax(taught / t, dim=-1),
                          reduction="batchmean", log_target=True) * t * t
        loss = (1 - self.alpha) * F.cross_entropy(own.float(), targets, label_smoothing=self.label_smoothing) \
            + self.alpha * kd
        logits = ((own + distilled) / 2).detach()
        agreement = (distilled.detach().argmax(dim=-1) == taught.argmax(dim=-1)).float().mean()
        return loss, {"accuracy": (logits.argmax(dim=-1) == labels).float().mean(), "teacher_agreement": agreement}


class MaskedPatches:
    """Masked patch prediction (section 4.6): the model is a ``MaskedPatchPrediction`` wrapper that
    corrupts, encodes and scores the images itself; labels are ignored."""

    def __call__(self, model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return model(batch[0])


def dense_outputs(model: nn.Module, images: torch.Tensor, features: Callable | None) -> torch.Tensor:
    """A dense model's outputs: of the whole model, or of its head alone on ``features(images)`` (a frozen
    backbone's features from ``train.feature_cache``)."""
    return model(images) if features is None else model.dense_head(features(images))


class Segmentation:
    """Per-pixel softmax cross-entropy of a dense head's logits, brought to the masks' size first (bilinear, as
    mmseg resizes them), the ignored pixels (``ignore_index``) left out; ``features``: where the frozen
    backbone's features come from, when not from a pass of the model (``dense_outputs``)."""

    def __init__(self, ignore_index: int = 255, features: Callable | None = None):
        self.ignore_index, self.features = ignore_index, features

    def __call__(self, model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        images, masks = batch
        logits = resized(dense_outputs(model, images, self.features).float(), masks.shape[-2:])
        loss = F.cross_entropy(logits, masks.long(), ignore_index=self.ignore_index)
        counted = masks != self.ignore_index
        right = (logits.detach().argmax(dim=1) == masks) & counted
        return loss, {"pixel_accuracy": right.sum() / counted.sum().clamp(min=1)}


SIGLOSS_EPS = 1e-3  # added to predicted and true depth before their logarithms (DINOv2's SigLoss)


class DepthRegression:
    """The scale-invariant log loss of Eigen et al. (2014) as DINOv2 trains depth: with g = log(pred) - log(true)
    over the pixels with depth (0 < true <= ``max_depth`` when capped), sqrt(Var(g) + 0.15 mean(g)^2); the
    prediction is brought to the depth map's size first. ``features`` as for ``Segmentation``."""

    def __init__(self, max_depth: float | None = None, features: Callable | None = None):
        self.max_depth, self.features = max_depth, features

    def __call__(self, model: nn.Module, batch: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        images, depth = batch
        predicted = resized(dense_outputs(model, images, self.features).float(), depth.shape[-2:])[:, 0]
        valid = depth > 0
        if self.max_depth is not None:
            valid &= depth <= self.max_depth
        g = torch.log(predicted[valid] + SIGLOSS_EPS) - torch.log(depth[valid] + SIGLOSS_EPS)
        loss = torch.sqrt(g.var() + 0.15 * g.mean() ** 2) if g.numel() > 1 else predicted.sum() * 0
        error = (predicted.detach()[valid] - depth[valid]) ** 2
        return loss, {"rmse": error.mean().sqrt() if error.numel() else error.sum()}
