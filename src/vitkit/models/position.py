"""Position embeddings of the paper's ablation (appendix D.4) and their resampling to new grids.

Each kind is a module mapping a patch grid (rows, cols) to the (1, prefix + rows*cols, D) table that
eq. (1) adds to the token sequence; ``prefix`` counts the rows of prefix tokens ([class], distillation,
registers; none with ``no_embed_class``), which are never resampled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .config import ViTConfig


def square_of(rows: torch.Tensor | int, cols: torch.Tensor | int) -> torch.Tensor | int:
    """The longer side of a grid (C-RADIO resamples its table to a square of it, then crops): an int, or a tensor
    where the sides are (an ONNX graph's, a NaFlex batch's)."""
    if isinstance(rows, torch.Tensor) or isinstance(cols, torch.Tensor):
        return torch.maximum(torch.as_tensor(rows), torch.as_tensor(cols))
    return max(rows, cols)


def resample_grid(table: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int],
                  mode: str = "bicubic", antialias: bool = False, align_corners: bool = False,
                  crop: bool = False) -> torch.Tensor:
    """Interpolate a (1, rows*cols, D) patch table from ``old_grid`` to ``new_grid`` in 2-D; with ``crop``, to a
    square of the new grid's longer side, of which the top-left rows x cols are kept (C-RADIO)."""
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if table.ndim != 3 or table.shape[1] != old_grid[0] * old_grid[1]:
        raise ValueError(f"position table of shape {tuple(table.shape)} does not hold a {old_grid} grid")
    sizes = (square_of(*new_grid),) * 2 if crop else new_grid
    if torch.jit.is_tracing():  # an ONNX graph for any image size: the resize as weights computed in it, per axis
        down, across = (resample_weights(torch.arange(new, device=table.device), size, old, mode, antialias,
                                         align_corners)
                        for new, size, old in zip(new_grid, sizes, old_grid))
        image = torch.einsum("rh,hwd->rwd", down, table.reshape(*old_grid, table.shape[-1]).float())
        return torch.einsum("cw,rwd->rcd", across, image).reshape(1, -1, table.shape[-1]).to(table.dtype)
    if old_grid == new_grid:
        return table
    dim = table.shape[-1]
    image = table.reshape(1, *old_grid, dim).permute(0, 3, 1, 2).float()
    align = align_corners if mode in ("bilinear", "bicubic") else None
    image = F.interpolate(image, size=sizes, mode=mode, antialias=antialias, align_corners=align)
    image = image[:, :, :new_grid[0], :new_grid[1]]
    return image.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(table.dtype)


def resample_with_prefix(table: torch.Tensor, prefix: int, old_grid: tuple[int, int],
                         new_grid: tuple[int, int], mode: str = "bicubic", antialias: bool = False,
                         align_corners: bool = False, crop: bool = False) -> torch.Tensor:
    """Resample the patch part of a table whose first ``prefix`` rows ([class] slot) stay as they are."""
    patches = resample_grid(table[:, prefix:], old_grid, new_grid, mode, antialias, align_corners, crop)
    return torch.cat([table[:, :prefix], patches], dim=1)


