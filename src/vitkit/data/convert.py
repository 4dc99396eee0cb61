"""Write any dataset vitkit reads as WebDataset shards (``vitkit data convert SRC DST --to webdataset``):
``DST/{train,val,test}-NNNNNN.tar`` of ``KEY.EXT`` + ``KEY.cls``, and ``DST/classes.txt``. A dense dataset's
samples hold ``KEY.mask.png`` (class ids as grey levels, 255 ignored) or ``KEY.depth.png`` (16-bit millimetres)
instead of ``KEY.cls``: its targets as read, whatever its own layout stored (palettes, colour maps, other ids). A
depth cap or evaluation crop of the source is not written: give ``--max-depth`` when training on the shards.

Files keep their encoded bytes (a JPEG stays the same JPEG); images held in memory or read from other
shards are written as PNG, losslessly. The shards are written into a hidden sibling folder that is
renamed to ``DST`` once every file is on disk (``atomic.atomic_directory``), so an interrupted conversion
leaves no half-written dataset behind; an existing ``DST`` is never touched, and the hidden folder a killed
conversion left is removed by the next one.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from webdataset import ShardWriter

from ..atomic import atomic_directory, sweep
from ..classnames import format_class_list
from ..errors import ConfigError, DatasetError
from ..paths import open_regular
from ..progress import track
from .datasets import every_split
from .dense import DEPTH, DEPTH_SCALE, IGNORE_INDEX, SEGMENTATION, TARGET_KEYS, task_of
from .images import read_image
from .shards import ShardedSplit
from .sources.webdataset import IMAGE_EXTENSIONS
from .splits import ALL, SPLITS

SIZE_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """``256MB``, ``1.5GB``, ``64MiB`` or a byte count."""
    number = text.strip().upper().rstrip("S")
    unit = next((u for u in sorted(SIZE_UNITS, key=len, reverse=True) if u and number.endswith(u)), "")
    try:
        value = float(number[:len(number) - len(unit)]) * SIZE_UNITS[unit]
    except ValueError:
        raise ConfigError(f"shard size {text!r}: expected a size such as 256MB, 1GB or 64MiB") from None
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"shard size {text!r}: expected a positive, finite size")
    return int(value)


def png_bytes(image: torch.Tensor) -> bytes:
    array = image.permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(buffer, format="PNG")
    return buffer.getvalue()


def target_png(task: str, target: torch.Tensor) -> bytes:
    """A mask of class ids as an 8-bit grey PNG, or a depth map in metres as a 16-bit PNG of millimetres."""
    values = target.numpy()
    if task == DEPTH:
        values = np.clip(np.round(values * DEPTH_SCALE), 0, 2**16 - 1).astype(np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(values.astype(np.uint8) if task != DEPTH else values).save(buffer, format="PNG")
    return buffer.getvalue()


def target_members(task: str, label) -> dict[str, bytes | str]:
    """The members a sample's target is written as: ``cls``, or ``mask.png`` / ``depth.png``."""
    if task == "classification":
        return {"cls": str(label)}
    return {f"{TARGET_KEYS[task]}.png": target_png(task, label.as_subclass(torch.Tensor))}


def encoded_samples(dataset) -> Iterator[tuple[str, bytes, object]]:
    """(extension, encoded image, label or dense target) of every sample, in the dataset's order."""
    if isinstance(dataset, ShardedSplit):
        for shard in dataset.shards:
            for key, payload in dataset.raw(shard):
                image, label = dataset.decode(shard, key, payload)
                yield "png", png_bytes(image), label
        return
    dense = task_of(dataset) != "classification"
    for index in range(len(dataset)):
        if hasattr(dataset, "path"):  # a listed file: keep its bytes when shards may hold its format
            path = dataset.path(index)
            extension = path.suffix.lower().lstrip(".")
            if extension in IMAGE_EXTENSIONS:
                with open_regular(path) as handle:
                    data = handle.read()
                if dense:  # decoded with its target: an unreadable or mismatched pair stops the conversion
                    yield extension, data, dataset[index][1]
                    continue
                read_image(io.BytesIO(data), str(path))  # decoded: an unreadable file stops the conversion
                yield extension, data, int(dataset.labels[index])
                continue
        image, label = dataset[index]
        yield "png", png_bytes(image), label


def write_webdataset(splits: dict[str, object], destination: str | Path, shard_size: int) -> dict[str, int]:
    """Write ``splits`` (name -> dataset) as shards of about ``shard_size`` bytes of images and labels (a new
    shard starts once it is reached; tar headers add about 1 kB a file); returns the samples per split."""
    destination = Path(destination)
    if destination.exists():
        raise FileExistsError(f"{destination} exists; choose a new folder for the shards")
    sweep(destination.parent, only=destination.name)  # the staging folder of a conversion killed mid-way
    first = next(iter(splits.values()), None)
    written, classes, task = {}, None, task_of(first)
    if task == SEGMENTATION and len(first.classes) > IGNORE_INDEX:
        raise DatasetError(f"masks of {len(first.classes)} classes cannot be written as 8-bit PNGs; expected at "
                           f"most {IGNORE_INDEX} classes (value {IGNORE_INDEX} means ignore)")
    started = int(time.time())  # whole seconds: a fractional time costs every member an extra (pax) header to read
    with atomic_directory(destination, allowed_existing=()) as staging:
        for split, dataset in splits.items():
            classes = classes or dataset.classes
            if dataset.classes != classes:
                raise DatasetError(f"{split} split has classes {dataset.classes[:5]}..., the others {classes[:5]}...")
            count = 0
            with ShardWriter(str(staging / f"{split}-%06d.tar"), maxsize=shard_size, maxcount=10**9, verbose=0,
                             mtime=started) as sink:
                samples = track(encoded_samples(dataset), f"convert {split}", len(dataset), unit="image")
                for count, (extension, data, label) in enumerate(samples, start=1):
                    sink.write({"__key__": f"{split}{count - 1:09d}", extension: data, **target_members(task, label)})
            written[split] = count
        if classes:  # a depth dataset has none
            (staging / "classes.txt").write_text(format_class_list(classes), encoding="utf-8")
    return written


def convert_dataset(dataset: str, destination: str | Path, shard_size: str | int = "256MB",
                    data_dir: str | Path | None = None, val_fraction: float = 0.1) -> dict[str, int]:
    """Write every split of ``dataset`` (``datasets.every_split``) as WebDataset shards in the new folder
    ``destination``, a shard about ``shard_size`` bytes (a number, or text such as ``256MB``, ``1GB``); returns
    the samples per split."""
    size = parse_size(shard_size) if isinstance(shard_size, str) else shard_size
    splits = every_split(dataset, data_dir, val_fraction)  # the suite's unions (trainval, ...) are not written twice
    return write_webdataset({split: data for split, data in splits.items() if split in (*SPLITS, ALL)}, destination,
                            size)
