"""Building blocks of the encoder: patch projection, multi-head self-attention, MLP, pre-LN block, and the
attention-pool head; the options of later families (QK-norm, QuickGELU, SwiGLU, LayerScale) are marked."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .position import RelativePositionLogits


class PatchEmbed(nn.Module):
    """Split the image into PxP patches and project each linearly to D (a PxP conv with stride P).

    A hybrid first runs a CNN ``backbone`` (anything with ``out_chans`` and ``stride``) and cuts its
    feature map instead of the pixels, usually into 1x1 patches (section 3.2)."""

    def __init__(self, in_chans: int, dim: int, patch_size: int, backbone: nn.Module | None = None,
                 bias: bool = True):
        super().__init__()
        self.in_chans = in_chans
        self.patch_size = patch_size
        self.backbone = backbone
        self.stride = patch_size * (backbone.stride if backbone is not None else 1)
        features = backbone.out_chans if backbone is not None else in_chans
        self.proj = nn.Conv2d(features, dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """(B, C, H, W) images -> (B, N, D) patch embeddings and the (H/P, W/P) grid."""
        check_images(images, self.in_chans, self.stride)
        x = self.proj(images if self.backbone is None else self.backbone(images))
        grid = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), grid


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


class Attention(nn.Module):
    """MSA: h heads of width D/h, softmax(q k^T / sqrt(D/h)) v, concatenated and projected by D x D."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_dropout: float = 0.0,
                 dropout: float = 0.0, relative_tokens: int = 0, qk_norm: bool = False, ln_eps: float = 1e-6):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        # Option qk_norm: LayerNorm on every head's queries and keys before their product.
        self.q_norm = nn.LayerNorm(self.head_dim, eps=ln_eps) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, eps=ln_eps) if qk_norm else nn.Identity()
        self.attn_dropout = attn_dropout
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(dropout)
        self.relative = RelativePositionLogits(relative_tokens, num_heads, self.head_dim) if relative_tokens else None

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, T, D/h)
        return self.q_norm(q), self.k_norm(k), v

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        batch, _, tokens, _ = out.shape
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, tokens, -1)))

    def _relative_logits(self, q: torch.Tensor) -> torch.Tensor | None:
        return None if self.relative is None else self.relative(q * self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x)
        dropout = self.attn_dropout if self.training else 0.0
        bias = self._relative_logits(q)
        return self._merge(F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout))

    def forward_with_probs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same attention computed explicitly, also returning the (B, h, T, T) probabilities."""
        q, k, v = self._heads(x)
        logits = (q * self.scale) @ k.transpose(-2, -1)
        bias = self._relative_logits(q)
        if bias is not None:
            logits = logits + bias
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

    Option ``swiglu``: fc1 yields a gate and a value of width mlp each, and SiLU(gate) * value enters fc2."""

    def __init__(self, dim: int, hidden: int, gelu: str = "exact", dropout: float = 0.0, swiglu: bool = False):
        super().__init__()
        self.swiglu = swiglu
        self.fc1 = nn.Linear(dim, 2 * hidden if swiglu else hidden)
        self.act = nn.SiLU() if swiglu else make_gelu(gelu)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.swiglu:
            gate, value = x.chunk(2, dim=-1)
            x = self.act(gate) * value
        else:
            x = self.act(x)
        return self.drop(self.fc2(self.drop(x)))


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


class Block(nn.Module):
    """Pre-LN encoder block: z' = MSA(LN(z)) + z (eq. 2); z = MLP(LN(z')) + z' (eq. 3); with LayerScale the
    branches are ls1(MSA(...)) and ls2(MLP(...))."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, *, qkv_bias: bool = True, ln_eps: float = 1e-6,
                 gelu: str = "exact", dropout: float = 0.0, attn_dropout: float = 0.0, drop_path: float = 0.0,
                 relative_tokens: int = 0, qk_norm: bool = False, swiglu: bool = False,
                 layer_scale: float | None = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=ln_eps)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_dropout, dropout, relative_tokens, qk_norm, ln_eps)
        self.ls1 = LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=ln_eps)
        self.mlp = Mlp(dim, mlp_dim, gelu, dropout, swiglu)
        self.ls2 = LayerScale(dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.drop_path = DropPath(drop_path)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = z + self.drop_path(self.ls1(self.attn(self.norm1(z))))
        return z + self.drop_path(self.ls2(self.mlp(self.norm2(z))))

    def forward_with_probs(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attended, probs = self.attn.forward_with_probs(self.norm1(z))
        z = z + self.drop_path(self.ls1(attended))
        return z + self.drop_path(self.ls2(self.mlp(self.norm2(z)))), probs


class AttentionPool(nn.Module):
    """Option pool='map' (SigLIP): one learned probe attends over the tokens with multi-head attention,
    then a pre-LN MLP adds its residual; the probe's output is the image representation."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, ln_eps: float, gelu: str):
        super().__init__()
        self.num_heads = num_heads
        self.probe = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=ln_eps)
        self.mlp = Mlp(dim, mlp_dim, gelu)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T, D) tokens -> (B, D) pooled."""
        batch, count, dim = tokens.shape
        q = self.q(self.probe).reshape(1, 1, self.num_heads, -1).transpose(1, 2).expand(batch, -1, -1, -1)
        k, v = self.kv(tokens).reshape(batch, count, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        pooled = self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, dim))
        return pooled + self.mlp(self.norm(pooled))
