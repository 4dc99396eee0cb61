"""Tokenizers of image-text checkpoints, built from the checkpoint's own files with the libraries that define them:
HF ``tokenizers`` for an HF directory's ``tokenizer.json``, ``sentencepiece`` for SigLIP's ``spiece.model``,
open_clip's CLIP BPE for an open_clip directory that names no HF tokenizer.

A tokenizer turns a list of strings into a (B, T) tensor of token ids as the family's own processor does:
- the context length is the checkpoint's (its position table), never a constant; longer texts are cut as the peer
  cuts them (HF: the words past the length go, the special tokens stay; open_clip: cut, the last id set to the
  end-of-text token), and the first time it happens a warning says so;
- HF CLIP and MetaCLIP 2 pad with the tokenizer's pad token to the longest text (their causal mask keeps padding
  out of the end-of-text state, so any padding gives the same embedding); SigLIP, SigLIP 2 and TIPSv2 pad to the
  full context, as their processors do, on the side ``tokenizer_config.json`` names (else the side its
  ``tokenizer_class`` pads on in transformers: the left for Gemma's; TIPSv2's tower leaves the pads out of
  attention and of its mean, so for it the padding changes nothing either);
- TIPSv2: its ``tokenizer.json`` lower-cases itself and adds no special tokens; its pad token must have the id
  the text tower takes for padding (``text_config.pad_token_id``);
- SigLIP 2: transformers' ``Siglip2Tokenizer`` lower-cases before the Gemma tokenizer its ``tokenizer.json``
  holds (which does not), since the model was trained on lower-cased text: so does vitkit;
- ``add_bos_token`` / ``add_eos_token`` in ``tokenizer_config.json`` set the special tokens as transformers
  sets them; otherwise those of ``tokenizer.json``'s post-processor;
- an open_clip folder naming an HF tokenizer (``hf_tokenizer_name``: SigLIP, SigLIP 2, MetaCLIP 2) is tokenized
  as open_clip's ``HFTokenizer`` does: the text cleaned first by open_clip's own ``clean`` function
  (``canonicalize`` lower-cases and drops punctuation), then the folder's ``tokenizer.json``, padded to the full
  context with its pad token.
"""

from __future__ import annotations

import logging
import string
from pathlib import Path
from typing import Any

import torch

from ..checkpoints.files import read_json_object
from ..errors import CheckpointError, ConfigError, abridged

log = logging.getLogger("vitkit")

TOKENIZER_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "spiece.model"  # SigLIP's
TOKENIZER_CONFIG = "tokenizer_config.json"
# HF family -> (its tokenizer class's pad token and padding side, where tokenizer_config.json says neither).
HF_DEFAULTS = {"clip": ("<|endoftext|>", "right"), "metaclip_2": ("<pad>", "right"), "siglip2": ("<pad>", "left"),
               "tipsv2": ("<pad>", "right"), "open_clip": (None, "right")}
# transformers' tokenizer classes that pad on the left where tokenizer_config.json names no padding_side.
LEFT_PADDED = frozenset({"GemmaTokenizer", "Siglip2Tokenizer", "LlamaTokenizer", "CodeLlamaTokenizer",
                         "CohereTokenizer", "XLNetTokenizer"})
FULL_CONTEXT = ("siglip2", "tipsv2", "open_clip")  # the families padded to the full context


class MissingTokenizer(ConfigError, CheckpointError):
    """The checkpoint lacks its tokenizer's files: the user passes them (``tokenizer=`` / ``--tokenizer``)."""


class Tokenizer:
    """Strings -> (B, T) token ids; subclasses say how one text is cut and how a batch is padded."""

    def __init__(self, context_length: int, source: str):
        self.context_length = context_length
        self.source = source
        self.warned = False

    def __call__(self, texts: list[str]) -> torch.Tensor:
        if isinstance(texts, str):
            texts = [texts]
        if not texts or not all(isinstance(text, str) for text in texts):
            raise ConfigError(f"expected a non-empty list of strings to tokenize, got {abridged(texts)}")
        ids, cut = self.encode(list(texts))
        if cut and not self.warned:
            self.warned = True
            log.warning(f"texts longer than the {self.context_length} tokens of {self.source}'s context are truncated "
                        f"as its tokenizer truncates them (the first: {abridged(cut[0], 60)})")
        return ids

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, list[str]]:
        """The ids of ``texts`` and those of them that were truncated."""
        raise NotImplementedError


