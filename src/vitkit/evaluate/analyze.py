"""A checkpoint analysed on images as ``vitkit analyze`` does it: the images gathered (files, a dataset sample or
the sample photos), prepared as the checkpoint wants them or as asked, then ``analysis.report.analyze``'s figures
and page. It lies here rather than in ``analysis`` because it prepares the images as evaluation does
(``preprocessing``), and ``evaluate`` already builds on ``analysis``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..analysis import inputs
from ..analysis.report import Analysis, analyze
from ..checkpoints.runnable import load_on_device, refuse_dense
from ..data.transforms import Preset
from ..errors import ConfigError
from ..memory import Estimate, Plan, check, estimate, tokens_per_image
from ..runtime import resolve_precision, select_device
from ..models.config import ViTConfig
from .accuracy import check_model_memory
from .preprocessing import checkpoint_transform, naflex_transform


@dataclass
class CheckpointAnalysis:
    """What ``analyze_checkpoint`` wrote (``analysis``: the folder, figures and numbers), the number of images
    analysed and the size they were brought to (None: each at its own aspect ratio)."""

    analysis: Analysis
    images: int
    size: tuple[int, int] | None


def analyze_checkpoint(checkpoint: str, out: str | Path, *, images: Sequence[str | Path] | None = None,
                       dataset: str | None = None, data_dir: str | Path | None = None, num_images: int = 64,
                       seed: int = 0, image_size: tuple[int, int] | None = None,
                       mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                       resize: str = "crop", max_patches: int | None = None, device: str | None = None,
                       precision: str = "fp32", overrides: dict[str, Any] | None = None, adapter: str | None = None,
                       texts: Sequence[str] = (), image_text: Any = None, **options: Any) -> CheckpointAnalysis:
    """Attention rollout, mean attention distance, position-embedding similarity and filter PCA of
    ``checkpoint`` (with ``overrides`` and the adapter folder ``adapter``, on ``device`` in ``precision``)
    written into ``out`` with an HTML page, on the image files ``images`` name, or ``num_images`` drawn with
    ``seed`` from ``dataset``'s test split, or scikit-learn's two sample photos. The images are brought to
    ``image_size`` (default: the checkpoint's) by ``resize``, or with ``max_patches`` each to its own aspect ratio,
    and normalised by ``mean``/``std`` (one value or one per channel; default: the checkpoint's). ``texts``: prompts
    whose text-conditioned maps are drawn too, each embedded (verbatim) by the text tower of ``image_text``, the
    checkpoint read as an image-text model (``vitkit.load_clip``), whose image tower is the one analysed.
    ``options`` go to ``analysis.report.analyze`` (batch_size, head_fusion, discard_ratio, readout, overlays,
    filters)."""
    check_model_memory(checkpoint, overrides, device, precision, adapter=adapter, command="vitkit analyze")
    if texts:
        model, embedded, device, dtype = image_text_tower(image_text, texts, device, precision, adapter)
        options.update(prompts=list(texts), text_embeddings=embedded)
    else:
        model, device, dtype = load_on_device(checkpoint, overrides, device, precision, adapter=adapter)
    config = model.config
    refuse_dense(config, checkpoint, "vitkit analyze")
    pictures, about = inputs.gather(images, dataset, data_dir, num_images, seed, config.provenance.classes)
    if max_patches and image_size:
        raise ConfigError("--image-size and --max-patches: the budget sizes each image at its own aspect ratio")
    size = None if max_patches else image_size or config.image_size
    check_analysis_memory(config, options.get("batch_size", 8), size, max_patches, device, dtype)
    prepared, shown = inputs.prepare(pictures, input_transform(config, resize, size, mean, std, max_patches))
    title = str(checkpoint) if adapter is None else f"{checkpoint} with adapter {adapter}"
    result = analyze(model, prepared, shown, out, title=title, dtype=dtype, about=about, **options)
    return CheckpointAnalysis(result, len(prepared), size)


def image_text_tower(model: Any, texts: Sequence[str], device: str | None, precision: str, adapter: str | None
                     ) -> tuple[torch.nn.Module, torch.Tensor, torch.device, torch.dtype]:
    """The image tower of the image-text ``model`` (``vitkit.load_clip``'s) on ``device``, the (K, E) embeddings of
    ``texts`` by its text tower (in float32), the device and the dtype ``precision`` computes in there."""
    if adapter is not None:
        raise ConfigError("--text and --adapter: an adapter trained on the image tower alone leaves the space its "
                          "text tower embeds into; draw text-conditioned maps of the checkpoint itself")
    if model is None:
        raise ConfigError("texts to map need the checkpoint read as an image-text model: image_text=load_clip(...)")
    with torch.no_grad():
        embedded = model.encode_text(list(texts)).float()
    chosen = select_device(device)
    return model.visual.to(chosen), embedded, chosen, resolve_precision(precision, chosen)


def check_analysis_memory(config: ViTConfig, batch_size: int, size: tuple[int, int] | None, max_patches: int | None,
                          device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, before an image is run, an analysis whose batches cannot fit: the pass of ``batch_size`` images at
    ``size`` (or ``max_patches`` each) and every block's attention maps, which the analysis keeps (and stacks in
    float32): depth x heads x tokens^2 numbers an image, twice."""

    def measure(plan: Plan) -> Estimate:
        found = estimate(config, plan.batch, plan.image_size, dtype=dtype, patches=max_patches, device=device.type)
        tokens = tokens_per_image(config, plan.image_size, max_patches)
        maps = 2 * 4 * plan.batch * config.depth * config.num_heads * tokens ** 2
        note = f"{config.depth} blocks x {config.num_heads} heads x {tokens}^2 an image"
        return Estimate({**found.parts, "attention maps": maps}, found.device, {**found.notes, "attention maps": note})

    plan = Plan(batch_size, tuple(size or config.image_size), stride=config.effective_patch_size,
                image_flag=None if max_patches else "--image-size {}")
    check(plan, measure, "vitkit analyze", device=device)


def input_transform(config: ViTConfig, resize: str, size: tuple[int, int] | None, mean: Sequence[float] | None,
                    std: Sequence[float] | None, max_patches: int | None) -> Preset:
    """The checkpoint's test-time transform at ``size`` (``max_patches``: NaFlex's, each image at its own aspect
    ratio), with ``mean``/``std`` where given instead of the checkpoint's."""
    mean = per_channel(mean, config.in_chans) if mean else None
    std = per_channel(std, config.in_chans) if std else None
    if max_patches:
        return naflex_transform(config, max_patches, mean, std)
    return checkpoint_transform(config, resize, size, mean, std)


def per_channel(values: Sequence[float], channels: int) -> list[float]:
    """One normalisation value for each of ``channels``: one value repeated, or as many as there are channels."""
    if len(values) == 1:
        return list(values) * channels
    if len(values) != channels:
        raise ConfigError(f"--mean/--std: expected 1 or {channels} values for the normalisation, got {values}")
    return list(values)
