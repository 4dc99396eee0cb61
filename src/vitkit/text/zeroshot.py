"""Zero-shot classification with an image-text model: class names turned into prompts by templates, each class's
prompts embedded, normalised, averaged and normalised again (open_clip's ``build_zero_shot_classifier``), and
images scored against them: a softmax over the classes of ``exp(logit_scale)`` times the cosine, or, for a SigLIP
model asked for independent labels, the sigmoid of that plus ``logit_bias`` (what SigLIP was trained on)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from ..analysis.inputs import image_files
from ..data import SplitSpec, default_split, evaluation_loader, load_dataset
from ..data.images import read_image
from ..errors import ConfigError, abridged
from ..evaluate.metrics import evaluate, write_report
from ..evaluate.predict import Prediction, most_probable
from ..evaluate.preprocessing import checkpoint_transform
from ..paths import read_text, reason
from ..runtime import autocast
from .clip import ImageTextModel

TEMPLATE_SETS = ("openai", "simple")
SLOT = "{}"


def openai_templates() -> list[str]:
    """open_clip's 80 OpenAI ImageNet templates (``open_clip.zero_shot_metadata``), as format strings."""
    try:
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
    except ImportError:
        raise ImportError("the default templates are open_clip's OpenAI ImageNet templates: pip install "
                          "'vitkit[text]' (open_clip_torch), or pass --templates simple or your own") from None
    return [template(SLOT) for template in OPENAI_IMAGENET_TEMPLATES]


def resolve_templates(templates: str | Sequence[str] | None = None) -> list[str]:
    """The templates ``templates`` names: None or ``openai``, open_clip's OpenAI ImageNet set; ``simple``, the class
    name alone; else format strings, each with one ``{}`` where the class name goes."""
    if isinstance(templates, str):
        templates = [templates]
    if not templates or list(templates) == ["openai"]:
        return openai_templates()
    if list(templates) == ["simple"]:
        return [SLOT]
    for template in templates:
        if not isinstance(template, str) or template.count(SLOT) != 1:
            raise ConfigError(f"template {abridged(template)}: expected one '{SLOT}' where the class name goes "
                              f"(e.g. 'a photo of a {SLOT}.'), or a set: {', '.join(TEMPLATE_SETS)}")
    return list(templates)


def check_classes(classes: Sequence[str]) -> list[str]:
    """The class names, kept verbatim; none at all, an empty (or blank) name or a name given twice is refused."""
    classes = list(classes)
    if not classes:
        raise ConfigError("no class names: give them (--classes NAME ... or --classes-file FILE, one a line)")
    for index, name in enumerate(classes):
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"class {index + 1}: an empty class name ({abridged(name)}); each class needs a name")
    repeated = sorted({name for name in classes if classes.count(name) > 1})
    if repeated:
        raise ConfigError(f"class names given more than once: {', '.join(map(repr, repeated[:5]))}")
    return classes


def read_classes_file(path: str | Path) -> list[str]:
    """Class names, one a line (line ends removed, nothing else); a blank line is an empty name, refused naming it."""
    try:
        lines = read_text(Path(path), "class names file").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--classes-file {path}: {reason(error)}") from None
    blank = next((number for number, line in enumerate(lines, 1) if not line.strip()), None)
    if blank is not None:
        raise ConfigError(f"{path}: line {blank} is empty; expected one class name a line")
    return check_classes(lines)


@torch.no_grad()
def class_embeddings(model: ImageTextModel, classes: Sequence[str], templates: Sequence[str],
                     batch_size: int = 256) -> torch.Tensor:
    """(K, E) unit vectors, one a class: every template filled with the class name, each prompt embedded and
    normalised, the prompts averaged and the mean normalised again."""
    classes, templates = check_classes(classes), resolve_templates(templates)
    prompts = [template.replace(SLOT, name) for name in classes for template in templates]
    embedded = F.normalize(encode_texts(model, prompts, batch_size), dim=-1)
    return F.normalize(embedded.reshape(len(classes), len(templates), -1).mean(dim=1), dim=-1)


