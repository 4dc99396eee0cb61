"""One evaluation pass of a dense model (a segmentation or depth head) over a split, and its report: the model's
outputs brought to each target's own size (``models.dense.resized``), then mIoU and aAcc (``segmentation``) or
the depth metrics of Eigen et al. (``depth``) over the whole split; and a dense model's predictions for image
files, written as PNGs (class masks with colour overlays, depth maps)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.sources.segmentation import voc_colour
from ..models.dense import resized
from ..progress import track
from ..runtime import autocast
from .depth import DepthMeter
from .segmentation import SegmentationMeter, json_ready
from .slide import Slide, slide_for, slide_output

HEADLINE = {"segmentation": ("mIoU", "aAcc"), "depth": ("abs_rel", "rmse", "a1")}
"""The metrics of each dense task a run logs and sums up (all are in the report)."""
BEST = {"segmentation": "mIoU", "depth": "a1"}
"""The metric, higher being better, that picks a run's best checkpoint."""


@dataclass
class DenseEvaluation:
    """The metrics of one pass: ``mIoU``, ``aAcc`` and per-class ``IoU``/``Acc`` lists (segmentation), or the
    depth metrics with ``images`` (depth); fractions, unrounded, NaN where undefined."""

    task: str
    metrics: dict[str, Any]
    images: int
    views: dict[str, Any] = field(default_factory=dict)  # {"scales": [...], "flip": ...}, {"slide": {"crop": ...}}

    def summary(self, prefix: str) -> dict[str, float]:
        """The task's headline metrics as ``{prefix}/mIoU`` ..., as metrics.jsonl and summary.json hold them."""
        return {f"{prefix}/{name}": self.metrics[name] for name in HEADLINE[self.task]}


def eval_crop_mask(shape: torch.Size, crop: tuple[int, int, int, int] | None, device: torch.device
                   ) -> torch.Tensor | None:
    """The pixels a depth map is measured on: the (top, bottom, left, right) box of ``crop`` (NYU's Eigen crop),
    or all of them (None)."""
    if crop is None:
        return None
    top, bottom, left, right = crop
    mask = torch.zeros(shape, dtype=torch.bool, device=device)
    mask[..., top:bottom, left:right] = True
    return mask


def rescaled(batch: torch.Tensor, scale: float, multiple: int) -> torch.Tensor:
    """``batch`` resized by ``scale`` (bilinear, antialiased when shrinking), each side rounded to a multiple of
    ``multiple`` (the patch), at least one."""
    if scale == 1:
        return batch
    size = [max(multiple, round(side * scale / multiple) * multiple) for side in batch.shape[-2:]]
    return F.interpolate(batch, size=size, mode="bilinear", align_corners=False, antialias=scale < 1)


def view_outputs(model: nn.Module, images: torch.Tensor, device: torch.device, dtype: torch.dtype,
                 slide: Slide | None = None, windows_per_pass: int = 32) -> list[torch.Tensor]:
    """Each image's (K, h, w) output at the resolution the model gives: of the whole image, or with ``slide`` of
    windows sliding over it, brought to its size (``slide.slide_output``)."""
    if slide is not None:
        return [slide_output(model, image, slide, device, dtype, windows_per_pass) for image in images]
    with autocast(device, dtype):
        return list(model(images).float())


def dense_outputs(model: nn.Module, batch: torch.Tensor, sizes: list[torch.Size], task: str, device: torch.device,
                  dtype: torch.dtype, scales: Sequence[float] = (1.0,), flip: bool = False, slide: Slide | None = None,
                  windows_per_pass: int = 32) -> list[torch.Tensor]:
    """Each image's output resized to its target's size: the model's output, or with several views (``batch``
    resized by each of ``scales``, and mirrored with ``flip``) their average, of class probabilities (softmax) for
    segmentation as mmseg's test-time augmentation averages, of depth for depth. With ``slide`` each view is
    evaluated by sliding windows (``view_outputs``), and its sides are not rounded to the patch (the windows are
    the model's size)."""
    views = [(scale, mirrored) for scale in scales for mirrored in ((False, True) if flip else (False,))]
    patch = getattr(getattr(model, "config", None), "effective_patch_size", 1)  # the pixels a patch spans
    multiple = 1 if slide is not None else patch
    totals: list[torch.Tensor | None] = [None] * len(sizes)
    for scale, mirrored in views:
        images = rescaled(batch, scale, multiple)
        outputs = view_outputs(model, images.flip(-1) if mirrored else images, device, dtype, slide, windows_per_pass)
        for index, (output, size) in enumerate(zip(outputs, sizes)):
            output = resized((output.flip(-1) if mirrored else output)[None], size)[0]
            output = output.softmax(dim=0) if task == "segmentation" and len(views) > 1 else output
            totals[index] = output if totals[index] is None else totals[index] + output
    return [total / len(views) for total in totals]


