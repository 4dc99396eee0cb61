"""The teacher of a distillation run (DeiT, Touvron et al. 2021): any classifier ``vitkit.load`` reads (a ViT
trained here, a bigger one, a hybrid), or a timm or torchvision CNN named by its architecture with a local weights
file, as DeiT's RegNet teacher was: ``timm:regnety_160=weights.safetensors``, ``torchvision:resnet50=r50.pth``.

The teacher runs in eval mode without gradients on the student's batches, brought from the student's
normalisation to its own (and its channels; to another size only where asked); its outputs are kept per image when
the training images are the same every epoch (no random augmentation), so each is computed once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..atomic import atomic_file
from ..checkpoints.files import read_weights
from ..checkpoints.loading import load
from ..errors import CheckpointError, ConfigError, parse_json
from ..models.config import ViTConfig, pair
from ..models.vit import LUMINANCE, VisionTransformer
from ..paths import read_text

CNN_LIBRARIES = ("timm", "torchvision")
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # torchvision's classifiers' input statistics
TEACHER_FILE = "teacher.json"  # in the run folder: which teacher, by the digest of its weights, for --resume


class Teacher:
    """A frozen classifier the student learns from: ``teacher(images)`` gives its (B, classes) logits of a batch
    normalised for the student. ``digest`` identifies its weights."""

    def __init__(self, model: nn.Module, statistics: tuple[tuple[float, ...], tuple[float, ...]], channels: int,
                 student: ViTConfig, size: tuple[int, int] | None, cached: bool, digest: str):
        self.model = model.eval().requires_grad_(False)
        self.mean, self.std = (torch.tensor(values).view(1, -1, 1, 1) for values in statistics)
        self.student_mean, self.student_std = (torch.tensor(values).view(1, -1, 1, 1)
                                               for values in student.input_statistics)
        self.channels, self.size, self.digest = channels, size, digest
        self.cache: dict[bytes, torch.Tensor] | None = {} if cached else None

    def to(self, device: torch.device) -> "Teacher":
        self.model.to(device)
        return self

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """The student's batch as the teacher was trained to see it: pixels back from the student's normalisation,
        grey repeated into RGB (or RGB made grey by ITU-R 601-2 luminance), resized if asked, then normalised as
        the teacher's weights were trained."""
        device = images.device
        pixels = images.float() * self.student_std.to(device) + self.student_mean.to(device)
        if pixels.shape[1] != self.channels:
            pixels = pixels.expand(-1, 3, -1, -1) if self.channels == 3 else \
                (pixels * torch.tensor(LUMINANCE, device=device).view(1, 3, 1, 1)).sum(dim=1, keepdim=True)
        if self.size is not None and tuple(pixels.shape[-2:]) != self.size:
            pixels = F.interpolate(pixels, size=self.size, mode="bilinear", antialias=True, align_corners=False)
        return ((pixels - self.mean.to(device)) / self.std.to(device)).to(images.dtype)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            return self.model(self.inputs(images)).float()
        keys = [hashlib.blake2b(image.numpy().tobytes(), digest_size=16).digest()
                for image in images.detach().float().cpu()]
        missing = sorted({index for index, key in enumerate(keys) if key not in self.cache})
        if missing:
            computed = self.model(self.inputs(images[missing])).float()
            self.cache.update({keys[index]: logits for index, logits in zip(missing, computed)})
        return torch.stack([self.cache[key] for key in keys]).to(images.device)


def parse_source(text: str) -> tuple[str | None, str | None, str]:
    """``timm:ARCH=FILE`` or ``torchvision:ARCH=FILE`` as (library, architecture, weights file); anything else is
    a checkpoint ``vitkit.load`` reads: (None, None, text)."""
    library, colon, rest = text.partition(":")
    if not colon or library not in CNN_LIBRARIES:
        return None, None, text
    architecture, equals, weights = rest.partition("=")
    if not equals or not architecture or not weights:
        raise ConfigError(f"--distill-teacher {text}: expected {library}:ARCHITECTURE=WEIGHTS_FILE, e.g. "
                          f"{library}:{'regnety_160' if library == 'timm' else 'resnet50'}=weights.safetensors")
    return library, architecture, weights


