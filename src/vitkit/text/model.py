"""The text tower of an image-text model (CLIP, SigLIP, SigLIP 2, TIPSv2): token and position embeddings, pre-LN
blocks (vitkit's :class:`~vitkit.models.layers.Block`, under a causal mask where the family has one), a final
LayerNorm, one position pooled (or the text's positions averaged), and a linear projection into the space the image
tower embeds into.

Where the families differ, the config says it:
- ``causal``: CLIP attends to earlier tokens only (so padding after the end-of-text token cannot change it);
  SigLIP attends both ways and is given no attention mask, padding included.
- ``pool``: the position whose final state is the text's: ``argmax``, the largest token id (CLIP's end-of-text
  token has the largest id of its vocabulary; open_clip's rule, and HF's when ``eos_token_id`` is 2), ``eos``, the
  first position of ``eos_token_id`` (HF's CLIP otherwise), ``last``, the last position (SigLIP, SigLIP 2);
  ``mean``, the mean of the final states of the text's tokens, those other than ``pad_token_id`` (TIPSv2). Under
  ``mean`` the padding is also kept out of attention: no token attends to a pad, so padding cannot change a text's
  embedding.
- ``proj_bias``: CLIP's projection has no bias, SigLIP's head has one; ``embed_dim=None``: no projection.
- ``mlp``: ``gelu`` (``gelu`` says which: ``quick`` for OpenAI's weights, ``exact`` or ``tanh``, as the image
  tower's) or ``relu`` (TIPSv2).
- ``positions``: ``learned``, a table in the weights; ``sinusoidal``, fixed sines and cosines of the position
  (tensor2tensor's: the first half of the channels sines, the second cosines, of geometric frequencies from 1 down
  to 1/10000), computed rather than stored (TIPSv2). ``embed_scale``: the token embeddings multiplied by
  sqrt(dim) before the positions are added (TIPSv2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError
from ..models.config import GELUS, ViTConfig
from ..models.layers import Block

POOLS = ("argmax", "eos", "last", "mean")
TEXT_MLPS = ("gelu", "relu")
POSITIONS = ("learned", "sinusoidal")


@dataclass(frozen=True)
class TextConfig:
    """The text tower's shape and numerics (see the module's docstring for the family fields)."""

    vocab_size: int
    context_length: int
    dim: int
    depth: int
    num_heads: int
    mlp_dim: int
    embed_dim: int | None  # the projection's width; None: the final norm's pooled state is the embedding
    gelu: str = "exact"
    ln_eps: float = 1e-5
    causal: bool = True
    pool: str = "argmax"
    eos_token_id: int | None = None  # for pool='eos'
    proj_bias: bool = False
    layer_scale: float | None = None
    mlp: str = "gelu"
    positions: str = "learned"
    embed_scale: bool = False
    pad_token_id: int | None = None  # for pool='mean'

    def __post_init__(self):
        for name, choices in (("gelu", GELUS), ("pool", POOLS), ("mlp", TEXT_MLPS), ("positions", POSITIONS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name}={getattr(self, name)!r}; expected one of {choices}")
        if self.pool == "eos" and self.eos_token_id is None:
            raise ConfigError("pool='eos' needs eos_token_id")
        if self.pool == "mean" and self.pad_token_id is None:
            raise ConfigError("pool='mean' needs pad_token_id")
        if self.dim % self.num_heads:
            raise ConfigError(f"dim={self.dim} is not a multiple of num_heads={self.num_heads}")

    def block_config(self) -> ViTConfig:
        """The fields of the encoder blocks, in the config vitkit's blocks are built from."""
        return ViTConfig(dim=self.dim, depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                         gelu=self.gelu, mlp=self.mlp, ln_eps=self.ln_eps, layer_scale=self.layer_scale,
                         num_classes=0)


class TextTransformer(nn.Module):
    """``model(ids)``: (B, T) token ids, T at most ``context_length``, -> (B, embed_dim) text embeddings,
    unnormalised (what open_clip's ``encode_text`` and HF's ``get_text_features`` return)."""

    def __init__(self, config: TextConfig):
        super().__init__()
        c = self.config = config
        self.token_embed = nn.Embedding(c.vocab_size, c.dim)
        self.pos_embed = nn.Parameter(torch.zeros(c.context_length, c.dim)) if c.positions == "learned" else None
        blocks = c.block_config()
        self.blocks = nn.ModuleList(Block(blocks) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.dim, eps=c.ln_eps)
        self.proj = nn.Linear(c.dim, c.embed_dim, bias=c.proj_bias) if c.embed_dim else nn.Identity()

    def forward_features(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, D) final states, after the final norm."""
        if ids.ndim != 2 or ids.dtype not in (torch.int32, torch.int64):
            raise InputError(f"expected (batch, tokens) integer token ids, got {ids.dtype} of shape {tuple(ids.shape)}")
        length = ids.shape[1]
        if not 0 < length <= self.config.context_length:
            raise InputError(f"{length} tokens; the text tower takes 1 to {self.config.context_length}")
        z = self.token_embed(ids)
        if self.config.embed_scale:
            z = z * self.config.dim ** 0.5
        z = z + self.positions(length, z)
        mask = None  # True where a query (row) may attend to a key (column)
        if self.config.causal:
            mask = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        if self.config.pool == "mean":  # no query attends to a pad: (B, 1, 1, T) keys, with the causal (T, T) if any
            keys = ids != self.config.pad_token_id
            keys = keys | ~keys.any(dim=-1, keepdim=True)  # a text of no tokens attends to all (and pools to zeros)
            mask = keys[:, None, None, :] if mask is None else keys[:, None, None, :] & mask
        for block in self.blocks:
            z = block(z, mask=mask)
        return self.norm(z)

    def positions(self, length: int, like: torch.Tensor) -> torch.Tensor:
        """The (length, D) position embeddings of the first ``length`` positions, in the dtype of ``like``."""
        if self.pos_embed is not None:
            return self.pos_embed[:length]
        return sinusoidal_positions(length, self.config.dim, like.device).to(like.dtype)

    def pool(self, states: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The state at the position ``config.pool`` names, or the text tokens' mean, (B, D)."""
        rows = torch.arange(ids.shape[0], device=ids.device)
        if self.config.pool == "mean":  # a text of no tokens (all padding) pools to zeros
            text = (ids != self.config.pad_token_id).unsqueeze(-1).to(states.dtype)
            return (states * text).sum(dim=1) / text.sum(dim=1).clamp(min=1)
        if self.config.pool == "last":
            return states[:, -1]
        if self.config.pool == "argmax":
            return states[rows, ids.argmax(dim=-1)]
        return states[rows, (ids == self.config.eos_token_id).int().argmax(dim=-1)]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, embed_dim): the pooled final state, projected."""
        return self.proj(self.pool(self.forward_features(ids), ids))


def sinusoidal_positions(length: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """(length, dim) fixed position embeddings: position p's first dim // 2 channels are sin(p f_i), the next
    dim // 2 cos(p f_i), with f_i = 10000 ** (-i / (dim // 2 - 1)) (tensor2tensor's spacing), and a zero channel
    last where dim is odd."""
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, device=device, dtype=torch.float32)
                            * (-math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * frequencies
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(table, (0, dim % 2))