@torch.no_grad()
def evaluate_dense(model: nn.Module, loader, task: str, num_classes: int, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32, ignore_index: int = 255, max_depth: float | None = None,
                   eval_crop: tuple[int, int, int, int] | None = None, scales: Sequence[float] = (1.0,),
                   flip: bool = False, slide: Slide | bool | int | tuple[int, int] | None = None,
                   windows_per_pass: int = 32) -> DenseEvaluation:
    """Run ``model`` (switched to eval mode, on ``device``) over ``(images, targets)`` batches, the targets a list
    of masks or depth maps at their own sizes; each output is resized to its target and measured there: the
    argmax class against the mask (pixels ``ignore_index`` left out), or depth against the map (pixels with
    depth up to ``max_depth``, within ``eval_crop``). ``scales`` and ``flip``: test-time augmentation
    (``dense_outputs``; DINOv2's "+ms" evaluation is scales 1, 1.32, 1.73, 2.28, 3 with flip). ``slide``: windows
    of the model's size slide over each image (``slide.slide_output``), stepping by the given pixels or, with
    True, 2/3 of the window (or a ``Slide``, window and steps given); the loader should then give the images at
    their aspect ratio, one a batch (``dense_transform(..., keep_ratio=True)``), and ``windows_per_pass`` windows
    go through the model at once."""
    device = torch.device(device)
    sliding = chosen_slide(model, slide)
    model.eval()
    meter = SegmentationMeter(num_classes, ignore_index) if task == "segmentation" else DepthMeter(max_depth=max_depth)
    images = 0
    for batch, targets in track(loader, "evaluate"):
        targets = [target.to(device) for target in targets]
        outputs = dense_outputs(model, batch.to(device, non_blocking=True), [target.shape[-2:] for target in targets],
                                task, device, dtype, scales, flip, sliding, windows_per_pass)
        for output, target in zip(outputs, targets):
            if task == "segmentation":
                meter.update(output.argmax(dim=0), target)
            else:
                meter.update(output[0], target, eval_crop_mask(target.shape, eval_crop, device))
            images += 1
    return DenseEvaluation(task, meter.compute(), images, views_record(scales, flip, sliding))


def chosen_slide(model: nn.Module, slide: Slide | bool | int | tuple[int, int] | None) -> Slide | None:
    """The window ``evaluate_dense``'s ``slide`` asks for: none (None, False), the one given (a ``Slide``), or the
    model's size stepping by the given pixels (True: 2/3 of it)."""
    if slide is None or slide is False:
        return None
    if isinstance(slide, Slide):
        return slide
    return slide_for(model.config.image_size, None if slide is True else slide)


def views_record(scales: Sequence[float], flip: bool, slide: Slide | None) -> dict[str, Any]:
    """How the outputs were computed, as the report records it: the scales and flip where there is test-time
    augmentation, the sliding window where there is one (nothing for the whole image stretched once)."""
    record: dict[str, Any] = {"scales": list(scales), "flip": flip} if tuple(scales) != (1.0,) or flip else {}
    return {**record, "slide": slide.record()} if slide is not None else record


def write_dense_report(evaluation: DenseEvaluation, classes: list[str], out_dir: str | Path | None,
                       split: str) -> dict:
    """``eval-<split>.json`` in ``out_dir`` (None: nowhere): the split, its images and the metrics, per-class
    IoU and accuracy keyed by class name (``null`` where a class is in neither the masks nor the predictions);
    returns the JSON content."""
    import json

    from ..atomic import atomic_file

    metrics = json_ready(evaluation.metrics)
    report: dict[str, Any] = {"split": split, "task": evaluation.task, "images": evaluation.images,
                              **evaluation.views}
    if evaluation.task == "segmentation":
        report.update({"mIoU": metrics["mIoU"], "aAcc": metrics["aAcc"],
                       "IoU": dict(zip(classes, metrics["IoU"])), "Acc": dict(zip(classes, metrics["Acc"]))})
    else:
        report.update({key: value for key, value in metrics.items() if key != "images"})
    if out_dir is not None:
        with atomic_file(Path(out_dir) / f"eval-{split}.json") as handle:
            json.dump(report, handle, indent=1)
    return report


OVERLAY_ALPHA = 0.5  # the share of the class colour in an overlay's pixel


def class_colours(count: int) -> np.ndarray:
    """(count, 3) uint8 colours of classes 0..count-1: PASCAL VOC's colour map (``data.sources.segmentation``), as
    VOC's masks and mmseg's drawings colour them."""
    return np.array([voc_colour(index) for index in range(count)], dtype=np.uint8)


@dataclass
class DensePrediction:
    """What ``predict_dense`` wrote for one image: its file, the PNGs, and what they show (each class's share of
    the pixels, most first; or the depth range in metres)."""

    path: Path
    written: dict[str, Path]
    shares: dict[str, float] | None = None
    depth_range: tuple[float, float] | None = None

    def record(self) -> dict[str, Any]:
        """The image's entry of ``vitkit predict --json``."""
        record: dict[str, Any] = {"image": str(self.path), **{key: str(path) for key, path in self.written.items()}}
        if self.shares is not None:
            record["classes"] = [{"label": label, "share": round(share, 6)} for label, share in self.shares.items()]
        if self.depth_range is not None:
            record["depth_range"] = [round(value, 4) for value in self.depth_range]
        return record