def load_teacher(text: str, classes: list[str], student: ViTConfig, size: int | tuple[int, int] | None = None,
                 cached: bool = False) -> Teacher:
    """The teacher ``text`` names (``parse_source``), checked to classify the data's ``classes`` and to see the
    student's images (a ViT teacher at a size its patches divide, unless ``size`` says which to resize to);
    ``cached``: keep each image's outputs (training images the same every epoch)."""
    library, architecture, weights = parse_source(text)
    size = None if size is None else pair(size)
    if library is None:
        model, statistics, channels = _vitkit_teacher(weights, classes, student, size)
    else:
        model, statistics, channels = _cnn_teacher(library, architecture, Path(weights), len(classes), text)
    return Teacher(model, statistics, channels, student, size, cached, digest(model))


def _vitkit_teacher(path: str, classes: list[str], student: ViTConfig, size: tuple[int, int] | None
                    ) -> tuple[VisionTransformer, Any, int]:
    model = load(path)
    config = model.config
    if not config.num_classes:
        raise ConfigError(f"--distill-teacher {path}: a model without a classifier head (num_classes=0); "
                              f"expected a classifier of the data's {len(classes)} classes")
    named = config.provenance.classes
    if config.num_classes != len(classes) or (named is not None and list(named) != list(classes)):
        raise ConfigError(f"--distill-teacher {path}: classifies {config.num_classes} classes"
                          f"{' (' + ', '.join(named[:5]) + (' ...' if len(named) > 5 else '') + ')' if named else ''}; "
                          f"the data has {len(classes)} ({', '.join(classes[:5])}{' ...' if len(classes) > 5 else ''})")
    seen = size or student.image_size
    stride = config.effective_patch_size
    if seen[0] % stride or seen[1] % stride:
        raise ConfigError(f"--distill-teacher {path}: its patches of {stride} px do not divide the student's "
                          f"{seen[0]}x{seen[1]} images; give --distill-teacher-size HxW (a multiple of {stride}, e.g. "
                          f"its own {config.image_size[0]}x{config.image_size[1]}) to resize them for it")
    return model, config.input_statistics, config.in_chans


def _cnn_teacher(library: str, architecture: str, weights: Path, classes: int, text: str
                 ) -> tuple[nn.Module, Any, int]:
    """A timm or torchvision classifier of ``classes`` outputs with the weights of a local file (read without
    unpickling anything but tensors)."""
    try:
        if library == "timm":
            import timm
            model = timm.create_model(architecture, pretrained=False, num_classes=classes)
            statistics = (tuple(model.pretrained_cfg["mean"]), tuple(model.pretrained_cfg["std"]))
        else:
            import torchvision
            model = torchvision.models.get_model(architecture, weights=None, num_classes=classes)
            statistics = IMAGENET
    except (RuntimeError, ValueError, KeyError) as error:  # an unknown architecture
        raise ConfigError(f"--distill-teacher {text}: {library} has no classifier {architecture!r} ({error})") from None
    state = read_weights(weights)
    expected = model.state_dict()
    conflicts = [f"{key} {tuple(state[key].shape)} (model {tuple(expected[key].shape)})"
                 for key in expected if key in state and state[key].shape != expected[key].shape]
    missing = [key for key in expected if key not in state]
    if conflicts or missing or set(state) - set(expected):
        problem = f"shapes {', '.join(conflicts[:3])}" if conflicts else \
            f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(sorted(set(state) - set(expected))[:3])}"
        raise CheckpointError(f"--distill-teacher {text}: {weights} does not fit {library}'s {architecture} with "
                              f"{classes} classes: {problem}")
    model.load_state_dict(state)
    return model, statistics, 3


def digest(model: nn.Module) -> str:
    """A SHA-256 of a model's weights, in the order of its state dict."""
    hasher = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        hasher.update(name.encode())
        hasher.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


def record(run_dir: Path, text: str, teacher: Teacher, resume: bool) -> None:
    """Write which teacher the run learns from into ``run_dir/teacher.json``; a resumed run must learn from the
    same weights (a ConfigError naming both otherwise)."""
    path = run_dir / TEACHER_FILE
    if resume and path.is_file():
        saved = parse_json(read_text(path, "teacher record"))
        if saved.get("digest") != teacher.digest:
            raise ConfigError(f"--distill-teacher {text}: its weights are not those the run in {run_dir} learned from "
                              f"({saved.get('teacher')}, sha256 {str(saved.get('digest'))[:12]}...); resume with that "
                              f"teacher")
        return
    with atomic_file(path) as handle:
        json.dump({"teacher": text, "digest": teacher.digest}, handle, indent=1)
