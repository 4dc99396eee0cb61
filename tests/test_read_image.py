"""The one image decoder (vitkit.data.read_image), against values computed by hand with numpy: images are
decoded as they are meant to be seen, never clipped or silently mangled."""

import numpy as np
import pytest
from PIL import Image, ImageOps

from vitkit.analysis.inputs import read_images
from vitkit.data import DatasetError, read_image


def decoded(path) -> np.ndarray:
    return read_image(path).numpy()


def test_16_bit_grey_is_scaled_not_clipped(tmp_path):
    ramp = np.linspace(0, 65535, 64 * 64).round().astype(np.uint16).reshape(64, 64)
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    pixels = decoded(tmp_path / "deep.png")
    assert pixels.shape == (1, 64, 64)
    np.testing.assert_array_equal(pixels[0], np.rint(ramp / 257.0).astype(np.uint8))
    assert abs(pixels.mean() - 127.5) < 0.5  # clipped at 255 it would be about 251
    assert np.array_equal(read_images([tmp_path / "deep.png"])[0], pixels[0])  # analyze decodes the same way


def test_exif_orientation_is_applied(tmp_path):
    stored = np.arange(2 * 3, dtype=np.uint8).reshape(2, 3) * 40
    for orientation, shown in ((6, np.rot90(stored, k=-1)), (8, np.rot90(stored, k=1)), (3, stored[::-1, ::-1]),
                               (2, stored[:, ::-1])):
        image = Image.fromarray(stored)
        exif = image.getexif()
        exif[0x0112] = orientation
        image.save(tmp_path / f"o{orientation}.png", exif=exif)
        np.testing.assert_array_equal(decoded(tmp_path / f"o{orientation}.png")[0], shown)


def test_alpha_is_composited_over_white(tmp_path):
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., :3] = (200, 100, 50)
    rgba[..., 3] = [[255, 0], [128, 64]]
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    alpha = rgba[..., 3:] / 255
    expected = rgba[..., :3].astype(float) * alpha + 255 * (1 - alpha)
    np.testing.assert_allclose(decoded(tmp_path / "a.png").transpose(1, 2, 0), expected, atol=1)

    grey = np.array([[[90, 255], [90, 0], [90, 128]]], np.uint8)  # one row of (L, A) pairs
    Image.fromarray(grey, "LA").save(tmp_path / "la.png")
    pixels = decoded(tmp_path / "la.png")
    assert pixels.shape == (1, 1, 3)  # grey with alpha stays grey
    alpha = grey[0, :, 1].astype(float) / 255
    np.testing.assert_allclose(pixels[0, 0], 90 * alpha + 255 * (1 - alpha), atol=1)


def test_palette_with_transparency_and_cmyk_and_bilevel(tmp_path):
    palette = Image.new("P", (2, 1))
    palette.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    palette.putpixel((0, 0), 0)
    palette.putpixel((1, 0), 1)
    palette.save(tmp_path / "p.png", transparency=1)  # index 1 (green) is transparent
    np.testing.assert_array_equal(decoded(tmp_path / "p.png")[:, 0, :].T, [[255, 0, 0], [255, 255, 255]])

    cmyk = Image.new("CMYK", (2, 1))
    cmyk.putpixel((0, 0), (0, 0, 0, 0))  # no ink: white
    cmyk.putpixel((1, 0), (255, 0, 0, 0))  # full cyan: no red
    cmyk.save(tmp_path / "c.jpg", quality=100)
    np.testing.assert_allclose(decoded(tmp_path / "c.jpg")[:, 0, :].T, [[255, 255, 255], [0, 255, 255]], atol=3)

    bits = Image.new("1", (3, 1))
    bits.putpixel((1, 0), 1)
    bits.save(tmp_path / "b.png")
    np.testing.assert_array_equal(decoded(tmp_path / "b.png"), [[[0, 255, 0]]])


def test_images_beyond_the_pixel_limit_are_refused_before_decoding(tmp_path, monkeypatch):
    Image.new("L", (40, 30)).save(tmp_path / "big.png")
    monkeypatch.setattr("vitkit.data.images.MAX_PIXELS", 1000)
    with pytest.raises(DatasetError, match=r"^\S*big.png: refusing to decode a 40x30 image \(1,200 pixels"):
        read_image(tmp_path / "big.png")


def test_palette_rgba_16_bit_and_exif_rotated_jpeg_decode_as_pil_shows_them(tmp_path):
    rng = np.random.default_rng(0)
    colours = Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    colours.quantize(6).save(tmp_path / "palette.png")
    np.testing.assert_array_equal(decoded(tmp_path / "palette.png").transpose(1, 2, 0),
                                  np.asarray(Image.open(tmp_path / "palette.png").convert("RGB")))

    rgba = Image.fromarray(rng.integers(0, 256, (5, 7, 4), dtype=np.uint8), "RGBA")
    rgba.save(tmp_path / "rgba.png")
    on_white = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
    np.testing.assert_array_equal(decoded(tmp_path / "rgba.png").transpose(1, 2, 0), np.asarray(on_white))

    Image.fromarray(rng.integers(0, 65536, (5, 7), dtype=np.uint16)).save(tmp_path / "deep.png")
    with Image.open(tmp_path / "deep.png") as deep:
        assert deep.mode.startswith("I")  # PIL reads it as 16-bit integers
        np.testing.assert_array_equal(decoded(tmp_path / "deep.png")[0], np.rint(np.asarray(deep) / 257))

    photo = Image.fromarray(rng.integers(0, 256, (6, 10, 3), dtype=np.uint8))
    exif = photo.getexif()
    exif[0x0112] = 6  # the camera was turned: show the stored pixels rotated 90 degrees clockwise
    photo.save(tmp_path / "turned.jpg", exif=exif, quality=95)
    with Image.open(tmp_path / "turned.jpg") as stored:
        shown = np.asarray(ImageOps.exif_transpose(stored).convert("RGB"))
        np.testing.assert_array_equal(shown, np.rot90(np.asarray(stored), k=-1))
    assert decoded(tmp_path / "turned.jpg").shape == (3, 10, 6)
    np.testing.assert_array_equal(decoded(tmp_path / "turned.jpg").transpose(1, 2, 0), shown)


def test_errors_name_the_image_as_the_caller_names_it(tmp_path):
    import io

    with pytest.raises(DatasetError, match=r"^shard-3.tar: sample 0007: not a readable image"):
        read_image(io.BytesIO(b"not an image"), "shard-3.tar: sample 0007")
