"""Images to analyse: given files, a sample of a dataset, or the two photos scikit-learn ships; and
their preparation for a model by the checkpoint's evaluation transform, as every command prepares them."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data import default_split, load_dataset, read_image
from ..data.transforms import Preset
from ..errors import DatasetError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


@dataclass(frozen=True)
class Sample:
    """What an analysed image is, for the figures and the page: its file or dataset index, its label if known."""

    name: str
    label: str | None = None


def gather(images: Sequence[str | Path] | None, dataset: str | None, data_dir: str | Path | None, count: int,
           seed: int, classes: Sequence[str] | None) -> tuple[list[np.ndarray], list[Sample]]:
    """The images ``vitkit analyze`` is given (files, folders or globs: ``image_files``), or a sample of
    ``dataset``, or else the sample photos; with what each is (a file under a folder named like one of the
    model's ``classes`` is labelled with it)."""
    if dataset:
        return dataset_sample(dataset, data_dir, count, seed)
    if images:
        files = image_files(images)
        known = set(classes or ())
        return read_images(files), [Sample(str(file), file.parent.name if file.parent.name in known else None)
                                    for file in files]
    return sample_photos(), [Sample(name) for name in SAMPLE_PHOTOS]


SAMPLE_PHOTOS = ("china.jpg", "flower.jpg")  # scikit-learn's file names, in its order


def sample_photos() -> list[np.ndarray]:
    """scikit-learn's two sample photos (``SAMPLE_PHOTOS``: a Chinese temple, a flower), 427x640 RGB."""
    try:
        from sklearn.datasets import load_sample_images
    except ImportError as error:
        raise ImportError("the default images are scikit-learn's sample photos: pip install 'vitkit[analysis]' "
                          "(or scikit-learn), or pass image files") from error
    return list(load_sample_images().images)


def image_files(paths: Sequence[str | Path]) -> list[Path]:
    """The image files ``paths`` name: files as given, every image file below a directory (sorted), and the
    matches of a glob pattern (``'photos/*.jpg'``, ``'data/**/*.png'``; sorted) that the shell left unexpanded."""
    files: list[Path] = []
    for text in map(str, paths):
        path = Path(text)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.exists():
            files.append(path)
        elif glob.has_magic(text):
            matches = sorted(Path(match) for match in glob.glob(text, recursive=True) if Path(match).is_file())
            if not matches:
                raise FileNotFoundError(f"no file matches {text}")
            files += matches
        else:
            raise FileNotFoundError(f"no image file or directory at {path}")
    if not files:
        raise FileNotFoundError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) in {', '.join(map(str, paths))}")
    return files


def read_images(paths: Sequence[str | Path]) -> list[np.ndarray]:
    """The images of ``image_files(paths)``, as uint8 arrays (H, W) or (H, W, C), decoded as datasets decode
    them (``vitkit.data.read_image``)."""
    return [read_image(file).permute(1, 2, 0).squeeze(-1).numpy() for file in image_files(paths)]


def dataset_sample(name: str, data_dir: str | Path | None, count: int, seed: int = 0
                   ) -> tuple[list[np.ndarray], list[Sample]]:
    """``count`` images drawn at random (seeded) from the evaluation split (test, else val, else all) of any
    dataset ``vitkit.data`` reads (``mnist``, ``npz:PATH``, ``imagefolder:PATH``, ...), as uint8 arrays (H, W) or
    (H, W, C), each with its index in that split (``mnist[test] #17``) and its class name."""
    split = default_split(name)
    data = load_dataset(name, split, data_dir)
    chosen = np.random.default_rng(seed).choice(len(data), size=min(count, len(data)), replace=False)
    pictures, samples = [], []
    for index in map(int, np.sort(chosen)):
        image, label = data[index]
        pictures.append(image.permute(1, 2, 0).squeeze(-1).numpy())
        samples.append(Sample(f"{name}[{split}] #{index}", data.classes[label]))
    return pictures, samples


def prepare(images: Sequence[np.ndarray], transform: Preset
            ) -> tuple[torch.Tensor | list[torch.Tensor], list[np.ndarray]]:
    """The model's input (B, C, H, W) made by ``transform`` (``vitkit.evaluate.preprocessing``), and the
    pictures it saw before normalisation, as uint8 arrays (for overlays). Where the transform keeps each image's
    aspect ratio (NaFlex) and sizes differ, a list of (1, C, H, W) inputs, each at its own size."""
    if not len(images):
        raise DatasetError("no images to analyse")
    pictures = [torch.from_numpy(np.array(image)) for image in images]
    seen = [transform.per_image(p.unsqueeze(0) if p.ndim == 2 else p.permute(2, 0, 1)) for p in pictures]
    shown = [picture.permute(1, 2, 0).squeeze(-1).numpy().copy() for picture in seen]
    if all(picture.shape == seen[0].shape for picture in seen):
        return transform.per_batch(torch.stack(seen)), shown
    return [transform.per_batch(picture[None]) for picture in seen], shown
