"""The Vision Transformer (Dosovitskiy et al., ICLR 2021), one class for every variant.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (1)  embed()
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                         (2)  Block
    z_l = MLP(LN(z'_l)) + z'_l                                (3)  Block
    y = LN(z_L^0)                                             (4)  forward_features() + pool()

Options of later families (config fields, all off by default) are marked "Option" where they act:
distillation and register tokens beside [class], position table without prefix rows, a LayerNorm before
the blocks, a norm on the patch embeddings, rotary position embeddings (a table per grid that the blocks turn
their queries and keys by), an attention-pool head, and Gemma 4's [0, 1] pixels scaled inside and soft-token
pool (``SoftPool``); QK-norm, QuickGELU, SwiGLU, LayerScale, RMSNorm, sub-LN
and the bias switches live in the blocks. Parameter-efficient fine-tuning adds VPT's prompt tokens (here) and
AdaptFormer's adapters (in the blocks); LoRA wraps the dense layers from outside (``vitkit.checkpoints.adapters``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..atomic import atomic_directory, os_errors
from ..errors import ConfigError, InputError
from .config import POS_INTERPS, ViTConfig, pair
from .dense import DenseHead, Features, dense_layers
from .layers import (Adapter, AttentionPool, Block, PatchEmbed, PatchMerger, SoftPool, make_norm, merge_order,
                     window_ids)
from .naflex import PatchBatch, check_patch_batch
from .packed import PackedBatch, check_packed_batch
from .patch_resize import resample_patch_kernel
from .position import LearnedPositionEmbedding, grid_cells, make_position_embedding
from .rotary import make_rope
from .resnet import make_backbone

# Weights of R, G and B in grey (ITU-R 601-2, as torchvision's rgb_to_grayscale and PIL's convert('L')).
LUMINANCE = (0.2989, 0.587, 0.114)


CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class Intermediates:
    """What a forward pass saw: every block's output, optionally every block's attention probabilities.

    Shapes: B images, D = ``config.dim``, T = P + rows * cols tokens, the P = ``num_prefix_tokens`` prefix tokens
    ([class], distillation, registers, in that order) first, then the patches of the (rows, cols) ``grid`` in
    row-major order. ``attentions[l][b, h, q, k]`` is how much query token q attends to key token k in head h of
    block l (each row sums to 1)."""

    blocks: list[torch.Tensor]  # depth tensors (B, T, D): each block's output, before the final norm
    features: torch.Tensor  # (B, T, D) after the final norm: what forward_features returns
    grid: tuple[int, int]  # (rows, cols) of the patch grid: H / P x W / P, or a hybrid's feature map
    attentions: list[torch.Tensor] | None = None  # depth tensors (B, heads, T, T), when asked for


class VisionTransformer(nn.Module):
    """The Vision Transformer of every variant vitkit knows, built from one ``ViTConfig``.

    ``model(images)`` takes a (B, C, H, W) float tensor whose sides are multiples of the patch size (or a NaFlex
    ``PatchBatch``) and returns the logits, (B, num_classes), or the pooled representation (B, D) when
    ``num_classes`` is 0. The paper's model (eq. 1-4) is the default; the family options of the config (DeiT's
    distillation token, registers, LayerScale, attention pooling, rotary embeddings, ...) change it only where
    set, so one class reads the checkpoints of every family."""
    def __init__(self, config: ViTConfig):
        super().__init__()
        c = self.config = config
        self.patch_embed = PatchEmbed(c.in_chans, c.dim, c.patch_size, make_backbone(c), bias=c.patch_bias,
                                      norm=make_norm(c, c.dim) if c.patch_norm else None, scale_pixels=c.scale_pixels)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.class_token else None
        # Option dist_token (DeiT) and reg_tokens (DINOv2-reg): more learned prefix tokens after [class].
        self.dist_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.reg_tokens, c.dim)) if c.reg_tokens else None
        self.prompts = self._new_prompts() if c.prompt_tokens else None  # Option prompt_tokens (VPT)
        self.pos_embed = make_position_embedding(c)
        self.rope = make_rope(c)  # Option rope: rotary position embeddings on the patches' queries and keys
        self.pos_drop = nn.Dropout(c.dropout)
        self.norm_pre = make_norm(c, c.dim) if c.pre_norm else nn.Identity()  # Option pre_norm (CLIP)
        drop_rates = [c.drop_path * i / max(c.depth - 1, 1) for i in range(c.depth)]
        relative_tokens = self.num_prefix_tokens + c.grid_size[0] * c.grid_size[1] if c.pos_embed == "relative" else 0
        self.blocks = nn.ModuleList(Block(c, rate, relative_tokens) for rate in drop_rates)
        # Options: the norm on the pooled output (fc_norm) instead of every token, or none at all (final_norm).
        self.norm = make_norm(c, c.dim) if c.final_norm and not c.fc_norm else nn.Identity()
        dense = c.dense_head != "none"  # Option dense_head: per-pixel outputs; nothing pooled, no classifier
        self.fc_norm = (make_norm(c, c.token_dim, c.fc_norm_scale) if c.final_norm and c.fc_norm and not dense
                        else nn.Identity())
        self.merger = PatchMerger(c) if c.merge_size and not dense else None  # Option merge_size (Qwen VL)
        # Option pool='map' (SigLIP, PE): attention pooling with a learned probe; 'soft' (Gemma 4): soft tokens.
        self.attn_pool = AttentionPool(c) if c.pool == "map" and not dense else None
        self.soft_pool = SoftPool(c) if c.pool == "soft" and not dense else None
        if c.representation_size:
            self.pre_logits = nn.Sequential(nn.Linear(c.dim, c.representation_size), nn.Tanh())
        else:
            self.pre_logits = nn.Identity()
        self.head = self._new_head(0 if dense else c.num_classes)
        self.head_dist = self._new_head(c.num_classes) if c.dist_token and not dense else None
        self.dense_head = DenseHead(c) if dense else None
        self.grad_checkpointing = False  # recompute block activations in backward to save memory
        self.init_weights()

    # ----------------------------------------------------------------------------------- init
    def _new_head(self, num_classes: int) -> nn.Module:
        width = self.config.representation_size or self.config.pooled_dim
        if not num_classes:
            return nn.Identity()
        head = nn.Linear(width, num_classes)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        return head

    def _new_prompts(self) -> nn.Parameter:
        """VPT's prompts, (depth or 1, prompt_tokens, D), drawn as VPT draws them: uniform in +-sqrt(6 / (C P^2 +
        D)), the Xavier bound of a patch projection."""
        c = self.config
        bound = math.sqrt(6.0 / (c.in_chans * c.patch_size ** 2 + c.dim))
        return nn.Parameter(torch.empty(c.depth if c.prompt_deep else 1, c.prompt_tokens, c.dim).uniform_(-bound, bound))

    @torch.no_grad()
    def init_weights(self) -> None:
        """Google's initialisation: xavier-uniform dense kernels (q, k, v separately), tiny MLP biases,
        LeCun-normal patch projection, zero [class] token and head, N(0, 0.02) position table."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and module is not self.head and module is not self.head_dist:
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
            elif isinstance(module, nn.LayerNorm | nn.RMSNorm) and module.weight is not None:
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:  # RMSNorm has none
                    nn.init.zeros_(module.bias)
        conv = self.patch_embed.proj
        fan_in = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
        # LeCun normal as Flax draws it: a normal cut at two of its own deviations (torch's bounds are absolute),
        # widened by 1 / 0.8796 (the std of a unit normal cut at +-2) so that the std is sqrt(1 / fan_in).
        spread = math.sqrt(1.0 / fan_in) / 0.87962566103423978
        nn.init.trunc_normal_(conv.weight, std=spread, a=-2 * spread, b=2 * spread)
        if conv.bias is not None:
            nn.init.zeros_(conv.bias)
        probe = self.attn_pool.probe if self.attn_pool is not None else None
        for token in (self.dist_token, self.reg_token, probe):
            if token is not None:  # distinct from [class] (zero) from the start
                nn.init.normal_(token, std=0.02)
        if self.prompts is not None:
            self.prompts = self._new_prompts()
        for block in self.blocks:
            if block.adapter is not None:
                block.adapter.reset_parameters()

    # -------------------------------------------------------------------------------- forward
    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches ([class], distillation, registers), as the config says."""
        return self.config.num_prefix_tokens

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Eq. (1): patch embeddings x_p E, then the [class] token and position embeddings."""
        patches, grid = self.patch_embed(images)
        return self.embed_patches(patches, grid), grid

    def embed_patches(self, patches: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The rest of eq. (1) on (B, N, D) patch embeddings (which masked patch prediction corrupts)."""
        position = None if self.pos_embed is None else self.pos_embed(grid, patches.device)
        return self._add_prefix_and_positions(patches, position)

    def _add_prefix_and_positions(self, patches: torch.Tensor, position: torch.Tensor | None) -> torch.Tensor:
        """[class] (and other prefix tokens) before the (B, N, D) patches, plus a (1 or B, rows, D) position table."""
        prefix = [token.expand(patches.shape[0], -1, -1).to(patches.dtype)
                  for token in (self.cls_token, self.dist_token, self.reg_token) if token is not None]
        position = None if position is None else position.to(patches.dtype)
        if self.config.no_embed_class:  # Option: the prefix tokens take no position embedding
            tokens = torch.cat(prefix + [patches if position is None else patches + position], dim=1)
        else:
            tokens = torch.cat(prefix + [patches], dim=1)
            tokens = tokens if position is None else tokens + position
        return self.norm_pre(self.pos_drop(tokens))

    def rope_tables(self, grid: tuple[int, int], device: torch.device) -> list[torch.Tensor | None]:
        """Option rope: each block's (2, T, d) rotary table for ``grid`` (one shared table, or, for learned mixed
        frequencies, one (2, heads, T, d) table per block); None for every block without rope."""
        if self.rope is None:
            return [None] * len(self.blocks)
        table = self.rope(grid, device)
        return list(table.unbind(1)) if self.config.rope == "mixed" else [table] * len(self.blocks)

    def embed_batch(self, batch: PatchBatch) -> tuple[torch.Tensor, list[torch.Tensor | None], torch.Tensor]:
        """Eq. (1) for a NaFlex batch: the patches projected by the patch kernel, plus each patch's row of the
        position table resampled to its image's grid (computed at its coordinates, for every image at once).
        Returns the tokens, each block's rotary table ((2, B, 1 or heads, T, d), per image likewise) and the
        (B, 1, 1, T) key mask."""
        c = self.config
        if c.backbone is not None or c.pos_embed == "relative":
            raise InputError("NaFlex batches need a plain patch projection and no relative position logits; "
                             f"this model has {'a hybrid backbone' if c.backbone is not None else 'relative ones'}")
        if not torch.jit.is_tracing():  # an exported graph's inputs are the runtime's to check
            check_patch_batch(batch, c.patch_size, c.in_chans)
        patches = self.patch_embed.project_patches(batch.patches)
        rows, cols = batch.coords.unbind(-1)
        position = None if self.pos_embed is None else self.pos_embed.at(rows, cols, batch.grids)
        ropes: list[torch.Tensor | None] = [None] * len(self.blocks)
        if self.rope is not None:
            tables = self.rope.at(rows, cols, batch.grids)  # (2, B, T, d), or (2, B, depth, heads, T, d) if mixed
            ropes = list(tables.unbind(2)) if c.rope == "mixed" else [tables.unsqueeze(2)] * len(self.blocks)
        keys = batch.mask  # the prefix tokens are always attended to (concatenated only if there are any)
        if c.num_prefix_tokens:
            keys = torch.cat([keys.new_ones(keys.shape[0], c.num_prefix_tokens), keys], dim=1)
        masks = self.block_masks(keys[:, None, None, :], rows, cols, batch.grids[:, None, 1])
        return self._add_prefix_and_positions(patches, position), ropes, masks

    def embed_packed(self, batch: PackedBatch) -> tuple[torch.Tensor, list[torch.Tensor | None], list]:
        """Eq. (1) for a packed batch (Qwen VL): the (1, N, D) tokens of all its patches in one sequence, each
        block's rotary table at the patches' coordinates, and each block's (1, 1, N, N) mask: a patch attends to
        its own image (and, in a windowed block, its own window)."""
        c = self.config
        if c.backbone is not None or c.pos_embed == "relative" or c.num_prefix_tokens:
            raise InputError("packed batches need a plain patch projection, no relative position logits and no prefix "
                             "tokens (Qwen VL's towers); this model has "
                             + ("a hybrid backbone" if c.backbone is not None else "relative ones"
                                if c.pos_embed == "relative" else f"{c.num_prefix_tokens} prefix tokens"))
        if not torch.jit.is_tracing():
            check_packed_batch(batch, c.patch_size, c.in_chans)
        patches = self.patch_embed.project_patches(batch.patches[None])
        rows, cols = batch.coords.unbind(-1)
        grids = batch.token_grids
        # Each patch looked up as an image of one patch on its image's grid, then the patches one sequence again.
        position = None if self.pos_embed is None else self.pos_embed.at(rows[:, None], cols[:, None], grids)
        position = None if position is None else position.reshape(1, -1, c.dim)
        ropes: list[torch.Tensor | None] = [None] * len(self.blocks)
        if self.rope is not None:
            tables = self.rope.at(rows[:, None], cols[:, None], grids).squeeze(-2)  # (2, N, d); mixed (2, N, L, h, d)
            ropes = (list(tables.permute(0, 2, 3, 1, 4).unbind(1)) if c.rope == "mixed"
                     else [tables] * len(self.blocks))
        same = (batch.images[:, None] == batch.images[None, :])[None, None]
        return self._add_prefix_and_positions(patches, position), ropes, self.block_masks(same, rows, cols,
                                                                                          grids[:, 1])

    def block_masks(self, full: torch.Tensor | None, rows: torch.Tensor, cols: torch.Tensor,
                    grid_cols: torch.Tensor | int) -> torch.Tensor | list[torch.Tensor | None] | None:
        """The keys each block's queries may attend to: ``full`` (None: all) in every block, or (Option
        attn_window, Qwen2.5-VL) those of the query's window too in the blocks not in ``global_blocks``, for patches
        at (``rows``, ``cols``) of grids ``grid_cols`` wide."""
        c = self.config
        if not c.attn_window:
            return full
        ids = window_ids(rows, cols, grid_cols, c.attn_window)
        window = (ids.unsqueeze(-1) == ids.unsqueeze(-2)).unsqueeze(-3)
        window = window if full is None else window & full
        return [full if layer in (c.global_blocks or ()) else window for layer in range(c.depth)]

    def grid_masks(self, grid: tuple[int, int]) -> list[torch.Tensor | None] | None:
        """:meth:`block_masks` of the patches of a (rows, cols) grid, on the device of the weights."""
        if not self.config.attn_window:
            return None
        device = next(self.parameters()).device
        rows, cols = (cells.to(device) for cells in grid_cells(grid))
        return self.block_masks(None, rows, cols, grid[1])

    def prompted(self, z: torch.Tensor, layer: int) -> torch.Tensor:
        """Option prompt_tokens (VPT): the tokens entering block ``layer``, with the prompts after the prefix
        tokens: put in before the first block, and (prompt_deep) put in place of the last block's prompts before
        every later one."""
        c = self.config
        if self.prompts is None or (layer and not c.prompt_deep):
            return z
        start = c.learned_prefix_tokens
        prompts = self.prompts[layer if c.prompt_deep else 0].expand(z.shape[0], -1, -1).to(z.dtype)
        return torch.cat([z[:, :start], prompts, z[:, start + (c.prompt_tokens if layer else 0):]], dim=1)

    def run_blocks(self, z: torch.Tensor, ropes: list[torch.Tensor | None],
                   mask: torch.Tensor | list[torch.Tensor | None] | None = None) -> Iterator[torch.Tensor]:
        """Eqs. (2)-(3): each block's output in turn; ``ropes`` holds each block's rotary table (None without rope)
        and ``mask`` which keys may be attended to (NaFlex padding, packed images), or a list of one mask per block
        (window attention)."""
        recompute = self.grad_checkpointing and torch.is_grad_enabled()
        masks = mask if isinstance(mask, list) else [mask] * len(self.blocks)
        for layer, (block, rope, mask) in enumerate(zip(self.blocks, ropes, masks)):
            z = self.prompted(z, layer)
            z = checkpoint(block, z, rope, mask, use_reentrant=False) if recompute else block(z, rope, mask)
            yield z

    def encode(self, z: torch.Tensor, ropes: list[torch.Tensor | None],
               mask: torch.Tensor | list[torch.Tensor | None] | None = None) -> torch.Tensor:
        """Every block (``run_blocks``), then the final LayerNorm."""
        for z in self.run_blocks(z, ropes, mask):
            pass
        return self.norm(z)

    def forward_features(self, images: torch.Tensor | PatchBatch | PackedBatch) -> torch.Tensor:
        """All (B, T, D) tokens after the final LayerNorm, of an image tensor or a NaFlex :class:`PatchBatch`; of a
        :class:`PackedBatch` (Qwen VL), the (N, D) rows of its N patches in the batch's order."""
        if isinstance(images, PatchBatch | PackedBatch):
            self._remember_layout(images)
            embed = self.embed_batch if isinstance(images, PatchBatch) else self.embed_packed
            features = self.encode(*embed(images))
            return features if isinstance(images, PatchBatch) else features[0]
        z, grid = self.embed(images)
        self._remember_layout(grid)
        return self.encode(z, self.rope_tables(grid, z.device), self.grid_masks(grid))

    def _remember_layout(self, layout: tuple[int, int] | PatchBatch) -> None:
        """Option pool='soft': the grid (or NaFlex batch) of the last features made, which the soft pool needs and
        ``forward_head(features)`` is not told."""
        if self.soft_pool is not None or self.merger is not None:
            self._last_layout = layout

    def _layout_of(self, features: torch.Tensor) -> tuple[int, int] | PatchBatch:
        """The grid the soft pool takes ``features`` on: that of the last ``forward_features`` when they are its
        size (the same patch count; for a NaFlex batch, the same images), else the native grid."""
        last, patches = getattr(self, "_last_layout", None), features.shape[1] - self.config.learned_prefix_tokens
        if features.ndim == 2:  # a packed batch's rows
            if isinstance(last, PackedBatch) and last.coords.shape[0] == features.shape[0]:
                return last
            raise InputError(f"features of shape {tuple(features.shape)} are a packed batch's rows; pass the batch "
                             f"they came from: forward_head(features, grid=batch)")
        if isinstance(last, PatchBatch) and tuple(last.mask.shape) == (features.shape[0], patches):
            return last
        if isinstance(last, tuple) and last[0] * last[1] == patches:
            return last
        return self.config.grid_size

    def forward_intermediates(self, images: torch.Tensor, attention: bool = False) -> Intermediates:
        """Every block's output (for probing) and, if asked, its attention probabilities (for analysis),
        computed from the same weights as the fused forward pass; of image tensors (a NaFlex batch's images one
        at a time, each at its size)."""
        if isinstance(images, PatchBatch | PackedBatch):
            raise InputError(f"forward_intermediates takes (B, C, H, W) images; run a "
                             f"{'NaFlex' if isinstance(images, PatchBatch) else 'packed'} batch's images one at a "
                             f"time, each at its own size")
        z, grid = self.embed(images)
        outputs, attentions = [], []
        masks = self.grid_masks(grid) or [None] * len(self.blocks)
        for layer, (block, rope, mask) in enumerate(zip(self.blocks, self.rope_tables(grid, z.device), masks)):
            z = self.prompted(z, layer)
            if attention:
                z, probs = block.forward_with_probs(z, rope, mask)
                attentions.append(probs)
            else:
                z = block(z, rope, mask)
            outputs.append(z)
        return Intermediates(outputs, self.norm(z), grid, attentions if attention else None)

    def dense_features(self, images: torch.Tensor) -> Features:
        """What the dense head reads (``models.dense``): for each of its blocks, the (B, D, rows, cols) map of the
        patch tokens after the final norm, and the (B, D) state of the [class] token (None without one); the
        other prefix tokens and VPT's prompts are left out."""
        if isinstance(images, PatchBatch | PackedBatch):
            raise InputError(f"a dense head takes (B, C, H, W) images, not a "
                             f"{'NaFlex' if isinstance(images, PatchBatch) else 'packed'} batch: its outputs are maps "
                             f"of one grid; run each image at its own size")
        z, grid = self.embed(images)
        wanted = dense_layers(self.config)
        kept = {}
        for layer, tokens in enumerate(self.run_blocks(z, self.rope_tables(grid, z.device), self.grid_masks(grid))):
            if layer in wanted:
                kept[layer] = self.norm(tokens)
            if layer == max(wanted):
                break
        prefix, batch = self.num_prefix_tokens, z.shape[0]

        def maps(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            patches = tokens[:, prefix:].transpose(1, 2).reshape(batch, -1, *grid)
            return patches, tokens[:, 0] if self.cls_token is not None else None

        return [maps(kept[layer]) for layer in wanted]

    def pool(self, features: torch.Tensor, mask: torch.Tensor | None = None,
             grid: tuple[int, int] | PatchBatch | PackedBatch | None = None) -> torch.Tensor:
        """The image representation: the [class] token's state (Option summary_tokens: several prefix tokens'
        states, concatenated), the mean of the patch tokens, or (Option
        'map') the attention pool over them (Option pool_prefix: over the prefix tokens too); with a distillation
        token, the mean of it and [class] (but [class] alone under a pre-logits layer, as HF's DeiTModel pools).
        ``mask`` (B, N) marks a NaFlex batch's real patches: padding is left out of the mean and the pool's keys.
        VPT's prompts are dropped first. Option 'soft' (Gemma 4): (B, N / k^2, D) soft tokens of the patches
        (``SoftPool``) on ``grid``, the (rows, cols) of the images or the NaFlex batch; by default those of the last
        ``forward_features`` whose tokens these are, else the native grid."""
        c = self.config
        if c.prompt_tokens:
            features = torch.cat([features[:, :c.learned_prefix_tokens], features[:, c.num_prefix_tokens:]], dim=1)
        if features.ndim == 2 and self.merger is None:
            raise InputError(f"pool={c.pool!r} of features of shape {tuple(features.shape)}, a packed batch's rows: "
                             f"a packed batch is pooled by a patch merger (Qwen VL's towers) alone; run its images as "
                             f"a tensor or a NaFlex batch")
        if self.merger is not None:  # Option merge_size (Qwen VL): pooling reads the merged tokens
            layout = self._layout_of(features) if grid is None else grid
            merged, mask = self._merged(features, layout, mask)
            if c.pool == "merge":
                return merged[0] if isinstance(layout, PackedBatch) else merged
            if isinstance(layout, PackedBatch):
                raise InputError(f"pool={c.pool!r} of a packed batch's rows; a packed batch is pooled by its patch "
                                 f"merger alone (pool='merge'): run its images as a tensor or a NaFlex batch")
            features = merged
        if self.soft_pool is not None:
            grid = self._layout_of(features) if grid is None else grid
            return self.soft_pool(features[:, c.learned_prefix_tokens:], grid, mask)
        if self.config.pool == "token":
            if c.summary_tokens:  # Option summary_tokens (C-RADIO): several class tokens' states side by side
                return features[:, list(c.summary_tokens)].flatten(1)
            distilled = self.head_dist is not None and not self.config.representation_size
            return self.fc_norm(features[:, :2].mean(dim=1) if distilled else features[:, 0])
        prefix = c.learned_prefix_tokens
        skipped = 0 if c.pool_prefix else prefix
        tokens = features[:, skipped:]
        if mask is not None and prefix > skipped:
            mask = torch.cat([mask.new_ones(mask.shape[0], prefix - skipped), mask], dim=1)
        if self.config.pool == "gap":
            weights = None if mask is None else mask.to(tokens.dtype).unsqueeze(-1)
            pooled = tokens.mean(dim=1) if mask is None else (tokens * weights).sum(dim=1) / weights.sum(dim=1)
        else:
            pooled = self.attn_pool(tokens, mask)
        return self.fc_norm(pooled)

    def _merged(self, features: torch.Tensor, layout: tuple[int, int] | PatchBatch | PackedBatch,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Option merge_size: the (B, N / k^2, W) merger tokens of (B, N, D) patch tokens (a packed batch's (N, D)
        rows: (1, N / k^2, W), image by image) on ``layout``, and the mask of the real ones (a NaFlex batch's)."""
        k = self.config.merge_size
        if isinstance(layout, PackedBatch):
            rows, cols = layout.coords.unbind(-1)
            sizes = layout.grids.prod(dim=-1)
            start = (sizes.cumsum(0) - sizes)[layout.images]
            order, sides, features = merge_order(rows, cols, layout.token_grids[:, 1], k, start)[None], layout.grids,                 features[None]
        elif isinstance(layout, PatchBatch):
            rows, cols = layout.coords.unbind(-1)
            mask = layout.mask if mask is None else mask
            order, sides = merge_order(rows, cols, layout.grids[:, None, 1], k, 0, mask), layout.grids
        else:
            sides, count = torch.tensor([tuple(layout)]), features.shape[1]
            if layout[0] * layout[1] != count:
                raise InputError(f"the patch merger of {count} patch tokens with grid={tuple(layout)}; pass the grid "
                                 f"of the image they came from: forward_head(features, grid=(rows, cols))")
            rows, cols = (cells.to(features.device) for cells in grid_cells(layout))
            order = merge_order(rows, cols, layout[1], k).expand(features.shape[0], -1)
        if not torch.jit.is_tracing() and (features.shape[1] % (k * k) or bool((sides.cpu() % k).any())):
            raise InputError(f"the patch merger takes {k}x{k} cells of patches: expected grids whose sides are "
                             f"multiples of {k}, got {sides.tolist()}")
        merged = self.merger(features, order.to(features.device))
        if mask is not None:
            mask = torch.arange(merged.shape[1], device=mask.device) < (mask.sum(dim=1, keepdim=True) // (k * k))
        return merged, mask

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False, mask: torch.Tensor | None = None,
                     apart: bool = False, grid: tuple[int, int] | PatchBatch | PackedBatch | None = None
                     ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, num_classes) logits of (B, T, D) final features (``forward_features``): pooled as ``config.pool``
        says (``pool``), through the pre-logits layer if any, then the head (with a distillation token, the mean
        of the [class] head and the distillation head); with ``pre_logits``, the
        (B, representation_size or D) representation before the head, what a linear probe or k-NN reads. A model
        without a head (num_classes=0) returns the representation either way. ``mask`` as for ``pool``. With
        ``apart``, the (class head, distillation head) logits of a distilled model, as DeiT trains them. A model
        without a classifier answers with its pooled output: Gemma 4's soft tokens (pool='soft', (B, N / k^2, D):
        what timm's ``gemma4_vit_*_enc`` models return from ``forward`` and transformers' ``Gemma4VisionModel`` as
        its last hidden state, padding aside; timm's ``forward_head`` of them raises), for which ``grid`` is the
        (rows, cols) of the features' images or the NaFlex :class:`PatchBatch` they came from: by default, those of
        this model's last ``forward_features`` when the features are its size, else the native grid. With a patch merger
        (Qwen VL), pooling reads its merged tokens: pool='merge' returns them, (B, N / k^2, merge_dim), or for the
        (N, D) rows of a :class:`PackedBatch` (``grid``, by default the last one) (N / k^2, merge_dim), image by
        image."""
        if self.config.num_classes and self.head_dist is not None and not pre_logits:  # Option: heads averaged
            logits = self.head(features[:, 0]), self.head_dist(features[:, 1])
            return logits if apart else (logits[0] + logits[1]) / 2
        representation = self.pre_logits(self.pool(features, mask, grid))
        return representation if pre_logits else self.head(representation)

    def forward(self, images: torch.Tensor | PatchBatch | PackedBatch, apart: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, num_classes) logits of (B, C, H, W) images normalised as the weights were trained
        (``config.input_statistics``), H and W multiples of the patch size, any size (the position table is
        resampled to the grid); or of a NaFlex :class:`PatchBatch` (each image at its own grid). Equal to
        ``forward_head(forward_features(images))``; ``forward_intermediates`` gives what the blocks saw. With
        ``apart`` (a model with a distillation token), its two heads' logits, not their mean."""
        if self.dense_head is not None:  # Option dense_head: (B, num_classes or 1, h, w) per-pixel outputs
            return self.dense_head(self.dense_features(images))
        if isinstance(images, PatchBatch):
            mask, grid = images.mask, images
        elif isinstance(images, PackedBatch):
            mask, grid = None, images
        else:
            mask, grid = None, tuple(side // self.patch_embed.stride for side in images.shape[-2:])
        return self.forward_head(self.forward_features(images), mask=mask, apart=apart, grid=grid)

    # ----------------------------------------------------------------------- surgery for fine-tuning
    def reset_head(self, num_classes: int, keep_pre_logits: bool = False) -> None:
        """Replace the head by a zero-initialised ``num_classes``-way linear layer (section 3.2);
        the pre-training pre-logits layer is dropped unless ``keep_pre_logits``; a distillation head is
        replaced too, and an attention-pool head is kept. A dense model's head is not a classifier: refused."""
        if self.config.dense_head != "none":
            raise ConfigError(f"reset_head({num_classes}): this model has a {self.config.dense_head} dense head, not a "
                              f"classifier; fine-tune it with --objective segmentation or depth, or start a classifier "
                              f"from the backbone it was trained on")
        if self.soft_pool is not None and num_classes:
            raise ConfigError(f"reset_head({num_classes}): this model pools soft tokens (pool='soft', several per "
                              f"image), not the one vector a head reads; load it with pool='gap' (the patches' mean, "
                              f"as timm's Gemma 4 classifiers pool) to put a head on")
        if not keep_pre_logits and self.config.representation_size:
            self.pre_logits = nn.Identity()
            self.config = self.config.replace(representation_size=None)
        provenance = self.config.provenance.replace(classes=None)  # a new head's classes are not named yet
        self.config = self.config.replace(num_classes=num_classes, provenance=provenance)
        device = next(self.parameters()).device
        self.head = self._new_head(num_classes).to(device)
        if self.head_dist is not None:
            self.head_dist = self._new_head(num_classes).to(device)

    def make_dense(self, head: str, outputs: int, output: str = "classes", depth_min: float = 1e-3,
                   depth_max: float = 10.0) -> None:
        """Put a fresh dense head (``models.dense``: linear, linear-ms or dpt) in place of pooling and the
        classifier, its ``outputs`` per pixel class logits or (``output='depth'``) the weights of depth bins from
        ``depth_min`` to ``depth_max`` metres; the blocks are kept as they are."""
        provenance = self.config.provenance.replace(classes=None)
        self.config = self.config.replace(dense_head=head, dense_output=output, num_classes=outputs,
                                          depth_min=depth_min, depth_max=depth_max, representation_size=None,
                                          provenance=provenance)
        device = next(self.parameters()).device
        self.head, self.head_dist, self.pre_logits = nn.Identity(), None, nn.Identity()
        self.attn_pool, self.fc_norm = None, nn.Identity()
        self.dense_head = DenseHead(self.config).to(device).train(self.training)

    def add_prompts(self, count: int, deep: bool = False) -> None:
        """VPT (Jia et al. 2022): ``count`` learned prompt tokens after the prefix tokens, at the input (shallow)
        or fresh before every block (``deep``); the attention maps and rollout see them as prefix tokens."""
        self.config = self.config.replace(prompt_tokens=count, prompt_deep=deep)
        self.prompts = self._new_prompts().to(next(self.parameters()).device) if count else None
        if self.rope is not None:  # the prompts, like every prefix token, are not rotated
            self.rope.set_prefix(self.config.num_prefix_tokens)

    def add_adapters(self, width: int, scale: float = 0.1) -> None:
        """AdaptFormer (Chen et al. 2022): a ``width``-wide bottleneck MLP beside every block's MLP, its output
        scaled by ``scale``; starting at zero, so that the model's outputs are unchanged until it is trained."""
        self.config = self.config.replace(adapter_dim=width, adapter_scale=scale)
        device = next(self.parameters()).device
        for block in self.blocks:
            block.adapter = Adapter(self.config.dim, width, scale).to(device) if width else None

    def resize_image(self, image_size: int | tuple[int, int]) -> None:
        """Make ``image_size`` the native resolution: the position table is resampled once, for good."""
        config = self.config.replace(image_size=pair(image_size), pos_grid=None)
        if self.pos_embed is not None:
            self.pos_embed.resize(config.grid_size)
        self.config = config

    @torch.no_grad()
    def resize_patch(self, patch_size: int, image_size: int | tuple[int, int] | None = None, *,
                     mode: str | None = None, antialias: bool | None = None) -> None:
        """FlexiViT: run at ``patch_size`` from now on, at ``image_size`` (by default the current one). The
        patch kernel is resampled by the pseudo-inverse of the patch resize (its bias kept), and a learned position
        table, once, to the new grid image_size // patch_size. Both resizes are the family's (``pos_interp``,
        ``pos_interp_antialias``), as timm's loading path resizes both (FlexiViT: bilinear, no antialias), unless
        ``mode`` and ``antialias`` say otherwise: ``mode='bicubic', antialias=True`` is what timm's
        ``set_input_size`` does to any ViT."""
        if self.config.backbone is not None and patch_size != self.config.patch_size:
            raise ConfigError(f"resize_patch({patch_size!r}): a hybrid's patches are cut from its CNN's "
                              f"features, not pixels; only a plain ViT changes its patch size")
        size = self.config.image_size if image_size is None else pair(image_size)
        # refuses a size P does not divide; a table on its own grid (pos_grid) is resampled to the new one
        config = self.config.replace(patch_size=patch_size, image_size=size, pos_grid=None)
        proj = self.patch_embed.proj
        if mode is not None and mode not in POS_INTERPS:
            raise ConfigError(f"resize_patch(mode={mode!r}): expected one of {POS_INTERPS}")
        mode = mode or config.pos_interp
        antialias = config.pos_interp_antialias if antialias is None else antialias
        kernel = resample_patch_kernel(proj.weight, (patch_size, patch_size), mode, antialias)
        proj.weight = nn.Parameter(kernel, requires_grad=proj.weight.requires_grad)
        proj.kernel_size = proj.stride = (patch_size, patch_size)
        self.patch_embed.patch_size, self.patch_embed.stride = patch_size, config.effective_patch_size
        if isinstance(self.pos_embed, LearnedPositionEmbedding):
            self.pos_embed.resize(config.grid_size, mode, antialias)
        elif self.pos_embed is not None:
            self.pos_embed.resize(config.grid_size)
        self.config = config

    @torch.no_grad()
    def map_channels(self, in_chans: int) -> None:
        """Take ``in_chans`` (1 or 3) input channels from now on, the patch kernel mapped so that the model
        sees what it saw before: from 3 to 1 the colour kernels are summed (a grey image repeated in RGB gives
        the same embedding), from 1 to 3 the grey kernel is split by ITU-R 601-2 luminance (a colour image
        gives the embedding its grey version gave: ``ToChannels``'s conversion)."""
        have, proj = self.config.in_chans, self.patch_embed.proj
        if in_chans == have:
            return
        if self.config.backbone is not None or {have, in_chans} != {1, 3}:
            raise ConfigError(f"map_channels({in_chans!r}): maps the pixel patch kernel of a plain ViT between 1 "
                              f"and 3 channels; this model takes {have}"
                              + (" through a ResNet stem" if self.config.backbone is not None else ""))
        weight = proj.weight
        if in_chans == 1:
            kernel = weight.sum(dim=1, keepdim=True)
        else:
            kernel = weight * torch.tensor(LUMINANCE, dtype=weight.dtype, device=weight.device).view(1, 3, 1, 1)
        proj.weight = nn.Parameter(kernel, requires_grad=weight.requires_grad)
        proj.in_channels = self.patch_embed.in_chans = in_chans
        self.config = self.config.replace(in_chans=in_chans)

    # ----------------------------------------------------------------------------- persistence
    def save(self, directory: str | Path) -> Path:
        """Write ``config.json`` + ``model.safetensors`` into ``directory`` atomically: a reader sees
        the previous checkpoint or the new one, never a mixture. A model whose layers another library wraps
        (peft's LoRA: ``*.base_layer.*``) is refused: ``vitkit.checkpoints.adapters.save_model`` saves it merged."""
        state = self.state_dict()
        wrapped = [key for key in state if ".base_layer." in key]
        if wrapped:
            raise ConfigError(f"save({directory}): {wrapped[0]} ... are wrapped layers (LoRA) that no reader of "
                              f"vitkit's format takes; vitkit.checkpoints.adapters.save_model merges them first, "
                              f"save_adapter writes the adapter alone")
        return save_native(directory, self.config, state)


def save_native(directory: str | Path, config: ViTConfig, state: dict[str, torch.Tensor]) -> Path:
    """``VisionTransformer.save`` for weights held apart from a model (gathered from FSDP shards)."""
    with atomic_directory(directory) as staging:
        (staging / CONFIG_FILE).write_text(config.to_json())
        weights = {name: t.detach().cpu().contiguous() for name, t in state.items()}
        with os_errors(directory):
            save_file(weights, staging / WEIGHTS_FILE, metadata={"format": "vitkit"})
    return Path(directory)