class HFTokenizer(Tokenizer):
    """An HF ``tokenizer.json`` (with ``tokenizer_config.json`` beside it) run by the ``tokenizers`` library, with
    the rules of the family's transformers tokenizer (see the module's docstring)."""

    def __init__(self, file: Path, family: str, context_length: int, clean: str | None = None,
                 pad_token_id: int | None = None):
        """``clean``: open_clip's cleaning of the texts first (an open_clip folder's); ``pad_token_id``: the id the
        text tower takes for padding, which the pad token must have, where the tower reads one."""
        super().__init__(context_length, str(file.parent))
        try:
            from tokenizers import Tokenizer as Backend
            from tokenizers import normalizers, processors
        except ImportError:
            raise ImportError("HF checkpoints' tokenizer.json is read by tokenizers: pip install 'vitkit[text]'") \
                from None

        try:
            backend = Backend.from_file(str(file))
        except Exception as error:  # the library raises a bare Exception for a file it cannot read
            raise CheckpointError(f"{file}: not a tokenizers file ({str(error).splitlines()[0]})") from None
        settings = read_json_object(file.parent / TOKENIZER_CONFIG) or {}
        pad, side = HF_DEFAULTS[family]
        pad = _token(settings.get("pad_token")) or pad
        if pad is None:
            raise CheckpointError(f"{file.parent / TOKENIZER_CONFIG}: no pad_token; the texts are padded to "
                                  f"{context_length} tokens with it")
        if family == "siglip2":
            steps = [normalizers.Lowercase()] + ([backend.normalizer] if backend.normalizer is not None else [])
            backend.normalizer = normalizers.Sequence(steps)
        if "add_bos_token" in settings or "add_eos_token" in settings:
            specials = [(_token(settings.get(name)), flag) for name, flag in
                        (("bos_token", settings.get("add_bos_token")), ("eos_token", settings.get("add_eos_token")))]
            bos, eos = (token if flag and token else None for token, flag in specials)
            single = " ".join([f"{bos}:0"] * bool(bos) + ["$A:0"] + [f"{eos}:0"] * bool(eos))
            specials = [(token, self._id(backend, token, file)) for token in (bos, eos) if token]
            backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=specials)
        backend.enable_truncation(max_length=context_length, direction=settings.get("truncation_side", "right"))
        pad_id = self._id(backend, pad, file)
        if pad_token_id is not None and pad_id != pad_token_id:
            raise CheckpointError(f"{file}: the pad token {pad!r} has id {pad_id}; the text tower takes "
                                  f"{pad_token_id} for padding (text_config.pad_token_id)")
        if str(settings.get("tokenizer_class", "")).removesuffix("Fast") in LEFT_PADDED:
            side = "left"
        full = family in FULL_CONTEXT  # the causal families' padding cannot reach their end token
        backend.enable_padding(direction=settings.get("padding_side", side), pad_id=pad_id, pad_token=pad,
                               length=context_length if full else None)
        self.backend = backend
        self.clean = None if clean is None else _open_clip_cleaning(clean)

    @staticmethod
    def _id(backend, token: str, file: Path) -> int:
        found = backend.token_to_id(token)
        if found is None:
            raise CheckpointError(f"{file}: the special token {token!r} ({TOKENIZER_CONFIG}) is not in its vocabulary")
        return found

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, list[str]]:
        encodings = self.backend.encode_batch(texts if self.clean is None else [self.clean(text) for text in texts])
        cut = [text for text, encoding in zip(texts, encodings) if encoding.overflowing]
        return torch.tensor([encoding.ids for encoding in encodings], dtype=torch.long), cut


class SentencePieceTokenizer(Tokenizer):
    """SigLIP's ``spiece.model`` run by ``sentencepiece`` with the rules of transformers' ``SiglipTokenizer``: the
    text canonicalised first (lower-cased unless ``do_lower_case`` is false, ASCII punctuation removed, runs of
    whitespace made one space), the end-of-sequence token appended (the words cut to leave it room), padded to the
    full context with the pad token (``</s>``, the end-of-sequence token itself). ``clean``: open_clip's cleaning
    before all that, in an open_clip folder."""

    def __init__(self, file: Path, context_length: int, clean: str | None = None):
        super().__init__(context_length, str(file.parent))
        try:
            import sentencepiece
        except ImportError:
            raise ImportError("SigLIP's spiece.model is read by sentencepiece: pip install 'vitkit[text]'") from None
        self.model = sentencepiece.SentencePieceProcessor()
        try:
            self.model.Load(str(file))
        except (OSError, RuntimeError) as error:
            raise CheckpointError(f"{file}: not a SentencePiece model ({str(error).splitlines()[0]})") from None
        settings = read_json_object(file.parent / TOKENIZER_CONFIG) or {}
        kind = settings.get("tokenizer_class", "SiglipTokenizer")
        if kind != "SiglipTokenizer":
            raise CheckpointError(f"{file.parent / TOKENIZER_CONFIG}: tokenizer_class={abridged(kind)} with no "
                                  f"{TOKENIZER_FILE}; vitkit reads a lone {SENTENCEPIECE_FILE} as SiglipTokenizer's")
        self.clean = None if clean is None else _open_clip_cleaning(clean)
        self.lower = settings.get("do_lower_case", True) is not False
        self.eos, self.pad = (self._id(_token(settings.get(name)) or "</s>", file)
                              for name in ("eos_token", "pad_token"))
        self.unpunctuate = str.maketrans("", "", string.punctuation)

    def _id(self, token: Any, file: Path) -> int:
        found = self.model.piece_to_id(token) if isinstance(token, str) else -1
        if not 0 <= found < self.model.get_piece_size() or self.model.id_to_piece(found) != token:
            raise CheckpointError(f"{file}: the special token {abridged(token)} ({TOKENIZER_CONFIG}) is not one of "
                                  f"its pieces")
        return found

    def canonical(self, text: str) -> str:
        """The text as SigLIP's tokenizer sees it (big_vision's canonicalisation)."""
        text = (text.lower() if self.lower else text).translate(self.unpunctuate)
        return " ".join(text.split())

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, list[str]]:
        room = self.context_length - 1
        cleaned = texts if self.clean is None else [self.clean(text) for text in texts]
        pieces = [self.model.encode(self.canonical(text)) for text in cleaned]
        ids = torch.full((len(texts), self.context_length), self.pad, dtype=torch.long)
        for row, words in enumerate(pieces):
            kept = words[:room] + [self.eos]
            ids[row, :len(kept)] = torch.tensor(kept, dtype=torch.long)
        return ids, [text for text, words in zip(texts, pieces) if len(words) > room]


