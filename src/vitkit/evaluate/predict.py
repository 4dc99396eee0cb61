"""Top-k predictions for image files, with the class names and normalisation the checkpoint records; and, on
request, each image's dense patch features and pooled embedding, written to one .npz or .safetensors file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..analysis.features import encode, grid_features
from ..analysis.inputs import image_files
from ..atomic import atomic_file
from ..checkpoints.runnable import EXPORTED, check_graph_inputs
from ..data.images import read_image
from ..data.transforms import Preset
from ..errors import ConfigError
from ..models.naflex import patch_batch
from ..models.vit import VisionTransformer
from ..runtime import autocast
from .preprocessing import checkpoint_transform, naflex_transform

FEATURE_SUFFIXES = (".npz", ".safetensors")


@dataclass
class Prediction:
    """One image's prediction: its file, the top-k class names with their probabilities (most probable first),
    and with ``features`` its dense patch features and pooled embedding."""

    path: Path
    labels: list[str]  # empty for a model without a classification head
    probabilities: list[float]
    features: torch.Tensor | None = None  # (D, rows, cols) dense patch features, when asked for
    embedding: torch.Tensor | None = None  # the pooled representation (pre-logits), when features were asked for


def class_names(model: VisionTransformer) -> list[str]:
    names = model.config.provenance.classes
    return list(names) if names else [str(i) for i in range(model.config.num_classes)]


def aspect_size(height: int, width: int, shorter: int, multiple: int) -> tuple[int, int]:
    """The size an image of ``height`` x ``width`` takes when its shorter side is scaled to ``shorter`` pixels,
    the aspect ratio kept, each side then rounded to the nearest multiple of ``multiple`` (at least one)."""
    scale = shorter / min(height, width)
    return tuple(max(multiple, round(side * scale / multiple) * multiple) for side in (height, width))


def image_transform(model: VisionTransformer, pixels: torch.Tensor, resize: str, keep_aspect: bool,
                    max_patches: int | None = None) -> Preset:
    """The evaluation transform of the checkpoint (``resize``: its geometry, see ``checkpoint_transform``), or,
    with ``keep_aspect``, a resize of this image to its own aspect ratio at the model's shorter side, rounded to
    the patch (``aspect_size``), or with ``max_patches``, to its own aspect ratio within that many patches
    (NaFlex); with the same normalisation."""
    config = model.config
    if max_patches:
        return naflex_transform(config, max_patches)
    if not keep_aspect:
        return checkpoint_transform(config, resize)
    size = aspect_size(*pixels.shape[-2:], min(config.image_size), config.effective_patch_size)
    return checkpoint_transform(config, "stretch", size)


@torch.no_grad()
def predict(model: VisionTransformer, paths: list[str | Path], top_k: int = 5, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32, resize: str = "crop", features: bool = False,
            keep_aspect: bool = False, max_patches: int | None = None) -> list[Prediction]:
    """Bring each image to the model's resolution (``resize``: the evaluation geometry, see
    ``checkpoint_transform``; ``keep_aspect``: each at its own aspect ratio, see ``image_transform``), normalise
    it as the model was trained, and return the ``top_k`` classes by softmax probability (none for a model
    without a head), and with ``features`` the dense patch features and pooled embedding from the same pass
    (``model`` already on ``device``, computing in ``dtype``)."""
    device = torch.device(device)
    names = class_names(model)
    if not (names or features):
        raise ConfigError("the model has no classification head (num_classes=0): ask for its features instead "
                          "(vitkit predict --features OUT.npz)")
    model.eval()
    results = []
    for path in paths:
        pixels = read_image(Path(path))
        image = image_transform(model, pixels, resize, keep_aspect, max_patches)(pixels)[None].to(device)
        dense = embedding = None
        with autocast(device, dtype):
            if features:
                tokens, grid = encode(model, image)
                dense = grid_features(tokens, grid, model.config.num_prefix_tokens)[0].float().cpu()
                embedding = model.forward_head(tokens, pre_logits=True, grid=grid)[0].float().cpu()
                logits = model.forward_head(tokens) if names else None
            elif max_patches:  # one image as a NaFlex batch: what an exported NaFlex graph takes
                logits = model(patch_batch([image[0]], model.config.patch_size, max_patches))
            else:
                logits = model(image)
        labels, probabilities = top_classes(logits, names, top_k)
        results.append(Prediction(Path(path), labels, probabilities, dense, embedding))
    return results


def predict_files(model: torch.nn.Module, images: list[str | Path], top_k: int = 5,
                  device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, resize: str = "crop",
                  features: str | Path | None = None, keep_aspect: bool = False, max_patches: int | None = None,
                  source: str = "the model") -> tuple[list[Prediction], Path | None]:
    """``predict`` on the image files ``images`` name (files, folders, glob patterns: ``image_files``) with a
    model loaded by ``checkpoints.runnable.load_inference`` (an exported graph only for the input it was exported
    for; ``source`` names it in refusals); with ``features``, every image's dense features and pooled embedding
    are also written to that file (``save_features``). Returns the predictions and the features file."""
    check_graph_inputs(model, source, max_patches)
    if max_patches and keep_aspect:
        raise ConfigError("--keep-aspect and --max-patches: pick one way to keep each image's aspect ratio")
    predictions = predict(model, image_files(images), top_k, device, dtype, resize, bool(features), keep_aspect,
                          max_patches)
    return predictions, save_features(predictions, features) if features else None


def check_feature_request(checkpoint: str | Path, features: str | Path | None) -> None:
    """Refuse, before anything is loaded, a features file ``save_features`` cannot write, or features asked of an
    exported graph (which gives logits only)."""
    if not features:
        return
    feature_file(features)
    if Path(checkpoint).suffix in EXPORTED:
        raise ConfigError(f"--features: {checkpoint} is an exported graph that gives logits only; pass the "
                          "checkpoint it was exported from")


def prediction_record(prediction: Prediction) -> dict:
    """One image's entry of ``vitkit predict --json`` (and ``vitkit zeroshot --json``): its file (``path``, and
    the same under ``image``), the top classes with their probabilities, and the shape of its dense features where
    they were asked for."""
    record = {"path": str(prediction.path), "image": str(prediction.path),
              "top_k": [{"label": label, "probability": round(p, 6)}
                        for label, p in zip(prediction.labels, prediction.probabilities)]}
    if prediction.features is not None:
        record["features_shape"] = list(prediction.features.shape)
    return record


def top_classes(logits: torch.Tensor | None, names: list[str], top_k: int) -> tuple[list[str], list[float]]:
    """The ``top_k`` names by softmax probability of one image's (1, K) logits; nothing without logits."""
    if logits is None:
        return [], []
    indices, probabilities = most_probable(logits.float().softmax(dim=-1)[0].cpu(), top_k)
    return [names[i] for i in indices], probabilities


