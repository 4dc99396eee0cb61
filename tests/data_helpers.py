"""Small datasets on disk for the data tests: real MNIST images as a folder, and tar shards of
numbered synthetic images (each image's pixels spell its number, so a sample can be told by its pixels)."""

import io
from pathlib import Path

import numpy as np
import torchvision
import webdataset as wds
from PIL import Image


def mnist_folder(shared_data: Path, root: Path, train: int, test: int, fmt: str = "png") -> Path:
    """The first ``train`` / ``test`` images of real MNIST as ``root/{train,test}/<digit>/NNNNN.fmt``."""
    for split, count in (("train", train), ("test", test)):
        mnist = torchvision.datasets.MNIST(shared_data, train=split == "train", download=False)
        for index in range(count):
            image, label = mnist[index]
            folder = root / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{index:05d}.{fmt}")
    return root


def numbered_image(number: int) -> np.ndarray:
    """A 4x4 RGB image whose first two pixels hold ``number`` (high byte, low byte)."""
    pixels = np.zeros((4, 4, 3), np.uint8)
    pixels[0, 0], pixels[0, 1] = number // 256, number % 256
    return pixels


def number_of(image) -> int:
    return int(image[0, 0, 0]) * 256 + int(image[0, 1, 0])


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def numbered_shards(root: Path, split: str, sizes: list[int], classes: int = 4, start: int = 0) -> list[int]:
    """``root/{split}-NNNNNN.tar`` shards of the given sizes; sample ``n`` has label ``n % classes``."""
    root.mkdir(parents=True, exist_ok=True)
    numbers = []
    for shard, size in enumerate(sizes):
        with wds.TarWriter(str(root / f"{split}-{shard:06d}.tar")) as sink:
            for _ in range(size):
                number = start + len(numbers)
                sink.write({"__key__": f"{split}{number:06d}", "png": png(numbered_image(number)),
                            "cls": str(number % classes)})
                numbers.append(number)
    return numbers
