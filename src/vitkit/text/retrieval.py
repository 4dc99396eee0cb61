"""Image-text retrieval with an image-text model: a captions file (``image path<TAB>caption`` a line, an image
named on as many lines as it has captions) embedded by both towers, every image ranked against every caption and
every caption against every image by cosine, and the recall at 1, 5 and 10 reported both ways.

Recall@K of a query is 1 when one of its right answers is among the K best, ties counted against the model: a
query is a hit at K when fewer than K wrong candidates score at least as high as its best right one (a caption
that two images share scores the same against either, so neither image finds it first on its own). Identical
captions are embedded once, as are the lines that name one image file, so equal texts tie exactly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..atomic import atomic_file
from ..errors import ConfigError, DatasetError
from ..paths import read_text, reason, resolved, within
from ..runtime import autocast
from .clip import ImageTextModel
from .zeroshot import encode_files, encode_texts

RECALL_AT = (1, 5, 10)


class CaptionsFileError(ConfigError, DatasetError):
    """A captions file that is not ``image path<TAB>caption`` lines naming images beside it (the user mends it)."""


@dataclass(frozen=True)
class Captions:
    """A captions file read: the distinct image files (resolved, in the order first named), each caption with
    the index of its image, and the line each image was first named on (for messages)."""

    path: Path
    images: list[Path]
    captions: list[str]
    image_of: list[int]  # per caption, the index of its image in ``images``
    first_line: list[int]  # per image, the line of the file that first named it


def read_captions(path: str | Path) -> Captions:
    """The captions file ``path``: UTF-8, one ``image path<TAB>caption`` a line (split at the first tab, the
    caption kept verbatim), the image path relative to the file's folder and never leading outside it. An empty
    file, a blank line, a line without a tab, an empty path or caption, or an image that is not there is a
    ``CaptionsFileError`` naming the file and the line."""
    path = Path(path)
    try:
        lines = read_text(path, "captions file").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise CaptionsFileError(f"{path}: {reason(error)}; expected a captions file, image path<TAB>caption a line") \
            from None
    if not lines:
        raise CaptionsFileError(f"{path}: an empty file; expected image path<TAB>caption a line")
    root = resolved(path.parent)
    index: dict[Path, int] = {}
    images, first_line, captions, image_of = [], [], [], []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        name, tab, caption = line.partition("\t")
        if not tab:
            raise CaptionsFileError(f"{where}: no tab; expected image path<TAB>caption")
        if not name.strip() or not caption.strip():
            raise CaptionsFileError(f"{where}: an empty {'image path' if not name.strip() else 'caption'}; expected "
                               f"image path<TAB>caption")
        try:
            file = within(root, name, CaptionsFileError, "the image path")
        except CaptionsFileError as error:
            raise CaptionsFileError(f"{where}: {error}") from None
        if not file.is_file():
            raise CaptionsFileError(f"{where}: no such image {name} (in {root})")
        if file not in index:
            index[file] = len(images)
            images.append(file)
            first_line.append(number)
        captions.append(caption)
        image_of.append(index[file])
    return Captions(path, images, captions, image_of, first_line)


def recall(scores: torch.Tensor, right: torch.Tensor, ks: Sequence[int] = RECALL_AT) -> dict[str, float]:
    """The recall at each of ``ks`` of the queries (rows) of ``scores`` (Q, C) whose right candidates ``right``
    (Q, C, boolean) marks, each row with at least one: a row is a hit at K when fewer than K wrong candidates score
    at least as high as its best right one."""
    best = scores.masked_fill(~right, -torch.inf).max(dim=1).values
    ahead = ((scores >= best[:, None]) & ~right).sum(dim=1)
    return {f"recall@{k}": (ahead < k).double().mean().item() for k in ks}


@torch.no_grad()
def evaluate_retrieval(model: ImageTextModel, captions: str | Path, batch_size: int = 64, resize: str = "crop",
                       out: str | Path | None = None, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32) -> dict:
    """Image->text and text->image recall@1/5/10 of ``model`` (already on ``device``) on the captions file
    ``captions`` (``read_captions``), each image prepared as ``vitkit predict`` prepares it; the report, also
    written as ``retrieval-<file stem>.json`` into ``out`` when given."""
    device = torch.device(device)
    listed = read_captions(captions)
    distinct = list(dict.fromkeys(listed.captions))
    named = [f"{listed.path}:{line}: {image}" for line, image in zip(listed.first_line, listed.images)]
    with autocast(device, dtype):
        texts = F.normalize(encode_texts(model, distinct, batch_size), dim=-1)
        images = F.normalize(encode_files(model, listed.images, resize, device, batch_size, named), dim=-1)
    position = {caption: index for index, caption in enumerate(distinct)}
    texts = texts[torch.tensor([position[caption] for caption in listed.captions])]
    scores = (images @ texts.T).cpu()  # (images, captions)
    right = torch.tensor(listed.image_of)[None, :] == torch.arange(len(listed.images))[:, None]
    report = {"captions": str(listed.path), "images": len(listed.images), "texts": len(listed.captions),
              "image_to_text": recall(scores, right), "text_to_image": recall(scores.T, right.T)}
    if out is not None:
        import json

        with atomic_file(Path(out) / f"retrieval-{listed.path.stem}.json") as handle:
            json.dump(report, handle, indent=1)
    return report
