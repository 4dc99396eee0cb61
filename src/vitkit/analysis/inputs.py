"""Images to analyse: given files, a sample of a dataset, or the two photos scikit-learn ships; and
their preparation for a model by the checkpoint's evaluation transform, as every command prepares them."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..data import load_dataset, read_image
from ..data.transforms import Preset
from ..errors import DatasetError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


def sample_photos() -> list[np.ndarray]:
    """scikit-learn's two sample photos (a Chinese temple, a flower), 427x640 RGB."""
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


def dataset_sample(name: str, data_dir: str | Path | None, count: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` test images drawn at random (seeded) from any dataset ``vitkit.data`` reads (``mnist``,
    ``npz:PATH``, ``imagefolder:PATH``, ...), as uint8 arrays (H, W) or (H, W, C)."""
    data = load_dataset(name, "test", data_dir)
    chosen = np.random.default_rng(seed).choice(len(data), size=min(count, len(data)), replace=False)
    return [data[int(index)][0].permute(1, 2, 0).squeeze(-1).numpy() for index in np.sort(chosen)]


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
