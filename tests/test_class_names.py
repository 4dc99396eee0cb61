"""Class names round-trip unchanged through classes.txt, a saved checkpoint and a confusion plot, whatever they
hold: line breaks, control characters, backslashes, and bytes that are not UTF-8 (a folder named in Latin-1 is
listed with them as surrogate escapes)."""

import os

import matplotlib.axes
import pytest
import torch
from PIL import Image

import vitkit
from vitkit import ViTConfig, VisionTransformer
from vitkit.classnames import escape_name, unescape_name
from vitkit.data import load_dataset
from vitkit.data.convert import write_webdataset
from vitkit.evaluate import confusion_figure
from vitkit.models.config import Provenance

FOLDERS = ["a\nb", "\x07", os.fsdecode(b"caf\xe9"), "back\\slash", "日本"]  # as a folder lists them
NAMES = ["a\nb", "\x07", "caf\udce9", "back\\slash\\n", "日本", "tab\there", "\u2028", "plain"]


def test_escaped_names_are_one_printable_line_of_utf8():
    assert escape_name("a\nb") == "a\\nb" and escape_name("\x07") == "\\x07"  # hand-written
    assert escape_name("caf\udce9") == "caf\\udce9" and escape_name("back\\slash") == "back\\\\slash"
    assert escape_name("日本") == "日本"
    for name in NAMES:
        text = escape_name(name)
        assert text.isprintable() and "\n" not in text and text.encode("utf-8")
        assert unescape_name(text) == name


def test_names_round_trip_through_classes_txt_and_a_checkpoint(tmp_path):
    """Class folders with odd names (one not UTF-8) -> shards and their classes.txt -> a checkpoint -> back."""
    folder = tmp_path / "folder"
    for name in FOLDERS:
        (folder / name).mkdir(parents=True)
        Image.new("L", (4, 4)).save(folder / name / "x.png")
    listed = load_dataset(f"imagefolder:{folder}", "all").classes
    assert sorted(listed) == sorted(FOLDERS)
    write_webdataset({"train": load_dataset(f"imagefolder:{folder}", "all")}, tmp_path / "shards", 10**6)
    read = load_dataset(f"webdataset:{tmp_path / 'shards'}", "train").classes
    assert read == listed
    config = ViTConfig(image_size=8, patch_size=4, dim=8, depth=1, num_heads=1, mlp_dim=8, in_chans=1,
                       num_classes=len(read), provenance=Provenance(classes=tuple(read)))
    VisionTransformer(config).save(tmp_path / "model")
    assert list(vitkit.load(tmp_path / "model").config.provenance.classes) == listed


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")  # CJK: drawn as boxes, not a failure
def test_names_are_drawn_escaped_in_a_confusion_plot(tmp_path, monkeypatch):
    drawn = []
    original = matplotlib.axes.Axes.set_xticks

    def spy(self, ticks, labels=None, **kwargs):
        drawn.append(list(labels))
        return original(self, ticks, labels, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_xticks", spy)
    confusion_figure(torch.eye(len(NAMES), dtype=torch.long), NAMES, tmp_path / "c.png", "test")
    assert (tmp_path / "c.png").stat().st_size > 0
    assert [unescape_name(text) for text in drawn[0]] == NAMES and all(text.isprintable() for text in drawn[0])


@pytest.mark.parametrize("text", ["a\\", "a\\q", "\\x4", "\\u12"])
def test_text_that_is_no_escape_reads_as_written(text):
    """A class list written by other tools may hold backslashes that start no escape: they are kept."""
    assert unescape_name(text) == text
