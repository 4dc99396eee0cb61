"""Top-k predictions for image files, with the class names and normalisation the checkpoint records."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.datasets import read_image
from ..models.vit import VisionTransformer
from ..runtime import autocast
from .preprocessing import checkpoint_transform


@dataclass
class Prediction:
    path: Path
    labels: list[str]
    probabilities: list[float]


def class_names(model: VisionTransformer) -> list[str]:
    names = model.config.provenance.classes
    return list(names) if names else [str(i) for i in range(model.config.num_classes)]


@torch.no_grad()
def predict(model: VisionTransformer, paths: list[str | Path], top_k: int = 5, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32, resize: str = "crop") -> list[Prediction]:
    """Bring each image to the model's resolution (``resize``: the evaluation geometry, see
    ``checkpoint_transform``), normalise it as the model was trained, and return the ``top_k`` classes by
    softmax probability (``model`` already on ``device``, computing in ``dtype``)."""
    device = torch.device(device)
    transform = checkpoint_transform(model.config, resize)
    names = class_names(model)
    model.eval()
    results = []
    for path in paths:
        image = transform(read_image(Path(path)))
        with autocast(device, dtype):
            probabilities = model(image[None].to(device)).float().softmax(dim=-1)[0].cpu()
        top = probabilities.topk(min(top_k, len(probabilities)))
        results.append(Prediction(Path(path), [names[i] for i in top.indices.tolist()], top.values.tolist()))
    return results
