"""``vitkit.load_clip``: an image-text checkpoint as one object, the image tower vitkit's ``VisionTransformer`` (as
``vitkit.load`` gives it) beside the text tower and the tokenizer of the checkpoint's own files."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoints import hub
from ..checkpoints.files import read_json_object
from ..checkpoints.hf import CONFIG_FILE
from ..checkpoints.hf_families import WHOLE
from ..checkpoints.loading import load, load_state_strict
from ..checkpoints.open_clip import HUB_CONFIG, is_open_clip_directory
from ..errors import CheckpointError, ConfigError, VitkitError
from ..models.vit import VisionTransformer
from .model import TextTransformer
from .readers import TextTower, read_hf_text, read_open_clip_text, read_tipsv2_text
from .tokenize import SENTENCEPIECE_FILE, TOKENIZER_CONFIG, TOKENIZER_FILE, Tokenizer, tokenizer_for

# What a hub repository holds of an image-text model beyond the image tower's files.
TEXT_FILES = (HUB_CONFIG, TOKENIZER_FILE, TOKENIZER_CONFIG, SENTENCEPIECE_FILE,
              "special_tokens_map.json")
TEXT_FAMILIES = ("HF transformers' CLIPModel, MetaClip2Model, SiglipModel, Siglip2Model and Tipsv2Model directories, "
                 "open_clip hub directories (CLIP, SigLIP, SigLIP 2, PE-core, MetaCLIP 2)")


class NoTextTower(ConfigError, CheckpointError):
    """The checkpoint holds an image tower alone, or a text tower vitkit does not read."""


class ImageTextModel(nn.Module):
    """An image tower and a text tower embedding into one space, as CLIP and SigLIP are trained.

    ``encode_image(images)``: (B, C, H, W) images, normalised as the checkpoint wants (``visual.config``), ->
    (B, E) embeddings; ``encode_text(texts)``: a list of strings -> (B, E) embeddings, both unnormalised as
    open_clip returns them. ``logit_scale`` is the stored log of the scale (the logits are ``exp(logit_scale)``
    times the cosine; TIPSv2's, the cosine divided by its temperature, is -log(temperature)), ``logit_bias``
    SigLIP's bias (None for CLIP and TIPSv2)."""

    def __init__(self, visual: VisionTransformer, text: TextTransformer, tokenizer: Tokenizer,
                 logit_scale: torch.Tensor, logit_bias: torch.Tensor | None, family: str, source: str):
        super().__init__()
        self.visual, self.text, self.tokenizer = visual, text, tokenizer
        self.register_buffer("logit_scale", logit_scale)
        self.register_buffer("logit_bias", logit_bias)
        self.family, self.source = family, source

    @property
    def sigmoid(self) -> bool:
        """Whether the model was trained with SigLIP's sigmoid loss (it has a ``logit_bias``)."""
        return self.logit_bias is not None

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """(B, E) embeddings of (B, C, H, W) images normalised as ``visual.config`` says, unnormalised."""
        return self.visual(images)

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        """The (B, T) token ids of ``texts``, as the checkpoint's tokenizer gives them (see ``text.tokenize``)."""
        return self.tokenizer(texts)

    def encode_text(self, texts: list[str]) -> torch.Tensor:
        """(B, E) embeddings of a list of strings, tokenized as the checkpoint's tokenizer does, unnormalised."""
        return self.text(self.tokenize(texts).to(self.logit_scale.device))


def load_clip(checkpoint: str | Path, tokenizer: str | Path | None = None, **overrides: Any) -> ImageTextModel:
    """The image-text model of ``checkpoint``: an HF ``CLIPModel``, ``MetaClip2Model``, ``SiglipModel``,
    ``Siglip2Model`` or ``Tipsv2Model`` directory, or an open_clip hub directory (or ``hf-hub:ORG/NAME`` of one), in
    eval mode.
    ``tokenizer``: a folder holding the tokenizer files (``tokenizer.json``) where the checkpoint does not hold
    them; ``overrides`` go to the image tower as in ``vitkit.load``. A checkpoint without a text tower is a
    ``CheckpointError`` naming it."""
    path = checkpoint_path(checkpoint)
    tower = read_text_tower(path)
    tokenize = tokenizer_for(tower.tokenizer, tokenizer)  # a missing tokenizer is said before the image tower loads
    with warnings.catch_warnings():  # the image tower's reader warns that it leaves the text tower out
        warnings.filterwarnings("ignore", message=".*its text tower .* is left out")
        visual = load(path, **overrides)
    return ImageTextModel(visual, text_transformer(tower, path), tokenize, tower.logit_scale, tower.logit_bias,
                          tower.family, str(path)).eval()


def checkpoint_path(checkpoint: str | Path) -> Path:
    """The local folder of ``checkpoint``: a path, or an ``hf-hub:ORG/NAME`` fetched with its text tower's files."""
    remote = isinstance(checkpoint, str) and hub.is_remote(checkpoint)
    return hub.resolve(checkpoint, TEXT_FILES) if remote else Path(checkpoint)


def text_transformer(tower: TextTower, path: Path) -> TextTransformer:
    """The text tower ``read_text_tower`` read from ``path`` as a :class:`TextTransformer` in eval mode."""
    with torch.device("meta"):
        text = TextTransformer(tower.config)
    load_state_strict(text, tower.state, f"{path} (text tower)")
    return text.eval()


def read_text_tower(path: Path) -> TextTower:
    """The text tower ``path`` holds, or a ``NoTextTower`` error naming what vitkit reads text towers from; a
    config whose fields are of the wrong kind, met deep inside a reader, is a CheckpointError."""
    try:
        return _read_text_tower(path)
    except VitkitError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as error:
        raise CheckpointError(f"{path}: malformed text tower ({type(error).__name__}: {error})") from error


def _read_text_tower(path: Path) -> TextTower:
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    if path.is_dir() and is_open_clip_directory(path):
        return read_open_clip_text(path, read_json_object(path / HUB_CONFIG))
    hf = read_json_object(path / CONFIG_FILE) if path.is_dir() else None
    if hf is not None and hf.get("model_type") in WHOLE:
        return read_hf_text(path, hf)
    if hf is not None and hf.get("model_type") == "tipsv2":
        return read_tipsv2_text(path, hf)
    what = f"model_type={hf.get('model_type')!r}" if hf is not None and "model_type" in hf else \
        "a weights file, without the config its text tower needs" if path.is_file() else "an image tower"
    raise NoTextTower(f"{path}: no text tower vitkit reads ({what}); zero-shot takes a checkpoint with one: "
                      f"{TEXT_FAMILIES}")
