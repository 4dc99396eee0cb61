"""The hybrid's CNN (section 3.2): a BiT ResNet with weight-standardised convolutions and Group Norm.

Its feature map replaces the image as the input of the patch projection. Convolutions and the stem's
max-pool pad like TensorFlow's SAME (more on the bottom/right when the padding is odd), as the Google
and timm checkpoints were trained with.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig, backbone_stride


def same_padding(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """Pad the last two dims so that a (kernel, stride) window gives ceil(size / stride) outputs."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads, value=value) if any(pads) else x


def standardize(weight: torch.Tensor, formula: str, eps: float) -> torch.Tensor:
    """Each output filter to zero mean and unit (biased) standard deviation."""
    centred = weight - weight.mean(dim=(1, 2, 3), keepdim=True)
    variance = centred.square().mean(dim=(1, 2, 3), keepdim=True)
    if formula == "std+eps":
        return centred / (variance.sqrt() + eps)
    return centred / (variance + eps).sqrt()


class StdConv2d(nn.Conv2d):
    """Bias-free convolution of the standardised kernel, with SAME padding."""

    def __init__(self, in_chans: int, out_chans: int, kernel_size: int, stride: int = 1, *,
                 formula: str = "std+eps", eps: float = 1e-5):
        super().__init__(in_chans, out_chans, kernel_size, stride=stride, bias=False)
        self.formula, self.eps = formula, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = same_padding(x, self.kernel_size[0], self.stride[0])
        return F.conv2d(x, standardize(self.weight, self.formula, self.eps), None, self.stride)


class MaxPoolSame(nn.Module):
    """3x3 max-pool with stride 2 and SAME padding (padded cells never win)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(same_padding(x, 3, 2, value=float("-inf")), kernel_size=3, stride=2)


class Bottleneck(nn.Module):
    """ResNet v1.5 unit: 1x1 -> 3x3 (strided) -> 1x1 convolutions, each followed by Group Norm; the
    shortcut is projected (1x1 conv + GN) where the shape changes."""

    def __init__(self, in_chans: int, out_chans: int, stride: int, conv, norm):
        super().__init__()
        mid = out_chans // 4
        self.downsample = None
        if stride != 1 or in_chans != out_chans:
            self.downsample = nn.Sequential(OrderedDict(conv=conv(in_chans, out_chans, 1, stride),
                                                        norm=norm(out_chans)))
        self.conv1, self.norm1 = conv(in_chans, mid, 1), norm(mid)
        self.conv2, self.norm2 = conv(mid, mid, 3, stride), norm(mid)
        self.conv3, self.norm3 = conv(mid, out_chans, 1), norm(out_chans)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        return F.relu(self.norm3(self.conv3(y)) + shortcut)


class ResNet(nn.Module):
    """Stem (7x7/2 conv, GN, ReLU, 3x3/2 max-pool) then one stage per entry of ``layers``; the first
    stage keeps the resolution, every later one halves it. The paper's R50 keeps three stages (3, 4, 9)."""

    def __init__(self, in_chans: int, width: int, layers: tuple[int, ...], *, std_conv: str = "std+eps",
                 std_conv_eps: float = 1e-5, gn_groups: int = 32, gn_eps: float = 1e-6):
        super().__init__()

        def conv(c_in: int, c_out: int, kernel: int, stride: int = 1) -> StdConv2d:
            return StdConv2d(c_in, c_out, kernel, stride, formula=std_conv, eps=std_conv_eps)

        def norm(channels: int) -> nn.GroupNorm:
            return nn.GroupNorm(gn_groups, channels, eps=gn_eps)

        self.stem = nn.Sequential(OrderedDict(conv=conv(in_chans, width, 7, 2), norm=norm(width),
                                              act=nn.ReLU(), pool=MaxPoolSame()))
        self.stages = nn.ModuleList()
        channels = width
        for index, blocks in enumerate(layers):
            out_chans = 4 * width * 2 ** index
            units = [Bottleneck(channels if unit == 0 else out_chans, out_chans,
                                2 if index and unit == 0 else 1, conv, norm) for unit in range(blocks)]
            self.stages.append(nn.Sequential(*units))
            channels = out_chans
        self.out_chans = channels
        self.stride = backbone_stride(layers)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """The last GN of every unit starts at zero (as in BiT), so each unit starts as its shortcut."""
        for module in self.modules():
            if isinstance(module, Bottleneck):
                nn.init.zeros_(module.norm3.weight)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images.contiguous(memory_format=torch.channels_last))  # faster convolutions and max-pool
        for stage in self.stages:
            x = stage(x)
        return x


def make_backbone(config: ViTConfig) -> ResNet | None:
    """The hybrid's ResNet described by ``config``, or None for a plain ViT."""
    if config.backbone is None:
        return None
    return ResNet(config.in_chans, config.backbone_width, config.backbone, std_conv=config.std_conv,
                  std_conv_eps=config.std_conv_eps, gn_groups=config.gn_groups, gn_eps=config.gn_eps)
