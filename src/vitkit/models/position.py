"""Position embeddings of the paper's ablation (appendix D.4) and their resampling to new grids.

Each kind is a module mapping a patch grid (rows, cols) to the (1, prefix + rows*cols, D) table that
eq. (1) adds to the token sequence; ``prefix`` counts the rows of prefix tokens ([class], distillation,
registers; none with ``no_embed_class``), which are never resampled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig


def resample_grid(table: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int],
                  mode: str = "bicubic", antialias: bool = False, align_corners: bool = False) -> torch.Tensor:
    """Interpolate a (1, rows*cols, D) patch table from ``old_grid`` to ``new_grid`` in 2-D."""
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if table.ndim != 3 or table.shape[1] != old_grid[0] * old_grid[1]:
        raise ValueError(f"position table of shape {tuple(table.shape)} does not hold a {old_grid} grid")
    if old_grid == new_grid:
        return table
    dim = table.shape[-1]
    image = table.reshape(1, *old_grid, dim).permute(0, 3, 1, 2).float()
    align = align_corners if mode in ("bilinear", "bicubic") else None
    image = F.interpolate(image, size=new_grid, mode=mode, antialias=antialias, align_corners=align)
    return image.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(table.dtype)


def resample_with_prefix(table: torch.Tensor, prefix: int, old_grid: tuple[int, int],
                         new_grid: tuple[int, int], mode: str = "bicubic", antialias: bool = False,
                         align_corners: bool = False) -> torch.Tensor:
    """Resample the patch part of a table whose first ``prefix`` rows ([class] slot) stay as they are."""
    patches = resample_grid(table[:, prefix:], old_grid, new_grid, mode, antialias, align_corners)
    return torch.cat([table[:, :prefix], patches], dim=1)


class _CachedByGrid(nn.Module):
    """Caches tables for grids other than the native one, while no gradient flows through them."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple, torch.Tensor] = {}

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        raise NotImplementedError

    def _version(self) -> tuple:
        return tuple((p._version, p.data_ptr(), p.dtype, p.device) for p in self.parameters())

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        """The table of ``grid``, moved to ``device`` when one is given (tables computed without parameters are
        made on the CPU)."""
        grid = tuple(grid)
        needs_grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        # Under torch.compile a cache lookup would fail its guard and recompile the model on the next call.
        if needs_grad or torch.compiler.is_compiling():
            return self._compute(grid).to(device)
        key = (grid, device) + self._version()
        table = self._cache.get(key)
        if table is None:
            if len(self._cache) >= 8:
                self._cache.clear()
            table = self._cache[key] = self._compute(grid).to(device)
        return table


class LearnedPositionEmbedding(_CachedByGrid):
    """1-D learned table (the paper's default), one row per token including the [class] slot."""

    def __init__(self, grid: tuple[int, int], dim: int, prefix: int, mode: str = "bicubic",
                 antialias: bool = False, align_corners: bool = False):
        super().__init__()
        self.grid, self.prefix = tuple(grid), prefix
        self.mode, self.antialias, self.align_corners = mode, antialias, align_corners
        self.weight = nn.Parameter(torch.empty(1, prefix + grid[0] * grid[1], dim))
        nn.init.normal_(self.weight, std=0.02)

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        return resample_with_prefix(self.weight, self.prefix, self.grid, grid, self.mode, self.antialias,
                                    self.align_corners)

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        return self.weight if tuple(grid) == self.grid else super().forward(grid, device)

    @torch.no_grad()
    def resize(self, grid: tuple[int, int]) -> None:
        self.weight = nn.Parameter(self._compute(tuple(grid)).detach().clone())
        self.grid = tuple(grid)
        self._cache.clear()


