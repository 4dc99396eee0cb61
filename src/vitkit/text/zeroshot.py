"""Zero-shot classification with an image-text model: class names turned into prompts by templates, each class's
prompts embedded, normalised, averaged and normalised again (open_clip's ``build_zero_shot_classifier``), and
images scored against them: a softmax over the classes of ``exp(logit_scale)`` times the cosine, or, for a SigLIP
model asked for independent labels, the sigmoid of that plus ``logit_bias`` (what SigLIP was trained on)."""

from __future__ import annotations

import json
import logging
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

logger = logging.getLogger(__name__)
TEMPLATE_SETS = ("openai", "simple")
SLOT = "{}"
# clip-benchmark's keys of its English class names and templates for the tasks vitkit names (the suite's, VTAB-1k's
# as ``vtab-<name>``); None: it has no class names for the task (CIFAR's and DTD's are the datasets' own).
BENCHMARK = {
    "imagenet": ("imagenet1k", "imagenet1k"), "cifar10": (None, "cifar10"), "cifar100": (None, "cifar100"),
    "pets": ("pets", "pets"), "flowers102": ("flowers", "flowers"), "mnist": ("mnist", "mnist"),
    "vtab-caltech101": ("caltech101_vtab", "caltech101"), "vtab-cifar100": (None, "cifar100"),
    "vtab-dtd": (None, "dtd"), "vtab-oxford_flowers102": ("flowers", "flowers"),
    "vtab-oxford_iiit_pet": ("pets", "pets"), "vtab-svhn": ("svhn", "svhn"), "vtab-sun397": (None, "sun397"),
    "vtab-patch_camelyon": ("pcam", "pcam"), "vtab-eurosat": ("eurosat", "eurosat"),
    "vtab-resisc45": (None, "resisc45"), "vtab-diabetic_retinopathy": ("diabetic_retinopathy",) * 2,
    "vtab-clevr_count": ("clevr_count_all",) * 2, "vtab-clevr_distance": ("clevr_closest_object_distance",) * 2,
    "vtab-dmlab": ("dmlab", "dmlab"), "vtab-kitti_distance": ("kitti_closest_vehicle_distance",) * 2,
    "vtab-dsprites_location": (None, "dsprites_label_x_position"),
    "vtab-dsprites_orientation": (None, "dsprites_label_orientation"),
    "vtab-smallnorb_azimuth": (None, "smallnorb_label_azimuth"),
    "vtab-smallnorb_elevation": (None, "smallnorb_label_elevation"),
}


def openai_templates() -> list[str]:
    """open_clip's 80 OpenAI ImageNet templates (``open_clip.zero_shot_metadata``), as format strings."""
    try:
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
    except ImportError:
        raise ImportError("the default templates are open_clip's OpenAI ImageNet templates: pip install "
                          "'vitkit[text]' (open_clip_torch), or pass --templates simple or your own") from None
    return [template(SLOT) for template in OPENAI_IMAGENET_TEMPLATES]


def benchmark_prompts(task: str, count: int) -> tuple[list[str] | None, list[str] | None]:
    """clip-benchmark's English class names and templates for ``task`` (a key of ``BENCHMARK``), as its zero-shot
    evaluation prompts them: (names, templates), names None where it has none or not ``count`` of them, both None
    for a task it does not know or where clip-benchmark is not installed (``vitkit[text]``)."""
    keys = BENCHMARK.get(task)
    if keys is None:
        return None, None
    try:
        from importlib.resources import files

        folder = files("clip_benchmark") / "datasets"
    except ModuleNotFoundError:
        return None, None
    names_key, templates_key = keys
    names = json.loads((folder / "en_classnames.json").read_text(encoding="utf-8")).get(names_key) if names_key \
        else None
    templates = json.loads((folder / "en_zeroshot_classification_templates.json").read_text(encoding="utf-8"))
    templates = [template.replace("{c}", SLOT) for template in templates[templates_key]]  # its slot is {c}
    return (names if names is not None and len(names) == count else None), templates


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
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                     task: str | None = None) -> dict:
    """Top-1/top-5 (and per-class accuracy, the confusion matrix) of zero-shot classification on ``split`` of
    ``dataset`` (default: its test split, else its validation split, else all of it), the classes named by
    ``classes`` (as many, in the dataset's order), else for a ``task`` clip-benchmark knows by its class names
    (``benchmark_prompts``), else by the dataset's own; prompted by ``templates``, else the task's
    clip-benchmark templates, else open_clip's OpenAI ones. The report of ``vitkit eval``, written as
    ``eval-<split>.json`` into ``out`` when given, says which names and templates it used. ``model`` already on
    ``device``."""
    device = torch.device(device)
    chosen = split or default_split(dataset)
    data = load_dataset(dataset, chosen, data_dir, SplitSpec(val_fraction), corrupt)
    benchmark_names, benchmark_templates = benchmark_prompts(task, len(data.classes)) if task else (None, None)
    prompts = {"class_names": "given" if classes is not None else "clip-benchmark" if benchmark_names else "dataset",
               "templates": "given" if templates is not None else "clip-benchmark" if benchmark_templates
               else "openai"}
    templates = templates if templates is not None else benchmark_templates  # None: the OpenAI set
    if "clip-benchmark" in prompts.values():  # a default the user did not spell out: said
        logger.info(f"{dataset}: prompted as clip-benchmark prompts {task} (class names: {prompts['class_names']}, "
                    f"templates: {prompts['templates']}); --classes and --templates override")
    names = check_classes(classes if classes is not None else benchmark_names or data.classes)
    if len(names) != len(data.classes):
        raise ConfigError(f"{len(names)} class names for the {len(data.classes)} classes of {dataset}")
    with autocast(device, dtype):
        classifier = class_embeddings(model, names, templates)
    loader = evaluation_loader(data, checkpoint_transform(model.visual.config, resize), batch_size, num_workers,
                               corrupt, device=device)
    evaluation = evaluate(ZeroShotClassifier(model, classifier), loader, len(names), device, dtype)
    return write_report(evaluation, names, out, chosen, extra={"prompts": prompts})
