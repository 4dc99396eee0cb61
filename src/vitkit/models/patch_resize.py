"""FlexiViT (Beyer et al. 2023): a patch-projection kernel carried over to another patch size.

A patch x of P x P pixels, resized to P' x P', is ``R x`` for a fixed (P'^2, P^2) matrix R. The kernel
``k'`` that gives a resized patch the token the original patch had, ``<R x, k'> = <x, k>`` for every x, is
``k' = pinv(R)^T k``: exact when upsampling, the least-squares best when downsampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ConfigError, InputError
from .config import is_int


def resize_matrix(old_size: tuple[int, int], new_size: tuple[int, int], mode: str, antialias: bool
                  ) -> torch.Tensor:
    """The (P'h*P'w, Ph*Pw) float32 matrix R of the image resize: column i is basis image i resized
    (pixel centres at half-pixel offsets, as an image is resized)."""
    count = old_size[0] * old_size[1]
    basis = torch.eye(count, dtype=torch.float32).reshape(count, 1, *old_size)
    align = False if mode in ("bilinear", "bicubic") else None
    resized = F.interpolate(basis, size=new_size, mode=mode, antialias=antialias, align_corners=align)
    return resized.reshape(count, -1).T


def resample_patch_kernel(kernel: torch.Tensor, new_size: tuple[int, int], mode: str = "bicubic",
                          antialias: bool = True) -> torch.Tensor:
    """The (D, C, P, P) patch kernel resampled to (D, C, *new_size) by the pseudo-inverse of the resize
    (``F.interpolate``'s ``mode`` and ``antialias``), so that a patch resized to ``new_size`` gets
    (nearly) the token the original patch got; the bias of the projection needs no change.

    Computed on the CPU in float32, timm's precision (its kernels equal these), and returned on the
    kernel's device in its dtype. The defaults are timm's; its FlexiViT weights resize bilinear, without
    antialias."""
    if not (isinstance(new_size, tuple | list) and len(new_size) == 2
            and all(is_int(side) and side > 0 for side in new_size)):
        raise ConfigError(f"patch size {new_size!r}: expected a (height, width) pair of positive ints")
    if kernel.ndim != 4:
        raise InputError(f"patch kernel of shape {tuple(kernel.shape)}: expected (dim, channels, height, width)")
    new_size = tuple(new_size)
    if tuple(kernel.shape[-2:]) == new_size:
        return kernel
    matrix = resize_matrix(tuple(kernel.shape[-2:]), new_size, mode, antialias)
    flat = kernel.detach().to("cpu", torch.float32).flatten(2)  # (D, C, Ph*Pw)
    resampled = flat @ torch.linalg.pinv(matrix)  # (Ph*Pw, P'h*P'w) pseudo-inverse: k' = pinv(R)^T k per (D, C)
    return resampled.reshape(*kernel.shape[:2], *new_size).to(kernel.device, kernel.dtype)