def output_names(paths: list[Path]) -> list[str]:
    """A distinct file stem per image: its own, numbered where two images share one."""
    seen: dict[str, int] = {}
    names = []
    for path in paths:
        count = seen.get(path.stem, 0)
        seen[path.stem] = count + 1
        names.append(path.stem if not count else f"{path.stem}-{count}")
    return names


def write_png(pixels: np.ndarray, path: Path, palette: np.ndarray | None = None) -> Path:
    """``pixels`` as a PNG at ``path``, written atomically: 8-bit grey or RGB, 16-bit grey (uint16), or with
    ``palette`` an indexed ('P') image whose values are class ids."""
    from PIL import Image

    from ..atomic import atomic_file

    if palette is not None:  # the values are indices as they are, not grey levels to convert
        image = Image.frombytes("P", (pixels.shape[1], pixels.shape[0]), np.ascontiguousarray(pixels).tobytes())
        image.putpalette(palette.reshape(-1).tolist())
    else:
        image = Image.fromarray(pixels)
    with atomic_file(path, "wb") as handle:
        image.save(handle, format="PNG")
    return path


@torch.no_grad()
def predict_dense(model: nn.Module, paths: list[Path], out: str | Path, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32, slide: bool | int | None = None) -> list[DensePrediction]:
    """Run a dense ``model`` on each image file (stretched to the model's size, or with ``slide`` resized at its
    aspect ratio and evaluated by sliding windows as ``evaluate_dense`` does; normalised as it was trained; the
    outputs brought back to the image's own size) and write into ``out``: for segmentation ``STEM-mask.png``
    (class ids in an indexed PNG with VOC's colours, read back by ``maskfolder:``; 16-bit grey beyond 256 classes)
    and ``STEM-overlay.png`` (the picture with the class colours laid over it); for depth ``STEM-depth.png``
    (16-bit millimetres, as NYU's) and ``STEM-depth-colour.png`` (near bright, far dark)."""
    from ..data.images import read_image
    from ..data.transforms import dense_transform

    device, out = torch.device(device), Path(out)
    config = model.config
    task = "depth" if config.dense_output == "depth" else "segmentation"
    sliding = chosen_slide(model, slide)
    preset = dense_transform(task, False, config.image_size, config.in_chans, config.provenance.normalization,
                             keep_ratio=sliding is not None)
    names = list(config.provenance.classes or [str(i) for i in range(config.num_classes)])
    colours = class_colours(max(len(names), 256))
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for path, stem in zip(paths, output_names(paths)):
        pixels = read_image(path)
        image, _ = preset.per_image(pixels, None)
        (output,) = view_outputs(model, preset.per_batch(image[None]).to(device), device, dtype, sliding)
        output = resized(output[None], pixels.shape[-2:])[0].cpu()
        picture = pixels.expand(3, -1, -1).permute(1, 2, 0).numpy().astype(np.float32)
        if task == "segmentation":
            classes = output.argmax(dim=0).numpy()
            counts = np.bincount(classes.reshape(-1), minlength=len(names)) / classes.size
            order = np.argsort(-counts, kind="stable")
            shares = {names[i]: float(counts[i]) for i in order if counts[i] > 0}
            overlay = (1 - OVERLAY_ALPHA) * picture + OVERLAY_ALPHA * colours[classes]
            mask = write_png(classes.astype(np.uint8), out / f"{stem}-mask.png", colours[:256]) if len(names) <= 256 \
                else write_png(classes.astype(np.uint16), out / f"{stem}-mask.png")  # more ids than a palette holds
            written = {"mask": mask,
                       "overlay": write_png(overlay.round().astype(np.uint8), out / f"{stem}-overlay.png")}
            results.append(DensePrediction(path, written, shares=shares))
        else:
            depth = output[0].numpy()
            millimetres = np.clip(np.rint(depth * 1000), 0, 65535).astype(np.uint16)
            low, high = float(depth.min()), float(depth.max())
            nearness = 1 - (depth - low) / max(high - low, 1e-6)
            shown = (colour_map(nearness) * 255).round().astype(np.uint8)
            written = {"depth": write_png(millimetres, out / f"{stem}-depth.png"),
                       "depth_colour": write_png(shown, out / f"{stem}-depth-colour.png")}
            results.append(DensePrediction(path, written, depth_range=(low, high)))
    return results


def colour_map(values: np.ndarray) -> np.ndarray:
    """(H, W, 3) colours in [0, 1] of ``values`` in [0, 1] by matplotlib's perceptually even 'magma' map."""
    import matplotlib

    return matplotlib.colormaps["magma"](values)[..., :3]
