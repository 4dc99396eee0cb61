"""A dense task made from digits at hand, since no segmentation or depth data can be downloaded here: digits pasted at
random places and scales on dark canvases of varied sizes, written as a ``maskfolder:`` segmentation set and a
``depthfolder:`` depth set of the same pictures.

Each pixel of a mask is its digit's class (1-10 for the digits 0-9) where the digit's stroke is bright (>= 128),
background (0) where the canvas is black, and ignored (255) on the stroke's soft edge. Depth stands in for
distance: a digit pasted at scale s is 2 / s metres away (larger is nearer), the background 8 m; edge pixels have
no depth (0). Depth maps are 16-bit PNGs in millimetres, as NYU's are.

    python benchmarks/dense_digits.py OUT --source mnist --data-dir ../shared/data --train 2000 --val 400
    python benchmarks/dense_digits.py OUT --source digits --train 200 --val 50 --canvas 32 48 --scale 1.5 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

BACKGROUND_DEPTH = 8.0  # metres
CLASSES = ["background", *(f"digit {d}" for d in range(10))]
STROKE, EDGE = 128, 1  # a pixel at least this bright is the digit's, a dimmer non-black one ignored


def source_digits(source: str, data_dir: str | None, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, H, W) uint8 digits and their labels: MNIST's 28 px ones (``data_dir`` holds torchvision's MNIST) or
    vitkit's embedded 8 px ones."""
    if source == "mnist":
        import torchvision

        data = torchvision.datasets.MNIST(data_dir, train=split == "train", download=False)
        return data.data.numpy(), data.targets.numpy()
    from vitkit.data import load_dataset

    data = load_dataset("digits", "train" if split == "train" else "test")
    return data.images[:, 0].numpy(), data.labels.numpy()


def paste(rng: np.random.Generator, digits: np.ndarray, labels: np.ndarray, canvas: tuple[int, int],
          scale: tuple[float, float], count: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One canvas: its pixels (H, W) uint8, mask (H, W) uint8 and depth (H, W) uint16 millimetres."""
    height, width = (int(rng.integers(canvas[0], canvas[1] + 1)) for _ in range(2))
    image = np.zeros((height, width), np.uint8)
    mask = np.zeros((height, width), np.uint8)
    depth = np.full((height, width), BACKGROUND_DEPTH, np.float64)
    for _ in range(int(rng.integers(count[0], count[1] + 1))):
        index = int(rng.integers(len(digits)))
        s = float(rng.uniform(*scale))
        side = max(2, round(digits.shape[1] * s))
        if side > min(height, width):
            continue
        digit = np.asarray(Image.fromarray(digits[index]).resize((side, side), Image.BILINEAR))
        top, left = int(rng.integers(height - side + 1)), int(rng.integers(width - side + 1))
        region = (slice(top, top + side), slice(left, left + side))
        stroke, edge = digit >= STROKE, (digit >= EDGE) & (digit < STROKE)
        image[region] = np.maximum(image[region], digit)
        mask[region][stroke] = labels[index] + 1
        mask[region][edge & (mask[region] == 0)] = 255
        depth[region][stroke] = 2.0 / s
    depth_mm = np.where(mask == 255, 0, np.rint(depth * 1000)).astype(np.uint16)
    return image, mask, depth_mm


def write(out: Path, source: str, data_dir: str | None, sizes: dict[str, int], canvas: tuple[int, int],
          scale: tuple[float, float], count: tuple[int, int], seed: int = 0) -> None:
    """``out/segmentation`` (maskfolder) and ``out/depth`` (depthfolder), ``sizes[split]`` canvases per split, the
    validation canvases made of the source's test digits."""
    rng = np.random.default_rng(seed)
    (out / "segmentation").mkdir(parents=True, exist_ok=True)
    (out / "segmentation" / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    for split, size in sizes.items():
        digits, labels = source_digits(source, data_dir, "train" if split == "train" else "test")
        folders = [out / task / split / name for task, name in (("segmentation", "images"), ("segmentation", "masks"),
                                                                ("depth", "images"), ("depth", "depth"))]
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        for number in range(size):
            image, mask, depth = paste(rng, digits, labels, canvas, scale, count)
            for folder, pixels in zip(folders, (image, mask, image, depth)):
                Image.fromarray(pixels).save(folder / f"{number:05d}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", choices=("mnist", "digits"), default="mnist")
    parser.add_argument("--data-dir", help="the folder holding torchvision's MNIST (--source mnist)")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--val", type=int, default=400)
    parser.add_argument("--canvas", type=int, nargs=2, default=(64, 96), help="smallest and largest side, px")
    parser.add_argument("--scale", type=float, nargs=2, default=(0.8, 2.0), help="digit scales pasted")
    parser.add_argument("--digits", type=int, nargs=2, default=(1, 3), help="fewest and most digits a canvas")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out, args.source, args.data_dir, {"train": args.train, "val": args.val}, tuple(args.canvas),
          tuple(args.scale), tuple(args.digits), args.seed)
    print(f"wrote maskfolder:{args.out / 'segmentation'} and depthfolder:{args.out / 'depth'}")


if __name__ == "__main__":
    main()
