"""Building blocks of the encoder: patch projection, multi-head self-attention, MLP, pre-LN block, and the
attention-pool head; the options of later families (QK-norm, QuickGELU, SwiGLU, LayerScale, rotary embeddings,
RMSNorm, sub-LN, bias switches; Gemma 4's pixel scaling, value norm, attention scale, GeGLU, clamped dense layers
and sandwich norms) are marked."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .config import GATED_MLPS, ViTConfig
from .naflex import PatchBatch
from .position import RelativePositionLogits, grid_cells
from .rotary import apply_rope


class PatchEmbed(nn.Module):
    """Split the image into PxP patches and project each linearly to D (a PxP conv with stride P).

    A hybrid first runs a CNN ``backbone`` (anything with ``out_chans`` and ``stride``) and cuts its
    feature map instead of the pixels, usually into 1x1 patches (section 3.2)."""

    def __init__(self, in_chans: int, dim: int, patch_size: int, backbone: nn.Module | None = None,
                 bias: bool = True, norm: nn.Module | None = None, scale_pixels: bool = False):
        super().__init__()
        self.scale_pixels = scale_pixels  # Option scale_pixels (Gemma 4): [0, 1] pixels to [-1, 1], 2 (x - 0.5)
        self.in_chans = in_chans
        self.patch_size = patch_size
        self.backbone = backbone
        self.stride = patch_size * (backbone.stride if backbone is not None else 1)
        features = backbone.out_chans if backbone is not None else in_chans
        self.proj = nn.Conv2d(features, dim, kernel_size=patch_size, stride=patch_size, bias=bias)
        self.norm = norm if norm is not None else nn.Identity()  # Option patch_norm (AIMv2)

    def project_patches(self, patches: torch.Tensor) -> torch.Tensor:
        """(B, N, P*P*C) pixel patches, each flattened row by row with the channels last (NaFlex), -> (B, N, D):
        the same kernel as the convolution, applied as one linear map."""
        weight = self.proj.weight.permute(0, 2, 3, 1).reshape(self.proj.out_channels, -1)
        return self.norm(F.linear(self._scaled(patches.to(weight.dtype)), weight, self.proj.bias))

    def _scaled(self, pixels: torch.Tensor) -> torch.Tensor:
        return 2 * (pixels - 0.5) if self.scale_pixels else pixels

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """(B, C, H, W) images -> (B, N, D) patch embeddings and the (H/P, W/P) grid."""
        check_images(images, self.in_chans, self.stride)
        x = self.proj(self._scaled(images) if self.backbone is None else self.backbone(images))
        grid = (x.shape[-2], x.shape[-1])
        return self.norm(x.flatten(2).transpose(1, 2)), grid


def check_images(images: torch.Tensor, in_chans: int, multiple: int) -> None:
    """Shape and dtype checks only: nothing here waits for the device."""
    if images.ndim != 4:
        raise InputError(f"expected images of shape (batch, {in_chans}, height, width), got {tuple(images.shape)}")
    if not images.is_floating_point():
        raise InputError(f"expected floating-point images (normalised as the weights were trained), got "
                         f"{images.dtype} images of shape {tuple(images.shape)}")
    batch, channels, height, width = images.shape
    if batch == 0 or height == 0 or width == 0:
        raise InputError(f"expected at least one image of non-zero size, got shape {tuple(images.shape)}")
    if channels != in_chans:
        raise InputError(f"expected {in_chans} input channels, got {channels} (images of shape {tuple(images.shape)})")
    if height % multiple or width % multiple:
        raise InputError(
            f"image sides must be multiples of the patch size {multiple}, got {height}x{width}"
        )


def make_norm(config: ViTConfig, width: int, scale: bool = True) -> nn.Module:
    """The family's norm over ``width`` channels: LayerNorm, or (Option norm='rms') RMSNorm, with its eps; without
    ``scale``, no learned weight (nor bias)."""
    if config.norm == "rms":
        return nn.RMSNorm(width, eps=config.ln_eps, elementwise_affine=scale)
    return nn.LayerNorm(width, eps=config.ln_eps, elementwise_affine=scale)


class ClampedLinear(nn.Linear):
    """Option clamp_linears (Gemma 4): a dense layer whose output is cut into ``parts`` equal pieces (q, k and v of a
    packed qkv; gate and value of a gated MLP), each computed from the input clamped to its own bounds and clamped
    to its own bounds in turn. ``bounds`` holds (input min, input max, output min, output max) of each piece, read
    with the weights; unbounded (infinite) until then."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, parts: int = 1):
        super().__init__(in_features, out_features, bias=bias)
        self.parts = parts
        self.register_buffer("bounds", torch.tensor([[-math.inf], [math.inf]] * 2).repeat(1, parts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.weight.chunk(self.parts)
        biases = self.bias.chunk(self.parts) if self.bias is not None else [None] * self.parts
        low_in, high_in, low_out, high_out = self.bounds.to(x.dtype)
        pieces = [F.linear(x.clamp(low_in[i], high_in[i]), weights[i], biases[i]).clamp(low_out[i], high_out[i])
                  for i in range(self.parts)]
        return pieces[0] if self.parts == 1 else torch.cat(pieces, dim=-1)


def make_linear(clamped: bool, in_features: int, out_features: int, bias: bool = True, parts: int = 1
                ) -> nn.Linear:
    """A dense layer of the blocks: clamped in ``parts`` pieces (Option clamp_linears) or plain."""
    if clamped:
        return ClampedLinear(in_features, out_features, bias, parts)
    return nn.Linear(in_features, out_features, bias=bias)


class Attention(nn.Module):
    """MSA: h heads of width D/h, softmax(q k^T / sqrt(D/h)) v, concatenated and projected by D x D.

    Options: QK-norm, queries and keys turned by rotary position embeddings (``rope``, a table from
    :class:`RotaryEmbedding`), keys without bias (``k_bias``), a norm before the projection (``attn_norm``); Gemma
    4's norm without scale on the values (``v_norm``), its logit scale (``attn_scale``: 1) and clamped layers."""

    def __init__(self, c: ViTConfig, relative_tokens: int = 0):
        super().__init__()
        self.num_heads, self.head_dim = c.num_heads, c.head_dim
        self.scale = self.head_dim ** -0.5 if c.attn_scale is None else c.attn_scale
        separate_bias = c.qkv_bias and not c.k_bias  # Option k_bias=False: only q and v have a bias
        self.qkv = make_linear(c.clamp_linears, c.dim, 3 * c.dim, c.qkv_bias and not separate_bias, parts=3)
        self.q_bias = nn.Parameter(torch.zeros(c.dim)) if separate_bias else None
        self.v_bias = nn.Parameter(torch.zeros(c.dim)) if separate_bias else None
        # Option qk_norm: a norm on every head's queries and keys before their product.
        self.q_norm = make_norm(c, self.head_dim) if c.qk_norm else nn.Identity()
        self.k_norm = make_norm(c, self.head_dim) if c.qk_norm else nn.Identity()
        self.v_norm = make_norm(c, self.head_dim, scale=False) if c.v_norm else nn.Identity()
        self.rope_half, self.rope_split = c.rope_half, c.rope_split
        self.attn_dropout = c.attn_dropout
        self.norm = make_norm(c, c.dim) if c.attn_norm else nn.Identity()
        self.proj = make_linear(c.clamp_linears, c.dim, c.dim, c.proj_bias)
        self.proj_drop = nn.Dropout(c.dropout)
        self.relative = RelativePositionLogits(relative_tokens, c.num_heads, self.head_dim) if relative_tokens else None

    def _heads(self, x: torch.Tensor, rope: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = x.shape
        qkv = self.qkv(x)  # called as a module (not through its weight), so that a LoRA wrapped around it acts
        if self.q_bias is not None:
            qkv = qkv + torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])
        q, k, v = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k, v = self.q_norm(q), self.k_norm(k), self.v_norm(v)  # each (B, h, T, D/h)
        if rope is not None:
            q, k = (apply_rope(x, rope, self.rope_half, self.rope_split) for x in (q, k))
        return q, k, v

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        batch, _, tokens, _ = out.shape
        return self.proj_drop(self.proj(self.norm(out.transpose(1, 2).reshape(batch, tokens, -1))))

    def _relative_logits(self, q: torch.Tensor) -> torch.Tensor | None:
        return None if self.relative is None else self.relative(q * self.scale)

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None, mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """``mask``: (B, 1, 1, T) bool, the keys that may be attended to (NaFlex padding is not)."""
        q, k, v = self._heads(x, rope)
        dropout = self.attn_dropout if self.training else 0.0
        bias = self._relative_logits(q)
        return self._merge(F.scaled_dot_product_attention(q, k, v, attn_mask=bias if mask is None else mask,
                                                          dropout_p=dropout, scale=self.scale))

    def forward_with_probs(self, x: torch.Tensor, rope: torch.Tensor | None = None, mask: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same attention computed explicitly, also returning the (B, h, T, T) probabilities."""
        q, k, v = self._heads(x, rope)
        logits = (q * self.scale) @ k.transpose(-2, -1)
        bias = self._relative_logits(q)
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        probs = logits.softmax(dim=-1)
        weights = F.dropout(probs, self.attn_dropout, self.training)
        return self._merge(weights @ v), probs


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation of OpenAI's CLIP weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_gelu(gelu: str) -> nn.Module:
    return QuickGELU() if gelu == "quick" else nn.GELU(approximate="tanh" if gelu == "tanh" else "none")


class Mlp(nn.Module):
    """Linear(D, mlp) -> GELU -> Linear(mlp, D), with dropout after each dense layer as in Google's code.

    Options: ``kind='swiglu'``, fc1 yields a gate and a value of width mlp each, and SiLU(gate) * value enters fc2;
    ``kind='geglu'``, the same with GELU(gate) (Gemma 4); ``kind='relu'``, ReLU in place of GELU (TIPSv2's text
    tower); ``norm``, a norm on the hidden activations before fc2 (sub-LN); ``bias=False``, no biases;
    ``clamped``, clamped dense layers (Gemma 4)."""

    def __init__(self, dim: int, hidden: int, gelu: str = "exact", dropout: float = 0.0, kind: str = "gelu",
                 norm: nn.Module | None = None, bias: bool = True, clamped: bool = False):
        super().__init__()
        self.gated = kind in GATED_MLPS
        self.fc1 = make_linear(clamped, dim, 2 * hidden if self.gated else hidden, bias, 2 if self.gated else 1)
        self.act = nn.SiLU() if kind == "swiglu" else nn.ReLU() if kind == "relu" else make_gelu(gelu)
        self.norm = norm if norm is not None else nn.Identity()
        self.fc2 = make_linear(clamped, hidden, dim, bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.gated:
            gate, value = x.chunk(2, dim=-1)
            x = self.act(gate) * value
        else:
            x = self.act(x)
        return self.drop(self.fc2(self.norm(self.drop(x))))


class LayerScale(nn.Module):
    """Option layer_scale (DeiT-III, DINOv2): a residual branch multiplied by a learned per-channel gamma."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.init = init
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample, rescaling the survivors."""

    def __init__(self, rate: float = 0.0):
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


class Adapter(nn.Module):
    """Option adapter_dim (AdaptFormer, Chen et al. 2022): a bottleneck MLP, up(ReLU(down(x))) * scale, beside a
    block's MLP; ``up`` starts at zero, so an adapted model starts as the model it adapts."""

    def __init__(self, dim: int, width: int, scale: float):
        super().__init__()
        self.scale = scale
        self.down = nn.Linear(dim, width)
        self.act = nn.ReLU()
        self.up = nn.Linear(width, dim)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """AdaptFormer's init: ``down`` as torch initialises a linear layer (Kaiming uniform), zero biases and ``up``."""
        self.down.reset_parameters()
        for tensor in (self.down.bias, self.up.weight, self.up.bias):
            nn.init.zeros_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(x))) * self.scale


