"""Rotary position embeddings (Su et al. 2021) over the 2-D patch grid, as the ViTs of 2024-26 use them (DINOv3,
EVA-02, Perception Encoder, RoPE-ViT, Gemma 4): each block's queries and keys turned by angles that depend on where the
token's patch lies, instead of a table added to the tokens (``position``)."""

from __future__ import annotations

import torch
from torch import nn

from .config import ViTConfig
from .position import _CachedByGrid, grid_cells


def rope_coordinates(rows: torch.Tensor, cols: torch.Tensor, grid_rows: torch.Tensor | int,
                     grid_cols: torch.Tensor | int, kind: str, offset: float = 0.0, ref_grid: int | None = None,
                     xy: bool = False) -> torch.Tensor:
    """(..., 2) float32 coordinates of patches (``rows``, ``cols``) of grids (``grid_rows``, ``grid_cols``), all
    broadcast together: the row and the column, or (``xy``) the column and the row. ``index``: the patch's indices
    plus ``offset``, rescaled so that each axis spans ``ref_grid`` cells when one is given; ``centered``: the patch
    centres (k + 0.5 + offset) / n mapped to [-1, 1]."""
    axes = []
    for index, cells in ((rows, grid_rows), (cols, grid_cols)):
        index = index.to(torch.float32)
        cells = torch.as_tensor(cells, device=index.device).to(torch.float32)
        if kind == "centered":
            axis = 2.0 * ((index + 0.5 + offset) / cells) - 1.0
        else:
            axis = index + offset
            if ref_grid is not None:
                axis = axis / cells * ref_grid
        axes.append(axis)
    rows, cols = torch.broadcast_tensors(*axes)
    return torch.stack([cols, rows] if xy else [rows, cols], dim=-1)


