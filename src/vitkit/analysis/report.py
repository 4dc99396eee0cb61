"""``vitkit analyze``: every analysis of section 4.5 for one model and a set of images, written as
figures (PNG), numbers (JSON, NPY) and one self-contained HTML page that shows them together."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..atomic import atomic_file
from ..runtime import autocast
from . import plots
from .attention import READOUTS, attention_rollout, mean_attention_distance, output_readout, readout_weights
from .embeddings import filter_components, patch_filters, position_similarity, position_table, rope_phases
from .features import text_similarity
from .inputs import Sample

REPORT_FILE = "index.html"


@dataclass
class FigureFile:
    file: str
    caption: str


@dataclass
class Analysis:
    """What was written into ``out``, for the page and for callers."""

    out: Path
    summary: dict
    figures: list[FigureFile] = field(default_factory=list)

    def save_numbers(self, key: str, array: torch.Tensor) -> None:
        with atomic_file(self.out / f"{key}.npy", "wb") as handle:
            np.save(handle, array.numpy(), allow_pickle=False)
        self.summary["files"][key] = f"{key}.npy"

    def save_figure(self, file: str, figure, caption: str) -> None:
        plots.save_figure(figure, self.out / file)
        self.figures.append(FigureFile(file, caption))


def analyze(model: nn.Module, images: torch.Tensor | Sequence[torch.Tensor], pictures: Sequence[np.ndarray],
            out: str | Path, *, batch_size: int = 8, head_fusion: str = "mean", discard_ratio: float = 0.0,
            overlays: int = 8, filters: int = 28, title: str = "", dtype: torch.dtype = torch.float32,
            readout: str | None = None, about: Sequence[Sample] | None = None, prompts: Sequence[str] = (),
            text_embeddings: torch.Tensor | None = None) -> Analysis:
    """Analyse ``model`` on ``images`` (prepared input, (B, C, H, W), or a list of (1, C, H, W) images of their
    own sizes, each at its aspect ratio) whose uint8 crops are ``pictures`` and write the results into ``out``;
    the model runs where its weights are, computing in ``dtype``. The rollout is read out where the model's head
    reads (``attention_rollout``'s rule) unless ``readout`` names another output (see ``output_readout``).
    ``about`` names each image and its label, where known (default: its index); the figures and the page show
    them beside the model's prediction. ``prompts`` with their ``text_embeddings`` (K, E) by the text tower of the
    image-text model whose image tower ``model`` is: a map per image and prompt of the cosine of each patch's
    embedding with the prompt's (``features.text_similarity``)."""
    device = next(model.parameters()).device
    config = model.config
    readout = output_readout(model, readout)
    batches = [images[start:start + batch_size] for start in range(0, len(images), batch_size)] \
        if isinstance(images, torch.Tensor) else list(images)  # batches bound the memory attention maps take
    rollouts, sizes, logits, distance_sum, similarities = [], [], [], 0.0, []
    for batch in batches:
        with torch.no_grad(), autocast(device, dtype):
            seen = model.forward_intermediates(batch.to(device), attention=True)
            weights = readout_weights(model, seen.features, readout).cpu()
            if config.num_classes and not prompts:  # an image-text tower's head embeds; it does not classify
                logits.extend(model.forward_head(seen.features).float().cpu())
            if prompts:
                similarities.extend(text_similarity(model, seen.features, seen.grid, text_embeddings.to(device)).cpu())
        attn, grid = torch.stack(seen.attentions).float().cpu(), tuple(seen.grid)
        stride = (batch.shape[-2] / grid[0], batch.shape[-1] / grid[1])  # pixels per token, hybrids too
        rollouts.extend(attention_rollout(attn, grid, head_fusion, discard_ratio, weights))
        sizes.extend([list(batch.shape[-2:])] * len(batch))
        distance_sum = distance_sum + mean_attention_distance(attn, grid, stride) * len(batch)
    count = len(rollouts)
    distances = distance_sum / count
    one_size = all(size == sizes[0] for size in sizes)

    Path(out).mkdir(parents=True, exist_ok=True)
    analysis = Analysis(Path(out), {
        "title": title, "model": config.to_dict(), "images": count,
        "image_size": sizes[0] if one_size else sizes, "grid": list(grid), "token_stride_px": list(stride),
        "prefix_tokens": prefix_tokens(config),
        "rollout": {"head_fusion": head_fusion, "discard_ratio": discard_ratio, "readout": readout,
                    "output_token": READOUTS[readout]},
        "inputs": described(about or [Sample(f"image {index}") for index in range(count)], logits, config),
        "mean_attention_distance_px": [[round(v, 3) for v in row] for row in distances.tolist()],
        "position_similarity": [], "files": {}, "skipped": {},
    })
    if one_size:
        analysis.save_numbers("rollout", torch.stack(rollouts))
    else:  # each image's map on its own grid
        for index, rollout in enumerate(rollouts):
            analysis.save_numbers(f"rollout_{index:03d}", rollout)
    for index in range(min(overlays, len(pictures))):
        entry = analysis.summary["inputs"][index]
        analysis.save_figure(f"rollout_{index:03d}.png",
                             plots.rollout_overlay(pictures[index], rollouts[index], figure_title(entry),
                                                   READOUTS[readout]),
                             f"Attention rollout ({head_fusion} over heads) from {READOUTS[readout]} of "
                             f"{caption(entry)}.")
    if prompts:
        text_figures(analysis, prompts, similarities, pictures, overlays, one_size)
    analysis.save_numbers("mean_attention_distance", distances)
    analysis.save_figure("attention_distance.png", plots.distance_figure(distances, stride[0]),
                         f"Mean attention distance per head and depth over {count} images (figure 7 right).")
    position_figures(analysis, model, grid)
    filter_figure(analysis, model, filters)
    with atomic_file(analysis.out / "summary.json") as handle:
        json.dump(analysis.summary, handle, indent=2)
    write_page(analysis)
    return analysis


def text_figures(analysis: Analysis, prompts: Sequence[str], similarities: list[torch.Tensor],
                 pictures: Sequence[np.ndarray], overlays: int, one_size: bool) -> None:
    """The text-conditioned maps: numbers (``text_similarity.npy``, (images, prompts, rows, cols), or one file an
    image where sizes differ), a figure for each of the first ``overlays`` images, and the summary's entry."""
    if one_size:
        analysis.save_numbers("text_similarity", torch.stack(similarities))
    else:
        for index, maps in enumerate(similarities):
            analysis.save_numbers(f"text_similarity_{index:03d}", maps)
    analysis.summary["text_similarity"] = {
        "prompts": list(prompts), "measure": "cosine of each patch's embedding (final norm, then the pooling and "
        "projection of the image embedding applied to the patch alone) with the prompt's text embedding",
        "max": [[round(float(m.max()), 5) for m in maps] for maps in similarities]}
    for index in range(min(overlays, len(pictures))):
        entry = analysis.summary["inputs"][index]
        analysis.save_figure(f"text_similarity_{index:03d}.png",
                             plots.text_similarity_figure(pictures[index], similarities[index], list(prompts),
                                                          figure_title(entry)),
                             f"Cosine of each patch's embedding with the text embedding of each prompt, "
                             f"{caption(entry)}.")


def described(about: Sequence[Sample], logits: Sequence[torch.Tensor], config) -> list[dict]:
    """Each image's entry of the summary: its index, name and label, and the model's top class with its
    probability (none for a model without a head)."""
    classes = list(config.provenance.classes or map(str, range(config.num_classes)))
    entries = []
    for index, sample in enumerate(about):
        entry = {"index": index, "name": sample.name, "label": sample.label}
        if index < len(logits):
            probability, top = logits[index].softmax(-1).max(-1)
            entry.update(prediction=classes[int(top)], probability=round(float(probability), 4))
        entries.append(entry)
    return entries


def caption(entry: dict) -> str:
    """"image 3 (cat.png), label cat, predicted dog (87%)": an image as the page names it."""
    words = f"image {entry['index']} ({entry['name']})"
    if entry["label"] is not None:
        words += f", label {entry['label']}"
    if "prediction" in entry:
        words += f", predicted {entry['prediction']} ({100 * entry['probability']:.0f}%)"
    return words


def figure_title(entry: dict, width: int = 36) -> str:
    """An image's name (its last ``width`` characters) over its label and prediction: the overlay's title."""
    name = entry["name"] if len(entry["name"]) <= width else "..." + entry["name"][-width:]
    facts = [f"label {entry['label']}"] if entry["label"] is not None else []
    if "prediction" in entry:
        facts.append(f"predicted {entry['prediction']} ({100 * entry['probability']:.0f}%)")
    return "\n".join([f"{entry['index']}: {name}", ", ".join(facts)] if facts else [f"{entry['index']}: {name}"])


def prefix_tokens(config) -> dict[str, int]:
    """How many tokens of each kind stand before the patches, in their order."""
    return {"class": int(config.class_token), "distillation": int(config.dist_token), "registers": config.reg_tokens}


def position_figures(analysis: Analysis, model: nn.Module, grid: tuple[int, int]) -> None:
    """Figure 7 (centre) for what the model holds: the similarity of its position table at the table's own grid,
    and, with rotary embeddings, of the patches' rotary phases at the analysed grid (``rope_phases``); both for
    EVA-02, which has both. Which were drawn is listed in the summary's ``position_similarity``."""
    config, drawn = model.config, analysis.summary["position_similarity"]
    try:
        table, table_grid = position_table(model)
    except ValueError as error:
        reason = str(error)
    else:
        similarity = position_similarity(table.cpu(), table_grid)
        analysis.save_numbers("position_similarity", similarity)
        analysis.save_figure("position_similarity.png", plots.similarity_figure(similarity),
                             f"Cosine similarity of the position embeddings ({config.pos_embed}, "
                             f"{table_grid[0]}x{table_grid[1]} grid; figure 7 centre).")
        drawn.append({"kind": "table", "grid": list(table_grid), "file": "position_similarity.png"})
    if model.rope is not None:
        phases = position_similarity(rope_phases(model, grid), grid)
        blocks = " averaged over blocks and heads" if config.rope == "mixed" else ""
        analysis.save_numbers("rope_similarity", phases)
        analysis.save_figure("rope_similarity.png", plots.similarity_figure(phases, "rotary phase similarity"),
                             f"Cosine similarity of the patches' rotary phase vectors [cos, sin] ({config.rope} "
                             f"RoPE, {config.rope_grid} coordinates{blocks}, {grid[0]}x{grid[1]} grid): the mean "
                             "over frequencies of cos(angle difference), what stands for a position table in a "
                             "RoPE model (figure 7 centre).")
        drawn.append({"kind": "rope", "grid": list(grid), "file": "rope_similarity.png",
                      "blocks": "mean over blocks and heads" if blocks else "one table for every block"})
    if not drawn:
        analysis.summary["skipped"]["position_similarity"] = reason


def filter_figure(analysis: Analysis, model: nn.Module, filters: int) -> None:
    """Figure 7 (left): principal components of the patch-embedding filters, where the model has pixel filters."""
    try:
        weights = patch_filters(model)
    except ValueError as error:
        analysis.summary["skipped"]["filter_components"] = str(error)
        return
    components, explained = filter_components(weights.cpu(), filters)
    analysis.summary["filter_explained_variance"] = [round(v, 5) for v in explained.tolist()]
    analysis.save_numbers("filter_components", components)
    analysis.save_figure("filters.png", plots.filters_figure(components),
                         f"First {len(components)} principal components of the patch-embedding filters "
                         "(figure 7 left).")


def describe_prefix(counts: dict[str, int]) -> str:
    """"1 [class] token, 4 register tokens", or "no prefix tokens"."""
    names = {"class": "[class]", "distillation": "distillation", "registers": "register"}
    parts = [f"{count} {names[kind]} token{'s' if count > 1 else ''}" for kind, count in counts.items() if count]
    return ", ".join(parts) or "no prefix tokens"


def describe_sizes(summary: dict) -> str:
    """"at 224x224 px, a 14x14 patch grid", or, for images each at its own aspect ratio, "at their own sizes"."""
    size, grid = summary["image_size"], summary["grid"]
    if isinstance(size[0], list):
        return "each at its own aspect ratio (" + ", ".join(f"{h}x{w}" for h, w in size[:4]) + \
            (" ..." if len(size) > 4 else "") + " px)"
    return f"at {size[0]}x{size[1]} px, a {grid[0]}x{grid[1]} patch grid"


def describe_positions(drawn: list[dict]) -> str:
    """Which position similarity the page shows: the learned or fixed table, the rotary phases, both or none."""
    words = {"table": "the position table", "rope": "the rotary phases (no table holds positions in a RoPE model)"}
    return " and ".join(words[entry["kind"]] for entry in drawn) or "nothing (the model holds no positions)"


def image_row(entry: dict) -> str:
    """An image's row of the page's table: index, name, label, prediction and its probability."""
    names = [entry["name"], "-" if entry["label"] is None else entry["label"], entry.get("prediction", "-")]
    probability = f"{100 * entry['probability']:.1f}%" if "prediction" in entry else "-"
    return (f"<tr><td>{entry['index']}</td>" + "".join(f"<td class=name>{html.escape(str(name))}</td>" for name in names)
            + f"<td>{probability}</td></tr>")


def text_paragraph(summary: dict) -> str:
    """The page's words on the text-conditioned maps, where there are any."""
    if "text_similarity" not in summary:
        return ""
    prompts = ", ".join(f"'{html.escape(prompt)}'" for prompt in summary["text_similarity"]["prompts"])
    return (f"<p>Text-conditioned maps for {prompts}: the {html.escape(summary['text_similarity']['measure'])}."
            "</p>\n")


def write_page(analysis: Analysis) -> Path:
    """One HTML file with every figure inlined, so it can be mailed or archived as it is."""
    summary = analysis.summary
    config = summary["model"]
    figures = []
    for figure in analysis.figures:
        data = base64.b64encode((analysis.out / figure.file).read_bytes()).decode("ascii")
        figures.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(figure.file)}">'
                       f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>")
    rows = "".join(f"<tr><td>{layer + 1}</td><td>{min(row):.1f}</td><td>{sum(row) / len(row):.1f}</td>"
                   f"<td>{max(row):.1f}</td></tr>"
                   for layer, row in enumerate(summary["mean_attention_distance_px"]))
    pictures = "".join(image_row(entry) for entry in summary["inputs"])
    skipped = "".join(f"<li>{html.escape(key)} skipped: {html.escape(reason)}</li>"
                      for key, reason in summary["skipped"].items())
    name = config["provenance"]["name"] or "ViT"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vitkit analysis: {html.escape(summary['title'] or name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
.figures {{ display: flex; flex-wrap: wrap; gap: 1.5em; }}
figure {{ margin: 0; max-width: 520px; }} img {{ max-width: 100%; }}
figcaption {{ font-size: 0.85em; color: #555; }} table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }} td.name {{ text-align: left; }}
</style></head><body data-figures="{len(figures)}">
<h1>{html.escape(summary['title'] or name)}</h1>
<p>{html.escape(name)}: {config['depth']} layers, D={config['dim']}, {config['num_heads']} heads, pooling
'{html.escape(config['pool'])}', position embeddings '{html.escape(config['pos_embed'])}', rotary embeddings
'{html.escape(config['rope'])}'. {summary['images']} images {describe_sizes(summary)}, behind the patches
{describe_prefix(summary['prefix_tokens'])}.</p>
{text_paragraph(summary)}<p>Attention rollout from {html.escape(summary['rollout']['output_token'])}; prefix tokens are
kept out of the patch grid and out of the attention distances. Position similarity drawn from:
{html.escape(describe_positions(summary['position_similarity']))}.</p>
<div class="figures">{''.join(figures)}</div>
<h2>Images</h2>
<table><tr><th>#</th><th>image</th><th>label</th><th>prediction</th><th>probability</th></tr>{pictures}</table>
<h2>Mean attention distance (pixels) over heads</h2>
<table><tr><th>layer</th><th>min</th><th>mean</th><th>max</th></tr>{rows}</table>
{f'<ul>{skipped}</ul>' if skipped else ''}
<p>Numbers: summary.json and the .npy files next to this page.</p>
<script>
// Record how many figures the browser decoded, so a headless check can tell that all of them show.
addEventListener("load", () => {{
  document.body.dataset.shown = [...document.images].filter(i => i.complete && i.naturalWidth > 0).length;
}});
</script>
</body></html>
"""
    path = analysis.out / REPORT_FILE
    with atomic_file(path) as handle:
        handle.write(page)
    return path