class Block(nn.Module):
    """Pre-LN encoder block: z' = MSA(LN(z)) + z (eq. 2); z = MLP(LN(z')) + z' (eq. 3); with LayerScale the
    branches are ls1(MSA(...)) and ls2(MLP(...)); ``rope`` is the rotary table of the tokens, if any. Option
    adapter_dim (AdaptFormer): z = MLP(LN(z')) + z' + Adapter(z'), the adapter reading the stream before LN.
    Option sandwich_norm (Gemma 4): each branch normalised at its output too, z' = post_norm1(MSA(LN(z))) + z and
    z = post_norm2(MLP(LN(z'))) + z'."""

    def __init__(self, c: ViTConfig, drop_path: float = 0.0, relative_tokens: int = 0):
        super().__init__()
        self.norm1 = make_norm(c, c.dim)
        self.attn = Attention(c, relative_tokens)
        self.ls1 = LayerScale(c.dim, c.layer_scale) if c.layer_scale is not None else nn.Identity()
        self.norm2 = make_norm(c, c.dim)
        self.mlp = Mlp(c.dim, c.mlp_dim, c.gelu, c.dropout, c.mlp, make_norm(c, c.mlp_dim) if c.mlp_norm else None,
                       c.proj_bias, c.clamp_linears)
        self.ls2 = LayerScale(c.dim, c.layer_scale) if c.layer_scale is not None else nn.Identity()
        self.post_norm1 = make_norm(c, c.dim) if c.sandwich_norm else nn.Identity()
        self.post_norm2 = make_norm(c, c.dim) if c.sandwich_norm else nn.Identity()
        self.drop_path = DropPath(drop_path)
        self.adapter = Adapter(c.dim, c.adapter_dim, c.adapter_scale) if c.adapter_dim else None

    def forward(self, z: torch.Tensor, rope: torch.Tensor | None = None, mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        attended = self.attn(self.norm1(z), rope, mask)
        return self._feed_forward(z + self.drop_path(self.ls1(self.post_norm1(attended))))

    def forward_with_probs(self, z: torch.Tensor, rope: torch.Tensor | None = None, mask: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        attended, probs = self.attn.forward_with_probs(self.norm1(z), rope, mask)
        return self._feed_forward(z + self.drop_path(self.ls1(self.post_norm1(attended)))), probs

    def _feed_forward(self, z: torch.Tensor) -> torch.Tensor:
        """Eq. (3), with the adapter beside the MLP where there is one."""
        out = z + self.drop_path(self.ls2(self.post_norm2(self.mlp(self.norm2(z)))))
        return out if self.adapter is None else out + self.adapter(z)


class AttentionPool(nn.Module):
    """Option pool='map' (SigLIP, Perception Encoder): one learned probe attends over the tokens with
    multi-head attention (``pool_heads`` heads), then a pre-LN MLP (``pool_mlp_dim`` wide) adds its residual; the probe's output is the
    image representation."""

    def __init__(self, c: ViTConfig):
        super().__init__()
        dim = c.dim
        self.num_heads = c.pool_heads or c.num_heads
        self.probe = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        width = c.mlp_dim if c.pool_mlp_dim is None else c.pool_mlp_dim
        self.norm = make_norm(c, dim) if width else None  # Option pool_mlp_dim=0: the attention alone (AIMv2)
        self.mlp = Mlp(dim, width, c.gelu) if width else None

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D) tokens -> (B, D) pooled; ``mask`` (B, T) bool marks the tokens that may be attended to."""
        batch, count, dim = tokens.shape
        q = self.q(self.probe).reshape(1, 1, self.num_heads, -1).transpose(1, 2).expand(batch, -1, -1, -1)
        k, v = self.kv(tokens).reshape(batch, count, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        keys = None if mask is None else mask[:, None, None, :]
        pooled = self.proj(F.scaled_dot_product_attention(q, k, v, attn_mask=keys).transpose(1, 2).reshape(batch, dim))
        return pooled if self.mlp is None else pooled + self.mlp(self.norm(pooled))


class SoftPool(nn.Module):
    """Option pool='soft' (Gemma 4's soft tokens): the patch tokens averaged over k x k cells of their grid
    (k = ``soft_pool``), times sqrt(D); with ``soft_standardize``, then (tokens - std_bias) * std_scale. An image of
    rows x cols patches (both multiples of k) gives (rows / k) * (cols / k) tokens, the pooled grid in row-major
    order; a NaFlex batch of N patches per image gives N / k^2 per image, each image's own first, then cells that
    no patch of it falls in (padding)."""

    def __init__(self, c: ViTConfig):
        super().__init__()
        self.kernel, self.scale = c.soft_pool, math.sqrt(c.dim)
        if c.soft_standardize:
            self.register_buffer("std_bias", torch.zeros(c.dim))
            self.register_buffer("std_scale", torch.ones(c.dim))
        else:
            self.std_bias = self.std_scale = None

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int] | PatchBatch, mask: torch.Tensor | None = None
                ) -> torch.Tensor:
        """(B, N, D) patch tokens of images of ``grid`` (rows, cols) or of the NaFlex batch ``grid`` -> (B, N / k^2,
        D) soft tokens; ``mask`` (B, N) marks real patches (a batch's own by default)."""
        k, count = self.kernel, tokens.shape[1]
        if isinstance(grid, PatchBatch):
            rows, cols = grid.coords.unbind(-1)
            sides, mask = grid.grids, grid.mask if mask is None else mask
            grid_cols = sides[:, 1:]
        else:
            sides = grid = tuple(grid)
            if grid[0] * grid[1] != count:
                raise InputError(f"pool='soft' of {count} patch tokens with grid={grid}; pass the grid of the "
                                 f"image they came from: forward_head(features, grid=(rows, cols))")
            rows, cols = (cells.to(tokens.device) for cells in grid_cells(grid))
            grid_cols = grid[1]
        if not torch.jit.is_tracing() and (count % (k * k) or bool((torch.as_tensor(sides) % k).any())):
            raise InputError(f"pool='soft' averages {k}x{k} cells of patches: expected grids whose sides are "
                             f"multiples of {k} (images whose sides are multiples of {k} patches), got "
                             f"{torch.as_tensor(sides).tolist()} of {count} patches")
        cell = (torch.div(cols, k, rounding_mode="floor")
                + torch.div(grid_cols, k, rounding_mode="floor") * torch.div(rows, k, rounding_mode="floor"))
        weights = (cell.unsqueeze(-1) == torch.arange(count // (k * k), device=tokens.device)).float() / (k * k)
        if mask is not None:
            weights = weights * mask.unsqueeze(-1)
        pooled = (weights.transpose(-2, -1) @ tokens.float()) * self.scale
        if self.std_bias is not None:
            pooled = (pooled - self.std_bias.float()) * self.std_scale.float()
        return pooled.to(tokens.dtype)


def merge_order(rows: torch.Tensor, cols: torch.Tensor, grid_cols: torch.Tensor | int, k: int,
                start: torch.Tensor | int = 0, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The (B, N) order that gathers patches at (``rows``, ``cols``) of grids ``grid_cols`` wide (all broadcast to
    (B, N)) into their k x k cells: each cell's k^2 patches row by row, the cells row by row from ``start`` (where an
    image's cells begin in a packed sequence); patches outside ``mask`` (padding) after all of them."""
    cell = torch.div(rows, k, rounding_mode="floor") * torch.div(grid_cols, k, rounding_mode="floor") + torch.div(
        cols, k, rounding_mode="floor")
    slot = start + cell * k * k + (rows % k) * k + cols % k
    slot = slot.expand(torch.broadcast_shapes(rows.shape, cols.shape))
    if mask is not None:
        slot = torch.where(mask, slot, slot.shape[-1] + torch.arange(slot.shape[-1], device=slot.device))
    return slot.argsort(dim=-1)


class PatchMerger(nn.Module):
    """Option merge_size (Qwen VL's patch merger): each patch token normed, the k^2 tokens of each k x k cell of the
    grid concatenated (row by row), then Linear(k^2 D, k^2 D), GELU, and Linear(k^2 D, merge_dim) (none with
    merge_dim=0)."""

    def __init__(self, c: ViTConfig):
        super().__init__()
        self.kernel, width = c.merge_size, c.merge_size ** 2 * c.dim
        self.norm = make_norm(c, c.dim)
        self.fc1 = nn.Linear(width, width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(width, c.merge_dim) if c.merge_dim else nn.Identity()

    def forward(self, tokens: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """(B, N, D) patch tokens -> (B, N / k^2, merge_dim) merged tokens, the cells in the ``order`` of
        :func:`merge_order`."""
        x = self.norm(tokens)
        x = x.gather(1, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        x = x.reshape(x.shape[0], -1, self.kernel ** 2 * x.shape[-1])
        return self.fc2(self.act(self.fc1(x)))


def window_ids(rows: torch.Tensor, cols: torch.Tensor, grid_cols: torch.Tensor | int, window: int) -> torch.Tensor:
    """The window of each patch at (``rows``, ``cols``) of a grid ``grid_cols`` wide: squares of ``window`` patches a
    side from the grid's top left (Qwen2.5-VL's window attention), numbered row by row."""
    across = torch.div(grid_cols + window - 1, window, rounding_mode="floor")
    return torch.div(rows, window, rounding_mode="floor") * across + torch.div(cols, window, rounding_mode="floor")
