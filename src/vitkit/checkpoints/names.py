"""Name tables and the layout rewrites several formats share: renaming a state dict to vitkit's names
and back, packing and unpacking q/k/v, position rows for prefix tokens, CLIP's class token and
bias-free projection, and leaving a text tower out."""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import ViTConfig


class Names:
    """A two-way table of parameter names. Templates hold ``{i}``/``{j}`` (indices from 0), ``{I}``/``{J}``
    (the same indices counted from 1) and ``{rest}`` (anything), e.g.
    ``("encoder.layer.{i}.output.dense.{rest}", "blocks.{i}.mlp.fc2.{rest}")``; the first template
    that matches wins, in either direction."""

    def __init__(self, pairs: list[tuple[str, str]]):
        self.forward = [self._compile(theirs, ours) for theirs, ours in pairs]
        self.backward = [self._compile(ours, theirs) for theirs, ours in pairs]

    @staticmethod
    def _compile(source: str, target: str) -> tuple[re.Pattern, str]:
        pattern = re.escape(source)
        for field, regex in (("i", r"\d+"), ("j", r"\d+"), ("I", r"\d+"), ("J", r"\d+"), ("rest", r".+")):
            pattern = pattern.replace(re.escape(f"{{{field}}}"), f"(?P<{field}>{regex})")
        return re.compile(pattern), target

    @staticmethod
    def _apply(name: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
        for pattern, target in rules:
            match = pattern.fullmatch(name)
            if match:
                fields = match.groupdict()
                for zero, one in (("i", "I"), ("j", "J")):
                    if zero in fields:
                        fields[one] = str(int(fields[zero]) + 1)
                    elif one in fields:
                        fields[zero] = str(int(fields[one]) - 1)
                return target.format(**fields)
        return None

    def to_ours(self, name: str) -> str | None:
        return self._apply(name, self.forward)

    def to_theirs(self, name: str) -> str | None:
        return self._apply(name, self.backward)


def rename(state: dict[str, Any], names: Names, source: str) -> dict[str, Any]:
    """``state`` with vitkit's names; a name the table does not know is an error that lists them all."""
    renamed, unknown = {}, []
    for key, value in state.items():
        ours = names.to_ours(key)
        if ours is None:
            unknown.append(key)
        else:
            renamed[ours] = value
    if unknown:
        raise CheckpointError(f"{source}: {len(unknown)} unexpected keys that vitkit cannot place: "
                              + ", ".join(sorted(unknown)[:20]) + (" ..." if len(unknown) > 20 else ""))
    return renamed


def fuse_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Concatenate separate ``attn.q/k/v`` projections into vitkit's packed ``attn.qkv``."""
    fused = dict(state)
    for key in [k for k in state if ".attn.q." in k]:
        parts = [fused.pop(key.replace(".attn.q.", f".attn.{p}.")) for p in "qkv"]
        fused[key.replace(".attn.q.", ".attn.qkv.")] = torch.cat(parts, dim=0)
    return fused


def split_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`fuse_qkv`."""
    split = dict(state)
    for key in [k for k in state if ".attn.qkv." in k]:
        for part, tensor in zip("qkv", split.pop(key).chunk(3, dim=0)):
            split[key.replace(".attn.qkv.", f".attn.{part}.")] = tensor.contiguous()
    return split


def with_prefix_positions(config: ViTConfig, state: dict[str, torch.Tensor]
                          ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """For formats without ``no_embed_class``: zero position rows for the prefix tokens, exactly equivalent."""
    if not config.no_embed_class or "pos_embed.weight" not in state:
        return config, state
    table = state["pos_embed.weight"]
    rows = table.new_zeros(1, config.learned_prefix_tokens, table.shape[-1])
    return config.replace(no_embed_class=False), {**state, "pos_embed.weight": torch.cat([rows, table], dim=1)}


def clip_token_and_head(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CLIP's ``(D,)`` class embedding as vitkit's ``(1, 1, D)`` token, and its bias-free projection (already
    as an ``(out, D)`` weight) as a head with a zero bias."""
    state = dict(state)
    if state.get("cls_token") is not None and state["cls_token"].ndim == 1:
        state["cls_token"] = state["cls_token"].reshape(1, 1, -1)
    if "head.weight" in state and "head.bias" not in state:
        state["head.bias"] = state["head.weight"].new_zeros(state["head.weight"].shape[0])
    return state


def without_text_tower(state: dict[str, Any], text: list[str], model: str, source: Any) -> dict[str, Any]:
    """``state`` less the text tower's keys ``text`` of a whole ``model`` (CLIP, SigLIP...), with a warning
    that says what was left out."""
    if text:
        warnings.warn(f"{source}: a whole {model} model; its image tower is read and its text tower "
                      f"({len(text)} tensors: {', '.join(sorted(text)[:3])} ...) is left out", stacklevel=4)
    left_out = set(text)
    return {key: value for key, value in state.items() if key not in left_out}
