"""The one image decoder of vitkit: every source, ``predict`` and ``analyze`` read an image file or encoded bytes
through ``read_image``, so an image looks the same (orientation, bit depth, transparency) wherever it is read."""

from __future__ import annotations

import contextlib
from pathlib import Path
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.transforms.v2.functional import pil_to_tensor

from ..errors import DatasetError
from ..paths import open_regular

# Larger images are refused before they are decoded (Pillow's own limit: a 3-byte-per-pixel image of
# this size takes 256 MiB, and a few hundred bytes of PNG can claim it).
MAX_PIXELS = Image.MAX_IMAGE_PIXELS


def read_image(source: str | Path | BinaryIO, name: str | None = None, orient: bool = True) -> torch.Tensor:
    """Decode an image fully (a truncated file fails here) as uint8 (C, H, W), the way it is meant to be
    seen: EXIF orientation applied, 16-bit and float grey scaled (not clipped) to 0..255, palette, CMYK and
    other modes converted to RGB, grey kept as 1 channel (the model decides channels: ``ToChannels``).
    Transparency is composited over white, as a page shows it and as HF's image processors do: the colour
    under a transparent pixel is undefined (often black), so dropping alpha would show that instead.
    Errors name the image ``name`` (default: the path). Without ``orient`` the pixels stay as stored, EXIF
    orientation ignored: as a mask drawn on them (which has none) lies."""
    with decoded(source, name) as image:
        return pil_to_tensor(_eight_bit(ImageOps.exif_transpose(image) if orient else image))


@contextlib.contextmanager
def decoded(source: str | Path | BinaryIO, name: str | None = None, what: str = "image") -> Iterator[Image.Image]:
    """The image file or bytes ``source`` opened and fully decoded by Pillow, as it is stored (a path opened as a
    regular file only: a FIFO or a device in its place is refused, never waited on). An image larger than
    ``MAX_PIXELS`` is refused before it is decoded, and every failure, in decoding or in the body, is a
    DatasetError naming ``name`` (default: the path) as the ``what`` it should have been."""
    name = name or str(source)
    try:
        with open_regular(source) if isinstance(source, str | Path) else contextlib.nullcontext(source) as handle, \
                Image.open(handle) as image:
            if image.width * image.height > MAX_PIXELS:
                raise DatasetError(f"{name}: refusing to decode a {image.width}x{image.height} {what} "
                                   f"({image.width * image.height:,} pixels, more than {MAX_PIXELS:,}): "
                                   f"a decompression bomb, or an image to downscale first")
            image.load()
            yield image
    except DatasetError:
        raise
    except Image.DecompressionBombError as error:
        raise DatasetError(f"{name}: refusing to decode a decompression bomb ({error})") from error
    except (OSError, ValueError, SyntaxError) as error:
        raise DatasetError(f"{name}: not a readable {what} ({error})") from error


def _eight_bit(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit grey ("L") or RGB."""
    if image.mode in ("L", "RGB"):
        return image
    if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit integer or float grey
        pixels = np.asarray(image, dtype=np.float64)
        scale = 255 / 65535 if image.mode.startswith("I") else 255.0  # integers: 16 bits; floats: 0..1
        return Image.fromarray(np.clip(np.rint(pixels * scale), 0, 255).astype(np.uint8), "L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("1", "L"):
        return image.convert("L")
    if image.mode in ("LA", "La", "PA", "RGBA", "RGBa"):
        grey = image.mode in ("LA", "La")
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image).convert("RGB")
        return image.convert("L") if grey else image
    return image.convert("RGB")
