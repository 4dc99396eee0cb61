"""Dense heads: per-pixel outputs (semantic segmentation, depth) from the patch tokens of chosen blocks, the
paper's first open question (section 5: "apply ViT to other computer vision tasks, such as detection and
segmentation").

Each block's tokens reach a head as a patch map (B, D, rows, cols), after the final norm as DINOv2 reads them, with
the [class] token's state beside it (None for a model without one):

- ``linear`` (DINOv2's linear probe, mmseg's BNHead): the last block's patch map through BatchNorm and a 1x1
  convolution: outputs at the patch grid. For depth the [class] token's state is concatenated to every position
  first (DINOv2's "lin. 1"; its segmentation probe reads the patches alone).
- ``linear-ms``: the same over the last four blocks' maps concatenated (DINOv2's "+ms" and "lin. 4"; the
  multi-scale test of "+ms" is the evaluation's to do).
- ``dpt`` (Ranftl et al. 2021, the decoder DINOv2's depth uses): four evenly spaced blocks, each reassembled at
  1/4, 1/8, 1/16 and 1/32 of the input's resolution (4, 2, 1 and 1/2 times the grid of 14-16 px patches, as
  DPT and DINOv2 place them; for other patches the nearest powers of two), the [class] state projected into every
  position, fused from the coarsest by residual convolution units, each fusion doubling the resolution: outputs
  at about the input's resolution.

Outputs are logits (``dense_output='classes'``) or depth in metres (``'depth'``): the head's outputs, made
positive (ReLU + 0.1) and normalised to sum to 1 per pixel (AdaBins' and DINOv2's linear normalisation), weigh
``num_classes`` bins spaced evenly in [depth_min, depth_max]. Predictions are brought to a mask's size by
``resized`` (bilinear, corners not aligned: mmseg's resize), where the metrics are computed.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig

Features = list[tuple[torch.Tensor, torch.Tensor | None]]
"""What a dense head reads: for each of its blocks, the (B, D, rows, cols) patch map and the (B, D) [class] state."""

FUSION_CHANNELS = 256  # DPT's width after reassembly (DINOv2's "channels" for every ViT size), or D if narrower
DEPTH_BIN_FLOOR = 0.1  # added to the ReLU'd bin weights before normalising (DINOv2's linear norm strategy)


def dense_layers(config: ViTConfig) -> list[int]:
    """The blocks a dense head reads, by index: the last (linear), the last four (linear-ms), or four evenly
    spaced ending with the last (dpt: 2, 5, 8, 11 of twelve); a model of fewer than four blocks gives some twice."""
    depth = config.depth
    if config.dense_head == "linear":
        return [depth - 1]
    if config.dense_head == "linear-ms":
        return [max(depth - 4 + i, 0) for i in range(4)]
    return [max(round(depth * (i + 1) / 4) - 1, 0) for i in range(4)]


def resized(outputs: torch.Tensor, size: tuple[int, int] | torch.Size) -> torch.Tensor:
    """``outputs`` (B, C, h, w) brought to ``size`` (H, W) bilinearly with corners not aligned, as mmseg resizes
    logits to each mask's own size before its metrics; unchanged when already that size."""
    if tuple(outputs.shape[-2:]) == tuple(size):
        return outputs
    return F.interpolate(outputs, size=tuple(size), mode="bilinear", align_corners=False)


