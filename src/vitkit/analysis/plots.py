"""The paper's figures for section 4.5, drawn with matplotlib (the ``analysis`` extra) and written as
PNG files atomically. Figures are built without pyplot, so no global state or display is involved."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_file
from ..classnames import escape_name


def _matplotlib():
    try:
        figure = importlib.import_module("matplotlib.figure")
        colormaps = importlib.import_module("matplotlib").colormaps
    except ImportError as error:
        raise ImportError("vitkit's figures need matplotlib: pip install 'vitkit[analysis]' "
                          "(or pip install matplotlib)") from error
    return figure.Figure, colormaps


def save_figure(figure, path: str | Path) -> Path:
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=figure.dpi, bbox_inches="tight")
    return Path(path)


def mosaic(tiles: np.ndarray, columns: int, gap: int = 1) -> np.ndarray:
    """Tiles (n, h, w[, c]) laid out row-major in a grid, separated by ``gap`` NaN pixels."""
    count, height, width = tiles.shape[:3]
    rows = -(-count // columns)
    canvas = np.full((rows * (height + gap) - gap, columns * (width + gap) - gap, *tiles.shape[3:]), np.nan)
    for index, tile in enumerate(tiles):
        top, left = divmod(index, columns)
        canvas[top * (height + gap):top * (height + gap) + height,
               left * (width + gap):left * (width + gap) + width] = tile
    return canvas


def rollout_overlay(image: np.ndarray, heat: torch.Tensor, title: str = "", output: str = ""):
    """The input image beside it with the rollout map (upsampled bilinearly) laid over it; ``output`` names the
    output token the map was rolled out from."""
    Figure, _ = _matplotlib()
    height, width = image.shape[:2]
    figure = Figure(figsize=(6, 3.2), dpi=100)
    left, right = figure.subplots(1, 2)
    for axes in (left, right):
        axes.imshow(image, cmap="gray" if image.ndim == 2 else None)
        axes.set_axis_off()
    right.imshow(heat.numpy(), cmap="jet", alpha=0.5, extent=(-0.5, width - 0.5, height - 0.5, -0.5),
                 interpolation="bilinear", vmin=0, vmax=1)  # the image's own pixel-centred extent
    left.set_title(title or "input", fontsize=9)
    right.set_title(f"attention rollout from {output}" if output else "attention rollout", fontsize=9)
    return figure


def distance_figure(distances: torch.Tensor, patch_size: float):
    """Figure 7 (right): mean attention distance of every head against network depth."""
    Figure, colormaps = _matplotlib()
    layers, heads = distances.shape
    figure = Figure(figsize=(4.5, 3.6), dpi=100)
    axes = figure.subplots()
    colours = colormaps["tab20"](np.arange(heads) % 20)
    for head in range(heads):
        axes.scatter(np.arange(1, layers + 1), distances[:, head].numpy(), s=12, color=colours[head],
                     label=f"head {head + 1}")
    axes.set_xticks(np.arange(1, layers + 1, max(1, layers // 12)))
    axes.set_xlabel("network depth (layer)")
    axes.set_ylabel("mean attention distance (pixels)")
    axes.set_title(f"mean attention distance, {patch_size:g} px tokens", fontsize=9)
    axes.set_ylim(bottom=0)
    if heads <= 16:
        axes.legend(fontsize=6, ncol=2, loc="lower right", frameon=False)
    return figure


def similarity_figure(similarity: torch.Tensor, title: str = "position embedding similarity"):
    """Figure 7 (centre): for every patch, a map of its position embedding's (or rotary phases') cosine
    similarity with all others, placed at that patch's position."""
    Figure, _ = _matplotlib()
    rows, cols = similarity.shape[:2]
    tiles = similarity.reshape(rows * cols, rows, cols).numpy()
    figure = Figure(figsize=(5.5, 5.5 * rows / cols + 0.4), dpi=120)
    axes = figure.subplots()
    shown = axes.imshow(mosaic(tiles, cols), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    step_y, step_x = rows + 1, cols + 1
    axes.set_xticks(np.arange(cols) * step_x + (cols - 1) / 2, [str(c + 1) for c in range(cols)], fontsize=6)
    axes.set_yticks(np.arange(rows) * step_y + (rows - 1) / 2, [str(r + 1) for r in range(rows)], fontsize=6)
    axes.set_xlabel("input patch column")
    axes.set_ylabel("input patch row")
    axes.tick_params(length=0)
    figure.colorbar(shown, ax=axes, fraction=0.046, pad=0.04, shrink=min(1.0, rows / cols), label="cosine similarity")
    axes.set_title(title, fontsize=9)
    return figure


def filters_figure(components: torch.Tensor, columns: int = 7):
    """Figure 7 (left): principal components of the patch-embedding filters, each scaled to [0, 1],
    in RGB for 3-channel models and grey otherwise."""
    Figure, _ = _matplotlib()
    tiles = components.numpy()
    low = tiles.min(axis=(1, 2, 3), keepdims=True)
    high = tiles.max(axis=(1, 2, 3), keepdims=True)
    tiles = (tiles - low) / np.where(high > low, high - low, 1.0)
    tiles = tiles.transpose(0, 2, 3, 1) if tiles.shape[1] == 3 else tiles.mean(axis=1)
    canvas = mosaic(tiles, min(columns, len(tiles)))
    canvas = np.where(np.isnan(canvas), 1.0, canvas)  # white gaps
    figure = Figure(figsize=(5, 5 * canvas.shape[0] / canvas.shape[1] + 0.4), dpi=120)
    axes = figure.subplots()
    axes.imshow(canvas, cmap="gray" if canvas.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
    axes.set_axis_off()
    axes.set_title(f"RGB embedding filters (first {len(tiles)} principal components)"
                   if components.shape[1] == 3 else f"embedding filters (first {len(tiles)} principal components)",
                   fontsize=9)
    return figure


def features_figure(image: np.ndarray, colours: torch.Tensor, title: str = ""):
    """The input image beside its dense features' principal components as colours (``feature_colours``), one
    patch a pixel block."""
    Figure, _ = _matplotlib()
    figure = Figure(figsize=(9, 3.4), dpi=110)
    left, right = figure.subplots(1, 2)
    left.imshow(image, cmap="gray" if image.ndim == 2 else None)
    right.imshow(colours.numpy(), interpolation="nearest")
    for axes in (left, right):
        axes.set_axis_off()
    left.set_title(f"input, {image.shape[0]}x{image.shape[1]} px", fontsize=9)
    right.set_title(f"PCA of the {colours.shape[0]}x{colours.shape[1]} patch features as RGB", fontsize=9)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def text_similarity_figure(image: np.ndarray, maps: torch.Tensor, prompts: list[str], title: str = ""):
    """The input image, then for each prompt the image with the (K, rows, cols) cosine ``maps`` of its patches
    with that prompt laid over it (upsampled bilinearly), on one colour scale for all prompts."""
    Figure, _ = _matplotlib()
    height, width = image.shape[:2]
    low, high = float(maps.min()), float(maps.max())
    figure = Figure(figsize=(3 * (len(prompts) + 1) + 0.6, 3.2), dpi=100)
    panels = figure.subplots(1, len(prompts) + 1, squeeze=False)[0]
    for axes in panels:
        axes.imshow(image, cmap="gray" if image.ndim == 2 else None)
        axes.set_axis_off()
    panels[0].set_title(title or "input", fontsize=9)
    for axes, prompt, heat in zip(panels[1:], prompts, maps):
        shown = axes.imshow(heat.numpy(), cmap="jet", alpha=0.5, extent=(-0.5, width - 0.5, height - 0.5, -0.5),
                            interpolation="bilinear", vmin=low, vmax=high if high > low else low + 1e-6)
        axes.set_title(f"{escape_name(prompt)[:40]!r}: max {float(heat.max()):.3f}", fontsize=9)
    figure.colorbar(shown, ax=list(panels[1:]), fraction=0.03, pad=0.02, label="cosine with the prompt")
    return figure