def encode_texts(model: ImageTextModel, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
    """(N, E) float embeddings of ``texts``, unnormalised, ``batch_size`` texts at a time."""
    return torch.cat([model.encode_text(list(texts[start:start + batch_size])).float()
                      for start in range(0, len(texts), batch_size)])


def encode_files(model: ImageTextModel, paths: Sequence[Path], resize: str = "crop",
                 device: torch.device | str = "cpu", batch_size: int = 64,
                 names: Sequence[str] | None = None) -> torch.Tensor:
    """(N, E) float embeddings of the image files ``paths``, unnormalised, each image prepared as ``vitkit
    predict`` prepares it (the checkpoint's evaluation transform, ``resize`` its geometry) and embedded
    ``batch_size`` at a time on ``device``; an image that cannot be read is named by ``names`` (default: its path)."""
    transform = checkpoint_transform(model.visual.config, resize)
    names = names or [str(path) for path in paths]
    embedded = []
    for start in range(0, len(paths), batch_size):
        batch = [transform(read_image(Path(path), name)) for path, name in
                 zip(paths[start:start + batch_size], names[start:start + batch_size])]
        embedded.append(model.encode_image(torch.stack(batch).to(device)).float())
    return torch.cat(embedded)


def class_probabilities(model: ImageTextModel, images: torch.Tensor, classifier: torch.Tensor,
                        multi_label: bool = False) -> torch.Tensor:
    """(B, K) probabilities of image embeddings ``images`` (B, E) against the ``classifier`` (K, E) of
    ``class_embeddings``: softmax over the classes of exp(logit_scale) * cosine, or with ``multi_label`` (SigLIP)
    each class's sigmoid(exp(logit_scale) * cosine + logit_bias)."""
    logits = model.logit_scale.exp() * F.normalize(images.float(), dim=-1) @ classifier.T
    if not multi_label:
        return logits.softmax(dim=-1)
    check_multi_label(model)
    return torch.sigmoid(logits + model.logit_bias)


def check_multi_label(model: ImageTextModel) -> None:
    """Independent per-class probabilities need SigLIP's sigmoid and its ``logit_bias``; CLIP has neither."""
    if model.logit_bias is None:
        raise ConfigError(f"--multi-label: {model.source} is a {model.family} model trained with a softmax over "
                          f"texts (no logit_bias); its classes compete, so it gives one softmax")


@torch.no_grad()
def zeroshot_files(model: ImageTextModel, images: Sequence[str | Path], classes: Sequence[str],
                   templates: Sequence[str] | str | None = None, top_k: int = 5, multi_label: bool = False,
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                   resize: str = "crop", batch_size: int = 64) -> list[Prediction]:
    """The ``top_k`` classes of each image file that ``images`` names (files, folders, glob patterns), each image
    prepared as the checkpoint wants it (``vitkit predict``'s transform), ``model`` already on ``device``."""
    if multi_label:
        check_multi_label(model)
    device = torch.device(device)
    files = image_files(images)
    with autocast(device, dtype):
        classifier = class_embeddings(model, classes, templates)
        embedded = encode_files(model, files, resize, device, batch_size)
    results = []
    for path, row in zip(files, class_probabilities(model, embedded, classifier, multi_label).cpu()):
        indices, probabilities = most_probable(row, top_k)
        results.append(Prediction(Path(path), [classes[i] for i in indices], probabilities))
    return results


class ZeroShotClassifier(torch.nn.Module):
    """An image-text model as a classifier of fixed classes: images -> (B, K) logits, exp(logit_scale) times the
    cosine of each image's embedding with each class's (``class_embeddings``); what ``vitkit eval``'s loop runs."""

    def __init__(self, model: ImageTextModel, classifier: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("classifier", classifier)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) normalised images -> (B, K) logits."""
        embedded = F.normalize(self.model.encode_image(images).float(), dim=-1)
        return self.model.logit_scale.exp() * embedded @ self.classifier.T


@torch.no_grad()
def zeroshot_dataset(model: ImageTextModel, dataset: str, split: str | None = None, *,
                     classes: Sequence[str] | None = None, templates: Sequence[str] | str | None = None,
                     data_dir: str | Path | None = None, val_fraction: float = 0.1, corrupt: str = "fail",
                     batch_size: int = 64, num_workers: int = 0, out: str | Path | None = None, resize: str = "crop",
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """Top-1/top-5 (and per-class accuracy, the confusion matrix) of zero-shot classification on ``split`` of
    ``dataset`` (default: its test split, else its validation split, else all of it), the classes named by the
    dataset's own class names or by ``classes`` (as many, in the dataset's order); the report of ``vitkit eval``,
    written as ``eval-<split>.json`` into ``out`` when given. ``model`` already on ``device``."""
    device = torch.device(device)
    chosen = split or default_split(dataset)
    data = load_dataset(dataset, chosen, data_dir, SplitSpec(val_fraction), corrupt)
    names = check_classes(data.classes if classes is None else classes)
    if len(names) != len(data.classes):
        raise ConfigError(f"{len(names)} class names for the {len(data.classes)} classes of {dataset}")
    with autocast(device, dtype):
        classifier = class_embeddings(model, names, templates)
    loader = evaluation_loader(data, checkpoint_transform(model.visual.config, resize), batch_size, num_workers,
                               corrupt, device=device)
    evaluation = evaluate(ZeroShotClassifier(model, classifier), loader, len(names), device, dtype)
    return write_report(evaluation, names, out, chosen)
