"""The text tower of an image-text model (CLIP, SigLIP, SigLIP 2): token and position embeddings, pre-LN blocks
(vitkit's :class:`~vitkit.models.layers.Block`, under a causal mask where the family has one), a final LayerNorm,
one position pooled, and a linear projection into the space the image tower embeds into.

Where the families differ, the config says it:
- ``causal``: CLIP attends to earlier tokens only (so padding after the end-of-text token cannot change it);
  SigLIP attends both ways and is given no attention mask, padding included.
- ``pool``: the position whose final state is the text's: ``argmax``, the largest token id (CLIP's end-of-text
  token has the largest id of its vocabulary; open_clip's rule, and HF's when ``eos_token_id`` is 2), ``eos``, the
  first position of ``eos_token_id`` (HF's CLIP otherwise), ``last``, the last position (SigLIP, SigLIP 2).
- ``proj_bias``: CLIP's projection has no bias, SigLIP's head has one; ``embed_dim=None``: no projection.
- ``gelu``: ``quick`` (OpenAI's weights), ``exact`` or ``tanh``, as the image tower's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError, InputError
from ..models.config import GELUS, ViTConfig
from ..models.layers import Block

POOLS = ("argmax", "eos", "last")


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

    def __post_init__(self):
        if self.gelu not in GELUS:
            raise ConfigError(f"gelu={self.gelu!r}; expected one of {GELUS}")
        if self.pool not in POOLS:
            raise ConfigError(f"pool={self.pool!r}; expected one of {POOLS}")
        if self.pool == "eos" and self.eos_token_id is None:
            raise ConfigError("pool='eos' needs eos_token_id")
        if self.dim % self.num_heads:
            raise ConfigError(f"dim={self.dim} is not a multiple of num_heads={self.num_heads}")

    def block_config(self) -> ViTConfig:
        """The fields of the encoder blocks, in the config vitkit's blocks are built from."""
        return ViTConfig(dim=self.dim, depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                         gelu=self.gelu, ln_eps=self.ln_eps, layer_scale=self.layer_scale, num_classes=0)


class TextTransformer(nn.Module):
    """``model(ids)``: (B, T) token ids, T at most ``context_length``, -> (B, embed_dim) text embeddings,
    unnormalised (what open_clip's ``encode_text`` and HF's ``get_text_features`` return)."""

    def __init__(self, config: TextConfig):
        super().__init__()
        c = self.config = config
        self.token_embed = nn.Embedding(c.vocab_size, c.dim)
        self.pos_embed = nn.Parameter(torch.zeros(c.context_length, c.dim))
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
        z = self.token_embed(ids) + self.pos_embed[:length]
        mask = None
        if self.config.causal:  # True where a query (row) may attend to a key (column)
            mask = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        for block in self.blocks:
            z = block(z, mask=mask)
        return self.norm(z)

    def pool(self, states: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The state at the position ``config.pool`` names, (B, D)."""
        rows = torch.arange(ids.shape[0], device=ids.device)
        if self.config.pool == "last":
            return states[:, -1]
        if self.config.pool == "argmax":
            return states[rows, ids.argmax(dim=-1)]
        return states[rows, (ids == self.config.eos_token_id).int().argmax(dim=-1)]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, embed_dim): the pooled final state, projected."""
        return self.proj(self.pool(self.forward_features(ids), ids))