class Learned2dPositionEmbedding(_CachedByGrid):
    """2-D learned embedding: a row (Y) and a column (X) table of D/2 each, concatenated per patch."""

    def __init__(self, grid: tuple[int, int], dim: int, prefix: int):
        super().__init__()
        self.grid, self.prefix = tuple(grid), prefix
        self.rows = nn.Parameter(torch.empty(grid[0], dim // 2))
        self.cols = nn.Parameter(torch.empty(grid[1], dim // 2))
        self.prefix_embed = nn.Parameter(torch.empty(1, prefix, dim)) if prefix else None
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)

    @staticmethod
    def _resample_axis(table: torch.Tensor, length: int) -> torch.Tensor:
        if table.shape[0] == length:
            return table
        line = table.t().unsqueeze(0).float()
        return F.interpolate(line, size=length, mode="linear", align_corners=False)[0].t().to(table.dtype)

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        rows = self._resample_axis(self.rows, grid[0])
        cols = self._resample_axis(self.cols, grid[1])
        table = torch.cat([rows[:, None].expand(-1, grid[1], -1), cols[None].expand(grid[0], -1, -1)], dim=-1)
        table = table.reshape(1, grid[0] * grid[1], -1)
        if self.prefix_embed is not None:
            table = torch.cat([self.prefix_embed, table], dim=1)
        return table

    @torch.no_grad()
    def resize(self, grid: tuple[int, int]) -> None:
        self.rows = nn.Parameter(self._resample_axis(self.rows, grid[0]).clone())
        self.cols = nn.Parameter(self._resample_axis(self.cols, grid[1]).clone())
        self.grid = tuple(grid)
        self._cache.clear()


def sincos_2d(grid: tuple[int, int], dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine table (rows*cols, D): [sin x, cos x, sin y, cos y], D/4 frequencies each."""
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / max(quarter - 1, 1))
    y, x = torch.meshgrid(torch.arange(grid[0], dtype=torch.float64),
                          torch.arange(grid[1], dtype=torch.float64), indexing="ij")
    x = x.reshape(-1, 1) * omega
    y = y.reshape(-1, 1) * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).float()


class SinCos2dPositionEmbedding(_CachedByGrid):
    """Fixed sine-cosine embedding, computed for any grid; the [class] slot gets zeros."""

    def __init__(self, grid: tuple[int, int], dim: int, prefix: int):
        super().__init__()
        self.grid, self.dim, self.prefix = tuple(grid), dim, prefix

    def _version(self) -> tuple:
        return ()

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        table = sincos_2d(grid, self.dim)
        return F.pad(table, (0, 0, self.prefix, 0)).unsqueeze(0)

    def resize(self, grid: tuple[int, int]) -> None:
        self.grid = tuple(grid)


class RelativePositionLogits(nn.Module):
    """1-D relative attention (appendix D.4): every offset q - k between two tokens of the sequence has
    a learned embedding; the query attends to these embeddings as keys, and the resulting logits are
    added to the content logits before the softmax. Offsets beyond the trained range are clamped."""

    def __init__(self, max_tokens: int, num_heads: int, head_dim: int):
        super().__init__()
        self.max_tokens = max_tokens
        self.weight = nn.Parameter(torch.empty(num_heads, 2 * max_tokens - 1, head_dim))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """(B, h, T, d) queries -> (B, h, T, T) logits q_i . R[i - j]."""
        tokens = q.shape[-2]
        position = torch.arange(tokens, device=q.device)
        span = self.max_tokens - 1
        offsets = (position[:, None] - position[None, :]).clamp(-span, span) + span
        per_offset = q @ self.weight.transpose(-2, -1).unsqueeze(0)  # (B, h, T, 2M - 1)
        return per_offset.gather(-1, offsets.expand(*q.shape[:2], tokens, tokens))


def rope_coordinates(grid: tuple[int, int], kind: str, offset: float = 0.0, ref_grid: int | None = None,
                     xy: bool = False) -> torch.Tensor:
    """(rows*cols, 2) float32 coordinates of the patches in row-major order: the row and the column, or (``xy``)
    the column and the row. ``index``: the patch's indices plus ``offset``, rescaled so that each axis spans
    ``ref_grid`` cells when one is given; ``centered``: the patch centres (k + 0.5 + offset) / n mapped to [-1, 1]."""
    axes = []
    for cells in grid:
        if kind == "centered":
            axis = (torch.arange(0.5, cells, dtype=torch.float32) + offset) / cells
        else:
            axis = torch.arange(cells, dtype=torch.float32) + offset
            if ref_grid is not None:
                axis = axis / cells * ref_grid
        axes.append(axis)
    rows, cols = torch.meshgrid(axes[0], axes[1], indexing="ij")
    coords = torch.stack([cols, rows] if xy else [rows, cols], dim=-1).reshape(-1, 2)
    return 2.0 * coords - 1.0 if kind == "centered" else coords


class RotaryEmbedding(_CachedByGrid):
    """Option rope: rotary position embeddings (Su et al. 2021) over the 2-D patch grid. Each head's width d is
    cut into d/2 pairs; the first d/4 pairs turn with the first coordinate, the rest with the second, by
    angle = coordinate x frequency. ``forward`` gives the (2, ..., T, d) cosines and sines of those angles for
    the T tokens of a grid, each repeated over its pair; the prefix tokens' rows are cos 1, sin 0 (not rotated).

    ``axial``: frequencies theta^(-j / (d/4)) for j < d/4 on each axis (index coordinates), or, on centred
    coordinates, 2 pi theta^(-j / (d/4)) (DINOv3's periods in turns). ``mixed`` (RoPE-ViT): learned
    (2, depth, heads, d/2) frequencies, each pair turning with a learned mix of both coordinates, one table per
    block and head."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        c = config
        self.kind, self.grid_kind, self.theta = c.rope, c.rope_grid, c.rope_theta
        self.offset, self.ref_grid, self.xy, self.half = c.rope_offset, c.rope_ref_grid, c.rope_xy, c.rope_half
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
        """(N, 2) coordinates -> (..., N, d/2) angles, one per pair."""
        if self.freqs is not None:
            coords = coords.to(self.freqs.device)
            freqs = self.freqs.float()
            return coords[:, 0, None] * freqs[0].unsqueeze(-2) + coords[:, 1, None] * freqs[1].unsqueeze(-2)
        if self.grid_kind == "centered":
            angles = 2 * torch.pi * coords[:, :, None] / self.theta ** self.exponents
        else:
            angles = coords[:, :, None] * (1.0 / self.theta ** self.exponents)
        return angles.flatten(1)

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        coords = rope_coordinates(grid, self.grid_kind, self.offset, self.ref_grid, self.xy)
        angles = self._angles(coords)
        # Each angle over its pair, stacked: torch's ONNX exporter mis-exports repeat_interleave (it corrupts
        # constants that other nodes of the graph share).
        angles = torch.cat([angles] * 2, dim=-1) if self.half else torch.stack([angles] * 2, dim=-1).flatten(-2)
        table = torch.stack([angles.cos(), angles.sin()])
        identity = torch.zeros_like(table[..., :1, :]).expand(*table.shape[:-2], self.prefix, -1).clone()
        identity[0] = 1.0
        return torch.cat([identity, table], dim=-2)

    def resize(self, grid: tuple[int, int]) -> None:
        """Nothing to resample: the table is computed for any grid."""


def apply_rope(x: torch.Tensor, table: torch.Tensor, half: bool) -> torch.Tensor:
    """Rotate (B, h, T, d) queries or keys by a (2, T, d) or (2, h, T, d) table of cosines and sines."""
    if half:
        first, second = x.chunk(2, dim=-1)
        turned = torch.cat([-second, first], dim=-1)
    else:
        turned = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)
    return (x * table[0] + turned * table[1]).to(x.dtype)


def make_rope(config: ViTConfig) -> RotaryEmbedding | None:
    return RotaryEmbedding(config) if config.rope != "none" else None


def make_position_embedding(config: ViTConfig) -> nn.Module | None:
    prefix = config.pos_prefix_tokens
    grid, dim = config.grid_size, config.dim
    if config.pos_embed == "learned":
        return LearnedPositionEmbedding(grid, dim, prefix, config.pos_interp, config.pos_interp_antialias,
                                        config.pos_interp_align_corners)
    if config.pos_embed == "learned-2d":
        return Learned2dPositionEmbedding(grid, dim, prefix)
    if config.pos_embed == "sincos-2d":
        return SinCos2dPositionEmbedding(grid, dim, prefix)
    return None  # "none", and "relative", which lives in the attention layers