class OpenClipTokenizer(Tokenizer):
    """open_clip's CLIP BPE (``SimpleTokenizer``, with the ``tokenizer_kwargs`` of the folder's config: the cleaning
    of the text), padded with zeros to the context length."""

    def __init__(self, context_length: int, options: dict[str, Any], source: str):
        super().__init__(context_length, source)
        try:
            from open_clip.tokenizer import SimpleTokenizer
        except ImportError:
            raise ImportError("open_clip folders are tokenized by open_clip's CLIP BPE: pip install "
                              "'vitkit[text]' (open_clip_torch)") from None
        try:
            self.inner = SimpleTokenizer(context_length=context_length, **options)
        except (TypeError, AssertionError) as error:
            raise CheckpointError(f"{source}: text_cfg.tokenizer_kwargs={abridged(options)} are not open_clip's "
                                  f"tokenizer options ({error})") from None

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, list[str]]:
        cut = [text for text in texts if len(self.inner.encode(text)) + 2 > self.context_length]
        return self.inner(texts), cut


def tokenizer_for(spec: dict[str, Any], tokenizer: str | Path | None = None) -> Tokenizer:
    """The tokenizer a reader's ``spec`` describes, from the checkpoint's files or those of ``tokenizer`` (a folder
    holding them, or a ``tokenizer.json``), which win where given."""
    context = spec["context_length"]
    if spec["kind"] == "open_clip":
        if tokenizer is not None:
            raise ConfigError(f"tokenizer={tokenizer}: an open_clip CLIP folder is tokenized by open_clip's own BPE")
        return OpenClipTokenizer(context, spec["options"], "the checkpoint")
    family = spec["family"]
    where = Path(tokenizer) if tokenizer is not None else spec["directory"]
    name = SENTENCEPIECE_FILE if family == "siglip" or family == "open_clip" and _sentencepiece_only(where) \
        else TOKENIZER_FILE
    file = where if where.is_file() else where / name
    if tokenizer is not None and not where.exists():
        raise MissingTokenizer(f"tokenizer={where}: no such file or folder")
    if not file.is_file():
        repo = spec.get("name")
        fetch = f" (the tokenizer files of {repo})" if isinstance(repo, str) and repo else ""
        told = "" if tokenizer is None else "the tokenizer folder given, "
        raise MissingTokenizer(f"{told}{where}: no {name}; pass tokenizer=DIR (--tokenizer DIR), a folder holding "
                               f"the checkpoint's {name}{fetch}")
    if name == SENTENCEPIECE_FILE:
        return SentencePieceTokenizer(file, context, spec.get("clean"))
    return HFTokenizer(file, family, context, spec.get("clean"), spec.get("pad_token_id"))


def _sentencepiece_only(where: Path) -> bool:
    """Whether ``where`` is a SentencePiece model, or a folder holding one and no ``tokenizer.json`` (what
    transformers' SigLIP tokenizer saves, also into an open_clip folder)."""
    if where.is_file():
        return where.suffix == ".model"
    return not (where / TOKENIZER_FILE).is_file() and (where / SENTENCEPIECE_FILE).is_file()


def _open_clip_cleaning(clean: str):
    """open_clip's text cleaning ``clean`` (its ``tokenizer_kwargs``), as its HFTokenizer applies it."""
    try:
        from open_clip.tokenizer import get_clean_fn
    except ImportError:
        raise ImportError("open_clip folders' texts are cleaned by open_clip's own functions: pip install "
                          "'vitkit[text]' (open_clip_torch)") from None
    return get_clean_fn(clean)


def _token(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or an object with its ``content``."""
    return value.get("content") if isinstance(value, dict) else value