def _cubic(x: torch.Tensor, a: float) -> torch.Tensor:
    """Keys' cubic convolution kernel with parameter ``a`` (-0.75 as torch resizes, -0.5 as its antialiased resize)."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x <= 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def resample_weights(index: torch.Tensor, size: torch.Tensor | int, length: int, mode: str, antialias: bool = False,
                     align_corners: bool = False) -> torch.Tensor:
    """Cell ``index`` of an axis of ``length`` cells resized to ``size`` as ``F.interpolate`` makes it: a weighted sum
    of the input cells, returned as the (..., length) weights (``index`` and ``size`` broadcast together).

    A resize is linear, so this is the same resize written as arithmetic on tensors: an ONNX graph computes it for
    sizes known only when it runs (opset 17 has no antialiased Resize), and a NaFlex batch for each image's own grid
    at once. The kernels are torch's: linear (clamped source), cubic with a = -0.75 and edge cells repeated, nearest,
    nearest-exact, area (adaptive average pooling); antialiased linear and cubic (a = -0.5) widen the kernel by the
    scale when shrinking and normalise the weights."""
    cells = torch.arange(length, device=index.device, dtype=torch.float32)
    index = index.to(torch.float32).unsqueeze(-1)
    size = torch.as_tensor(size, device=index.device).to(torch.float32).unsqueeze(-1)
    if mode in ("nearest", "nearest-exact", "area") or not align_corners:
        scale = length / size
    else:
        scale = torch.where(size > 1, (length - 1) / (size - 1).clamp(min=1), torch.zeros_like(size))
    if mode in ("nearest", "nearest-exact"):
        source = torch.floor((index + (0.5 if mode == "nearest-exact" else 0.0)) * scale).clamp(max=length - 1)
        return (cells == source).to(torch.float32)
    if mode == "area":
        start = torch.floor(index * length / size)
        end = torch.ceil((index + 1) * length / size)
        inside = ((cells >= start) & (cells < end)).to(torch.float32)
        return inside / (end - start)
    if mode not in ("bilinear", "bicubic"):
        raise ValueError(f"resample mode {mode!r}; expected one of nearest, nearest-exact, area, bilinear, bicubic")
    if antialias:
        support = (1.0 if mode == "bilinear" else 2.0) * scale.clamp(min=1)
        center = scale * (index + 0.5)
        first = torch.floor(center - support + 0.5).clamp(min=0)  # torch truncates: the same once clamped at 0
        last = torch.floor(center + support + 0.5).clamp(max=length)
        offset = (cells - center + 0.5) / scale.clamp(min=1)
        kernel = (1 - offset.abs()).clamp(min=0) if mode == "bilinear" else _cubic(offset, -0.5)
        weights = kernel * ((cells >= first) & (cells < last))
        total = weights.sum(dim=-1, keepdim=True)
        return weights / torch.where(total == 0, torch.ones_like(total), total)
    source = index * scale if align_corners else (index + 0.5) * scale - 0.5
    if mode == "bilinear":
        source = source.clamp(min=0, max=length - 1)
        return (1 - (cells - source).abs()).clamp(min=0)
    floor = torch.floor(source)
    weights = torch.zeros_like(cells * source)
    for tap in (-1, 0, 1, 2):  # four cells around the source, clamped to the edges
        cell = (floor + tap).clamp(0, length - 1)
        weights = weights + (cells == cell) * _cubic(source - floor - tap, -0.75)
    return weights


def table_at(table: torch.Tensor, grid: tuple[int, int], rows: torch.Tensor, cols: torch.Tensor,
             grid_rows: torch.Tensor | int, grid_cols: torch.Tensor | int, mode: str, antialias: bool = False,
             align_corners: bool = False, crop: bool = False) -> torch.Tensor:
    """The rows of a (1, rows*cols, D) patch table on ``grid`` resampled to other grids, at the patches (``rows``,
    ``cols``) of grids (``grid_rows``, ``grid_cols``), all broadcast together: (..., D). With ``crop``, each grid's
    table is the top left of the table resampled to a square of its longer side (C-RADIO)."""
    if crop:
        grid_rows = grid_cols = square_of(grid_rows, grid_cols)
    image = table.reshape(*grid, table.shape[-1]).float()
    down = resample_weights(rows, grid_rows, grid[0], mode, antialias, align_corners)
    across = resample_weights(cols, grid_cols, grid[1], mode, antialias, align_corners)
    down, across = torch.broadcast_tensors(down[..., :, None], across[..., None, :])
    return torch.einsum("...hw,hwd->...d", down * across, image).to(table.dtype)


class _CachedByGrid(nn.Module):
    """Caches tables for grids other than the native one, while no gradient flows through them."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple, torch.Tensor] = {}

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        raise NotImplementedError

    def at(self, rows: torch.Tensor, cols: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """The (B, prefix + N, D) table rows of B images' N patches at (``rows``, ``cols``) (each (B, N)) of their
        own grids (``grids``: (B, 2) rows, columns), as ``forward(grid)`` gives them for each image's grid."""
        raise NotImplementedError

    def _version(self) -> tuple:
        return tuple((p._version, p.data_ptr(), p.dtype, p.device) for p in self.parameters())

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        """The table of ``grid``, moved to ``device`` when one is given (tables computed without parameters are
        made on the CPU)."""
        grid = tuple(grid)
        needs_grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        # Under torch.compile a cache lookup would fail its guard and recompile the model on the next call; under
        # ONNX tracing a cached table would be a constant where the graph must compute it for the input's size.
        if needs_grad or torch.compiler.is_compiling() or torch.jit.is_tracing():
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
                 antialias: bool = False, align_corners: bool = False, crop: bool = False):
        super().__init__()
        self.grid, self.prefix = tuple(grid), prefix
        self.mode, self.antialias, self.align_corners, self.crop = mode, antialias, align_corners, crop
        self.weight = nn.Parameter(torch.empty(1, prefix + grid[0] * grid[1], dim))
        nn.init.normal_(self.weight, std=0.02)

    def _compute(self, grid: tuple[int, int], mode: str | None = None, antialias: bool | None = None) -> torch.Tensor:
        return resample_with_prefix(self.weight, self.prefix, self.grid, grid, mode or self.mode,
                                    self.antialias if antialias is None else antialias, self.align_corners, self.crop)

    def forward(self, grid: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
        native = tuple(grid) == self.grid and not torch.jit.is_tracing()
        return self.weight if native else super().forward(grid, device)

    def at(self, rows: torch.Tensor, cols: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        patches = table_at(self.weight[:, self.prefix:], self.grid, rows, cols, grids[:, None, 0], grids[:, None, 1],
                           self.mode, self.antialias, self.align_corners, self.crop)
        if not self.prefix:  # no empty concatenation: OpenVINO's converter mis-reads an empty slice's shape
            return patches
        return torch.cat([self.weight[:, :self.prefix].expand(grids.shape[0], -1, -1), patches], dim=1)

    @torch.no_grad()
    def resize(self, grid: tuple[int, int], mode: str | None = None, antialias: bool | None = None) -> None:
        """Resample the table to ``grid`` for good, by its own ``mode`` and ``antialias`` unless others are given
        (for this resize only)."""
        self.weight = nn.Parameter(self._compute(tuple(grid), mode, antialias).detach().clone())
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
        if torch.jit.is_tracing():  # an ONNX graph for any image size
            return Learned2dPositionEmbedding._axis_at(table, torch.arange(length, device=table.device), length)
        if table.shape[0] == length:
            return table
        line = table.t().unsqueeze(0).float()
        return F.interpolate(line, size=length, mode="linear", align_corners=False)[0].t().to(table.dtype)

    @staticmethod
    def _axis_at(table: torch.Tensor, index: torch.Tensor, length: torch.Tensor | int) -> torch.Tensor:
        """Rows ``index`` of an axis table (cells, D/2) resized linearly to ``length`` cells: (..., D/2)."""
        weights = resample_weights(index, length, table.shape[0], "bilinear")
        return (weights @ table.float()).to(table.dtype)

    def at(self, rows: torch.Tensor, cols: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        table = torch.cat([self._axis_at(self.rows, rows, grids[:, None, 0]),
                           self._axis_at(self.cols, cols, grids[:, None, 1])], dim=-1)
        if self.prefix_embed is not None:
            table = torch.cat([self.prefix_embed.expand(grids.shape[0], -1, -1), table], dim=1)
        return table

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


def sincos_2d(rows: torch.Tensor, cols: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine rows (..., D) of patches at (``rows``, ``cols``): [sin x, cos x, sin y, cos y], D/4
    frequencies each (x the column)."""
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float64) / max(quarter - 1, 1))
    x = cols.to(torch.float64)[..., None] * omega.to(cols.device)
    y = rows.to(torch.float64)[..., None] * omega.to(rows.device)
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=-1).float()


def grid_cells(grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) indices of a grid's cells in row-major order, two (rows*cols,) tensors."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    return rows.reshape(-1), cols.reshape(-1)


class SinCos2dPositionEmbedding(_CachedByGrid):
    """Fixed sine-cosine embedding, computed for any grid; the [class] slot gets zeros."""

    def __init__(self, grid: tuple[int, int], dim: int, prefix: int):
        super().__init__()
        self.grid, self.dim, self.prefix = tuple(grid), dim, prefix

    def _version(self) -> tuple:
        return ()

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        return F.pad(sincos_2d(*grid_cells(grid), self.dim), (0, 0, self.prefix, 0)).unsqueeze(0)

    def at(self, rows: torch.Tensor, cols: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        return F.pad(sincos_2d(rows, cols, self.dim), (0, 0, self.prefix, 0))

    def resize(self, grid: tuple[int, int]) -> None:
        self.grid = tuple(grid)


class AxesPositionEmbedding(_CachedByGrid):
    """Option pos_embed='learned-axes' (Gemma 4): a learned table per axis, (2, cells, D), the first looked up by
    the patch's column, the second by its row; a patch's embedding is the sum of the two. Nothing is resampled:
    any grid whose sides are at most ``cells`` is looked up as it is. Prefix tokens, if any, get zeros."""

    def __init__(self, cells: int, dim: int, prefix: int):
        super().__init__()
        self.prefix = prefix
        self.weight = nn.Parameter(torch.empty(2, cells, dim))
        nn.init.normal_(self.weight, std=0.02)

    def _check(self, sides: list[int]) -> None:
        if max(sides) > self.weight.shape[1]:
            raise InputError(f"a grid of {sides[0]}x{sides[1]} patches; this position table has "
                             f"{self.weight.shape[1]} cells per axis, so at most that many patches a side")

    def _rows(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        patches = self.weight[0][cols.to(self.weight.device)] + self.weight[1][rows.to(self.weight.device)]
        return F.pad(patches, (0, 0, self.prefix, 0))

    def _compute(self, grid: tuple[int, int]) -> torch.Tensor:
        if not torch.jit.is_tracing():
            self._check(list(grid))
        return self._rows(*grid_cells(grid)).unsqueeze(0)

    def at(self, rows: torch.Tensor, cols: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing():
            self._check(grids.max(dim=0).values.tolist())
        return self._rows(rows, cols)

    def resize(self, grid: tuple[int, int]) -> None:
        """Nothing to resample: every grid that fits is looked up."""
        self._check(list(grid))


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


def make_position_embedding(config: ViTConfig) -> nn.Module | None:
    prefix = config.pos_prefix_tokens
    grid, dim = config.grid_size, config.dim
    if config.pos_embed == "learned":
        return LearnedPositionEmbedding(config.pos_grid or grid, dim, prefix, config.pos_interp,
                                        config.pos_interp_antialias, config.pos_interp_align_corners,
                                        config.pos_interp_crop)
    if config.pos_embed == "learned-2d":
        return Learned2dPositionEmbedding(grid, dim, prefix)
    if config.pos_embed == "sincos-2d":
        return SinCos2dPositionEmbedding(grid, dim, prefix)
    if config.pos_embed == "learned-axes":
        return AxesPositionEmbedding(config.pos_axis_cells, dim, prefix)
    return None  # "none", and "relative", which lives in the attention layers