def most_probable(probabilities: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """The indices and probabilities of the ``k`` most probable classes in one image's (K,) ``probabilities``,
    most probable first (every class where ``k`` is at least K)."""
    top = probabilities.topk(min(k, len(probabilities)))
    return top.indices.tolist(), top.values.tolist()


def feature_file(path: str | Path) -> Path:
    """``path`` if it names a file ``save_features`` writes (.npz, .safetensors); checked before any image is read."""
    path = Path(path)
    if path.suffix not in FEATURE_SUFFIXES:
        raise ConfigError(f"{path}: dense features are written to a file ending in {' or '.join(FEATURE_SUFFIXES)}")
    return path


def save_features(predictions: list[Prediction], path: str | Path) -> Path:
    """Write every image's dense features and the pooled embeddings into ``path`` atomically: ``.npz`` holds
    ``paths`` (N,) strings, ``embeddings`` (N, D') float32 and ``features_0000``... (D, rows, cols) float32, one
    per image in order (sizes may differ); ``.safetensors`` holds the same tensors, the paths as JSON in its
    metadata."""
    path = feature_file(path)
    if any(p.features is None for p in predictions):
        raise ValueError("save_features needs predictions made with features=True")
    tensors = {"embeddings": torch.stack([p.embedding for p in predictions]).contiguous()}
    tensors.update({f"features_{index:04d}": p.features.contiguous() for index, p in enumerate(predictions)})
    names = [str(p.path) for p in predictions]
    with atomic_file(path, "wb") as handle:
        if path.suffix == ".npz":
            np.savez(handle, paths=np.array(names), **{key: value.numpy() for key, value in tensors.items()})
        else:
            from safetensors.torch import save

            handle.write(save(tensors, metadata={"paths": json.dumps(names)}))
    return path