def depth_from_bins(weights: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """(B, 1, h, w) depth: the (B, K, h, w) head outputs made positive (ReLU + 0.1) and normalised over the K bins,
    weighing the bins' depths, spaced evenly from ``low`` to ``high``."""
    weights = F.relu(weights) + DEPTH_BIN_FLOOR
    weights = weights / weights.sum(dim=1, keepdim=True)
    bins = torch.linspace(low, high, weights.shape[1], device=weights.device, dtype=weights.dtype)
    return torch.einsum("bkhw,k->bhw", weights, bins).unsqueeze(1)


def with_class_state(patches: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
    """The patch map with the [class] token's state concatenated to every position (as channels)."""
    if state is None:
        return patches
    return torch.cat([patches, state[:, :, None, None].expand(-1, -1, *patches.shape[-2:])], dim=1)


class SyncedBatchNorm(nn.BatchNorm2d):
    """BatchNorm whose training statistics, under a process group of several ranks (torchrun), are those of every
    rank's batch together, as mmseg's SyncBN gives DINOv2's linear heads; plain BatchNorm otherwise, and the same
    weights and buffers. The per-channel sums go through the differentiable all-reduce, so it works over gloo (CPU)
    as over NCCL, and the gradient is the one of a single batch of all ranks' images."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce

        channels = x.shape[1]
        count = torch.full((1,), x.numel() / channels, device=x.device, dtype=torch.float32)
        sums = all_reduce(torch.cat([x.float().sum(dim=(0, 2, 3)), x.float().square().sum(dim=(0, 2, 3)), count]))
        total = sums[-1]
        mean = sums[:channels] / total
        var = (sums[channels:2 * channels] / total - mean.square()).clamp(min=0)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                factor = self.momentum if self.momentum is not None else 1 / float(self.num_batches_tracked)
                self.running_mean.lerp_(mean, factor)
                self.running_var.lerp_(var * total / (total - 1).clamp(min=1), factor)  # unbiased, as torch keeps
        scale = torch.rsqrt(var + self.eps) * (self.weight if self.affine else 1)
        shift = (self.bias if self.affine else 0) - mean * scale
        return (x * scale[None, :, None, None] + shift[None, :, None, None]).to(x.dtype)


class LinearHead(nn.Module):
    """BatchNorm (synchronised over ranks) then a 1x1 convolution over the blocks' patch maps concatenated, each
    with the [class] state where ``class_state`` (depth)."""

    def __init__(self, width: int, outputs: int, class_state: bool):
        super().__init__()
        self.class_state = class_state
        self.bn = SyncedBatchNorm(width)
        self.conv = nn.Conv2d(width, outputs, kernel_size=1)
        nn.init.normal_(self.conv.weight, std=0.01)  # mmseg's init of a segmentation layer
        nn.init.zeros_(self.conv.bias)

    def forward(self, features: Features) -> torch.Tensor:
        maps = [with_class_state(patches, state if self.class_state else None) for patches, state in features]
        return self.conv(self.bn(torch.cat(maps, dim=1)))


class ResidualUnit(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convolutions that keep the width (DPT's residual convolution unit)."""

    def __init__(self, channels: int):
        super().__init__()
        self.first = nn.Conv2d(channels, channels, 3, padding=1)
        self.second = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.second(F.relu(self.first(F.relu(x))))


class Fusion(nn.Module):
    """DPT's fusion block: the coarser path (brought to the skip's size, which it differs from where the patch grid
    is odd) plus a residual unit of the skip, a second residual unit, doubled in resolution (bilinear, corners aligned), then a 1x1 projection."""

    def __init__(self, channels: int):
        super().__init__()
        self.skip_unit, self.unit = ResidualUnit(channels), ResidualUnit(channels)
        self.project = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        if skip is not None:  # the path resized to the finer skip's size (the identity where an even grid makes them
            # equal; resized always, so that a traced graph takes any size)
            x = F.interpolate(x, size=skip.shape[-2:], mode="bilinear", align_corners=False) + self.skip_unit(skip)
        x = F.interpolate(self.unit(x), scale_factor=2, mode="bilinear", align_corners=True)
        return self.project(x)


def rescaling(channels: int, scale: float) -> nn.Module:
    """DPT's change of resolution by ``scale``, a power of two: a transposed convolution of kernel and stride
    ``scale`` to enlarge, a 3x3 convolution of stride ``1 / scale`` to shrink."""
    if scale > 1:
        return nn.ConvTranspose2d(channels, channels, int(scale), stride=int(scale))
    if scale < 1:
        return nn.Conv2d(channels, channels, 3, stride=round(1 / scale), padding=1)
    return nn.Identity()


def dpt_scales(patch_size: int) -> list[float]:
    """The resolutions DPT reassembles four blocks at, relative to the patch grid: 4, 2, 1 and 1/2 for patches of
    14-16 px (1/4 to 1/32 of the input, as DPT and DINOv2 have them), shifted by the nearest power of two of
    patch / 16 for other patches (8 px: 2, 1, 1/2, 1/4), so that the maps keep their place relative to the input."""
    shift = round(math.log2(patch_size / 16))
    return [2.0 ** (level + shift) for level in (2, 1, 0, -1)]


class DPTHead(nn.Module):
    """DPT (Ranftl et al. 2021): reassemble four blocks' tokens into maps at ``dpt_scales`` times the patch grid
    (the [class] state joined by a linear layer and GELU: DPT's "project" readout; 1x1 convolutions to D/8, D/4,
    D/2 and D channels; transposed or strided convolutions to the scale; 3x3 convolutions to 256, or D if that is
    fewer), fuse them from the coarsest, then a head of convolutions that doubles the resolution once more."""

    def __init__(self, dim: int, outputs: int, class_token: bool, patch_size: int = 16):
        super().__init__()
        widths = [max(dim // 8, 1), max(dim // 4, 1), max(dim // 2, 1), dim]
        self.readout = nn.ModuleList(nn.Sequential(nn.Linear(2 * dim, dim), nn.GELU()) for _ in widths) \
            if class_token else None
        self.project = nn.ModuleList(nn.Conv2d(dim, width, 1) for width in widths)
        self.rescale = nn.ModuleList(rescaling(width, scale) for width, scale in zip(widths, dpt_scales(patch_size)))
        channels = min(FUSION_CHANNELS, dim)
        self.to_fusion = nn.ModuleList(nn.Conv2d(width, channels, 3, padding=1, bias=False) for width in widths)
        self.fusions = nn.ModuleList(Fusion(channels) for _ in widths)
        half = max(channels // 2, 1)
        self.out_first = nn.Conv2d(channels, half, 3, padding=1)
        self.out_second = nn.Conv2d(half, 32, 3, padding=1)
        self.out_last = nn.Conv2d(32, outputs, 1)

    def reassemble(self, index: int, patches: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        if self.readout is not None and state is not None:
            joined = with_class_state(patches, state).permute(0, 2, 3, 1)
            patches = self.readout[index](joined).permute(0, 3, 1, 2)
        return self.to_fusion[index](self.rescale[index](self.project[index](patches)))

    def forward(self, features: Features) -> torch.Tensor:
        maps = [self.reassemble(index, *pair) for index, pair in enumerate(features)]
        x = self.fusions[-1](maps[-1])
        for fusion, skip in zip(self.fusions[-2::-1], maps[-2::-1]):
            x = fusion(x, skip)
        x = F.interpolate(self.out_first(x), scale_factor=2, mode="bilinear", align_corners=True)
        return self.out_last(F.relu(self.out_second(x)))


class DenseHead(nn.Module):
    """The config's dense head and what its outputs mean: logits, or depth from bins (``depth_from_bins``)."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        if config.dense_head == "dpt":
            self.decoder = DPTHead(config.dim, config.num_classes, config.class_token, config.effective_patch_size)
        else:
            class_state = config.class_token and config.dense_output == "depth"
            width = config.dim * (2 if class_state else 1) * len(dense_layers(config))
            self.decoder = LinearHead(width, config.num_classes, class_state)

    def forward(self, features: Features) -> torch.Tensor:
        """(B, num_classes, h, w) logits, or (B, 1, h, w) depth in metres, at the head's resolution."""
        outputs = self.decoder(features)
        c = self.config
        return depth_from_bins(outputs.float(), c.depth_min, c.depth_max) if c.dense_output == "depth" else outputs
