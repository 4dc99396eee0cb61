"""The Vision Transformer (Dosovitskiy et al., ICLR 2021), one class for every variant.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (1)  embed()
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                         (2)  Block
    z_l = MLP(LN(z'_l)) + z'_l                                (3)  Block
    y = LN(z_L^0)                                             (4)  forward_features() + pool()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..atomic import atomic_directory, os_errors
from .config import ViTConfig, pair
from .layers import Block, PatchEmbed
from .position import make_position_embedding
from .resnet import make_backbone


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class Intermediates:
    """What a forward pass saw: every block's output, optionally every block's attention probabilities."""

    blocks: list[torch.Tensor]  # (B, T, D) after each block, before the final norm
    features: torch.Tensor  # (B, T, D) after the final norm
    grid: tuple[int, int]
    attentions: list[torch.Tensor] | None = None  # (B, heads, T, T) per block


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        c = self.config = config
        self.patch_embed = PatchEmbed(c.in_chans, c.dim, c.patch_size, make_backbone(c))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.class_token else None
        self.pos_embed = make_position_embedding(c)
        self.pos_drop = nn.Dropout(c.dropout)
        drop_rates = [c.drop_path * i / max(c.depth - 1, 1) for i in range(c.depth)]
        relative_tokens = self.num_prefix_tokens + c.grid_size[0] * c.grid_size[1] if c.pos_embed == "relative" else 0
        self.blocks = nn.ModuleList(
            Block(c.dim, c.num_heads, c.mlp_dim, qkv_bias=c.qkv_bias, ln_eps=c.ln_eps, gelu=c.gelu,
                  dropout=c.dropout, attn_dropout=c.attn_dropout, drop_path=rate, relative_tokens=relative_tokens)
            for rate in drop_rates
        )
        self.norm = nn.Identity() if c.fc_norm else nn.LayerNorm(c.dim, eps=c.ln_eps)
        self.fc_norm = nn.LayerNorm(c.dim, eps=c.ln_eps) if c.fc_norm else nn.Identity()
        if c.representation_size:
            self.pre_logits = nn.Sequential(nn.Linear(c.dim, c.representation_size), nn.Tanh())
        else:
            self.pre_logits = nn.Identity()
        self.head = self._new_head(c.num_classes)
        self.grad_checkpointing = False  # recompute block activations in backward to save memory
        self.init_weights()

    # ----------------------------------------------------------------------------------- init
    def _new_head(self, num_classes: int) -> nn.Module:
        width = self.config.representation_size or self.config.dim
        if not num_classes:
            return nn.Identity()
        head = nn.Linear(width, num_classes)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        return head

    @torch.no_grad()
    def init_weights(self) -> None:
        """Google's initialisation: xavier-uniform dense kernels (q, k, v separately), tiny MLP biases,
        LeCun-normal patch projection, zero [class] token and head, N(0, 0.02) position table."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and module is not self.head:
                if name.endswith("attn.qkv"):
                    for part in module.weight.chunk(3, dim=0):
                        nn.init.xavier_uniform_(part)
                else:
                    nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    if ".mlp." in f".{name}.":
                        nn.init.normal_(module.bias, std=1e-6)
                    else:
                        nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        conv = self.patch_embed.proj
        fan_in = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
        nn.init.trunc_normal_(conv.weight, std=math.sqrt(1.0 / fan_in) / 0.87962566103423978)
        nn.init.zeros_(conv.bias)

    # -------------------------------------------------------------------------------- forward
    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.cls_token is not None else 0

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Eq. (1): patch embeddings x_p E, then the [class] token and position embeddings."""
        patches, grid = self.patch_embed(images)
        return self.embed_patches(patches, grid), grid

    def embed_patches(self, patches: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The rest of eq. (1) on (B, N, D) patch embeddings (which masked patch prediction corrupts)."""
        tokens = patches
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1).to(tokens.dtype), tokens], dim=1)
        if self.pos_embed is not None:
            tokens = tokens + self.pos_embed(grid).to(tokens.dtype)
        return self.pos_drop(tokens)

    def encode(self, z: torch.Tensor) -> torch.Tensor:
        """Eqs. (2)-(3) through every block, then the final LayerNorm."""
        recompute = self.grad_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            z = checkpoint(block, z, use_reentrant=False) if recompute else block(z)
        return self.norm(z)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """All (B, T, D) tokens after the final LayerNorm."""
        return self.encode(self.embed(images)[0])

    def forward_intermediates(self, images: torch.Tensor, attention: bool = False) -> Intermediates:
        """Every block's output (for probing) and, if asked, its attention probabilities (for analysis),
        computed from the same weights as the fused forward pass."""
        z, grid = self.embed(images)
        outputs, attentions = [], []
        for block in self.blocks:
            if attention:
                z, probs = block.forward_with_probs(z)
                attentions.append(probs)
            else:
                z = block(z)
            outputs.append(z)
        return Intermediates(outputs, self.norm(z), grid, attentions if attention else None)

    def pool(self, features: torch.Tensor) -> torch.Tensor:
        """The image representation: the [class] token's state, or the mean of the patch tokens."""
        if self.config.pool == "token":
            pooled = features[:, 0]
        else:
            pooled = features[:, self.num_prefix_tokens:].mean(dim=1)
        return self.fc_norm(pooled)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        representation = self.pre_logits(self.pool(features))
        return representation if pre_logits else self.head(representation)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(images))

    # ----------------------------------------------------------------------- surgery for fine-tuning
    def reset_head(self, num_classes: int, keep_pre_logits: bool = False) -> None:
        """Replace the head by a zero-initialised ``num_classes``-way linear layer (section 3.2);
        the pre-training pre-logits layer is dropped unless ``keep_pre_logits``."""
        if not keep_pre_logits and self.config.representation_size:
            self.pre_logits = nn.Identity()
            self.config = self.config.replace(representation_size=None)
        self.config = self.config.replace(num_classes=num_classes)
        device = next(self.parameters()).device
        self.head = self._new_head(num_classes).to(device)

    def resize_image(self, image_size: int | tuple[int, int]) -> None:
        """Make ``image_size`` the native resolution: the position table is resampled once, for good."""
        config = self.config.replace(image_size=pair(image_size))
        if self.pos_embed is not None:
            self.pos_embed.resize(config.grid_size)
        self.config = config

    # ----------------------------------------------------------------------------- persistence
    def save(self, directory: str | Path) -> Path:
        """Write ``config.json`` + ``model.safetensors`` into ``directory`` atomically: a reader sees
        the previous checkpoint or the new one, never a mixture."""
        return save_native(directory, self.config, self.state_dict())


def save_native(directory: str | Path, config: ViTConfig, state: dict[str, torch.Tensor]) -> Path:
    """``VisionTransformer.save`` for weights held apart from a model (gathered from FSDP shards)."""
    with atomic_directory(directory) as staging:
        (staging / CONFIG_FILE).write_text(config.to_json())
        weights = {name: t.detach().cpu().contiguous() for name, t in state.items()}
        with os_errors(directory):
            save_file(weights, staging / WEIGHTS_FILE, metadata={"format": "vitkit"})
    return Path(directory)