class RotaryEmbedding(_CachedByGrid):
    """Option rope: rotary position embeddings (Su et al. 2021) over the 2-D patch grid. Each head's width d is
    cut into d/2 pairs; the first d/4 pairs turn with the first coordinate, the rest with the second, by
    angle = coordinate x frequency. ``forward`` gives the (2, ..., T, d) cosines and sines of those angles for
    the T tokens of a grid, each repeated over its pair; the prefix tokens' rows are cos 1, sin 0 (not rotated).

    ``axial``: frequencies theta^(-j / (d/4)) for j < d/4 on each axis (index coordinates), or, on centred
    coordinates, 2 pi theta^(-j / (d/4)) (DINOv3's periods in turns); a pair is two neighbouring channels, or
    (``rope_half``) channels d/2 apart, or (``rope_split``, Gemma 4) d/4 apart within each axis's half of the head.
    ``mixed`` (RoPE-ViT): learned (2, depth, heads, d/2) frequencies, each pair turning with a learned mix of both
    coordinates, one table per block and head."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        c = config
        self.kind, self.grid_kind, self.theta = c.rope, c.rope_grid, c.rope_theta
        self.offset, self.ref_grid, self.xy, self.half = c.rope_offset, c.rope_ref_grid, c.rope_xy, c.rope_half
        self.split = c.rope_split
        self.prefix, self.head_dim = c.num_prefix_tokens, c.head_dim
        quarter = self.head_dim // 4
        if self.kind == "mixed":  # RoPE-ViT's init: axial magnitudes, turned by a random angle per block and head
            magnitude = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 4, dtype=torch.float32) / self.head_dim)
            angle = torch.rand(c.depth, c.num_heads, 1) * 2 * torch.pi
            fx = torch.cat([magnitude * torch.cos(angle), magnitude * torch.cos(angle + torch.pi / 2)], dim=-1)
            fy = torch.cat([magnitude * torch.sin(angle), magnitude * torch.sin(angle + torch.pi / 2)], dim=-1)
            self.freqs = nn.Parameter(torch.stack([fx, fy]))  # (2, depth, heads, d/2)
        else:
            self.freqs = None
            self.exponents = torch.arange(quarter, dtype=torch.float32, device="cpu") / quarter

    def _angles(self, coords: torch.Tensor) -> torch.Tensor:
        """(..., N, 2) coordinates -> (..., N, d/2) angles, one per pair; with learned mixed frequencies
        (..., depth, heads, N, d/2)."""
        if self.freqs is not None:
            coords = coords.to(self.freqs.device)[..., None, None, :, :]
            freqs = self.freqs.float()
            return coords[..., 0, None] * freqs[0].unsqueeze(-2) + coords[..., 1, None] * freqs[1].unsqueeze(-2)
        if self.grid_kind == "centered":
            angles = 2 * torch.pi * coords[..., None] / self.theta ** self.exponents.to(coords.device)
        else:
            angles = coords[..., None] * (1.0 / self.theta ** self.exponents.to(coords.device))
        return angles.flatten(-2)

    def _table(self, coords: torch.Tensor) -> torch.Tensor:
        """The (2, ..., prefix + N, d) cosines and sines for patches at (..., N, 2) ``coords``, the prefix tokens'
        rows first (cos 1, sin 0)."""
        angles = self._angles(coords)
        # Each angle over its pair, stacked: torch's ONNX exporter mis-exports repeat_interleave (it corrupts
        # constants that other nodes of the graph share).
        if self.split:  # Option rope_split (Gemma 4): each axis's angles over its own half, [a0, a0, a1, a1]
            axes = angles.unflatten(-1, (2, -1))
            angles = torch.cat([axes, axes], dim=-1).flatten(-2)
        elif self.half:
            angles = torch.cat([angles] * 2, dim=-1)
        else:
            angles = torch.stack([angles] * 2, dim=-1).flatten(-2)
        table = torch.stack([angles.cos(), angles.sin()])
        if not self.prefix:  # no empty concatenation: an exported graph would reshape an empty tensor (Gemma 4)
            return table
        identity = torch.zeros_like(table[..., :1, :]).expand(*table.shape[:-2], self.prefix, -1).clone()
        identity[0] = 1.0
        return torch.cat([identity, table], dim=-2)

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        return self._table(rope_coordinates(*grid_cells(grid), *grid, self.grid_kind, self.offset, self.ref_grid,
                                            self.xy))

    def at(self, rows: torch.Tensor, cols: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """(2, B, prefix + N, d) tables of B images' patches, each on its own grid ((2, B, depth, heads, prefix + N,
        d) with learned mixed frequencies)."""
        return self._table(rope_coordinates(rows, cols, grids[:, None, 0], grids[:, None, 1], self.grid_kind,
                                            self.offset, self.ref_grid, self.xy))

    def resize(self, grid: tuple[int, int]) -> None:
        """Nothing to resample: the table is computed for any grid."""

    def set_prefix(self, count: int) -> None:
        """Tables of ``count`` unrotated prefix tokens from now on (VPT's prompts join the prefix)."""
        self.prefix = count
        self._cache.clear()


def apply_rope(x: torch.Tensor, table: torch.Tensor, half: bool, split: bool = False) -> torch.Tensor:
    """Rotate (B, h, T, d) queries or keys by a (2, T, d) or (2, h, T, d) table of cosines and sines: ``half``, the
    two halves of each head against each other, or (``split``) the two halves of each axis's half (Gemma 4);
    else neighbouring pairs."""
    if half:
        parts = x.chunk(4 if split else 2, dim=-1)  # (a, b) -> (-b, a), per half with split
        turned = torch.cat([t for i in range(0, len(parts), 2) for t in (-parts[i + 1], parts[i])], dim=-1)
    else:
        turned = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
    return (x * table[0] + turned * table[1]).to(x.dtype)


def make_rope(config: ViTConfig) -> RotaryEmbedding | None:
    return RotaryEmbedding(config) if config.rope != "none" else None
