"""Images at their own aspect ratio and resolution in one batch (NaFlex, SigLIP 2): each image is resized, keeping
its aspect ratio, to the most patches a budget allows, cut into patches, and padded to the batch's length; the
model is told each patch's place in its image's grid and which patches are padding.

A batch is a :class:`PatchBatch`; :func:`naflex_batch` makes one from images of any sizes, and
``VisionTransformer.forward`` takes it in place of an image tensor (position tables and rotary tables are made
per image for its grid; padding is masked out of attention and pooling)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import InputError


@dataclass
class PatchBatch:
    """Patches of B images, padded to N per image.

    ``patches``: (B, N, P*P*C) pixels, each patch flattened row by row with the channels last (SigLIP 2's order);
    ``coords``: (B, N, 2) int64 (row, column) of each patch in its image's grid; ``mask``: (B, N) bool, True for a
    real patch; ``grids``: (B, 2) int64 (rows, columns) of each image's grid."""

    patches: torch.Tensor
    coords: torch.Tensor
    mask: torch.Tensor
    grids: torch.Tensor

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None, non_blocking: bool = False
           ) -> "PatchBatch":
        move = dict(device=device, non_blocking=non_blocking)
        return PatchBatch(self.patches.to(dtype=dtype, **move), self.coords.to(**move), self.mask.to(**move),
                          self.grids.to(**move))

    def __len__(self) -> int:
        return self.patches.shape[0]


def check_patch_batch(batch: PatchBatch, patch_size: int, in_chans: int) -> None:
    """Shapes, types and ranges of a batch, before anything is computed from it; one line naming what is wrong."""
    patches, coords, mask, grids = batch.patches, batch.coords, batch.mask, batch.grids
    width = patch_size * patch_size * in_chans
    if patches.ndim != 3 or patches.shape[-1] != width or not patches.is_floating_point():
        raise InputError(f"NaFlex patches of shape {tuple(patches.shape)} ({patches.dtype}); expected floating-point "
                         f"(batch, patches, {width}) for {patch_size}x{patch_size} patches of {in_chans} channels")
    batch_size, count = patches.shape[:2]
    if batch_size == 0 or count == 0:
        raise InputError(f"NaFlex patches of shape {tuple(patches.shape)}; expected at least one image and patch")
    if coords.shape != (batch_size, count, 2) or mask.shape != (batch_size, count) or grids.shape != (batch_size, 2):
        raise InputError(f"NaFlex coords {tuple(coords.shape)}, mask {tuple(mask.shape)}, grids {tuple(grids.shape)} "
                         f"for patches {tuple(patches.shape)}; expected ({batch_size}, {count}, 2), "
                         f"({batch_size}, {count}) and ({batch_size}, 2)")
    if mask.dtype != torch.bool or coords.is_floating_point() or grids.is_floating_point():
        raise InputError(f"NaFlex mask of {mask.dtype}, coords of {coords.dtype}, grids of {grids.dtype}; expected a "
                         f"bool mask and integer coords and grids")
    empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise InputError(f"NaFlex mask of image {empty[0]} is empty: every image needs at least one real patch")
    if (grids < 1).any():
        raise InputError(f"NaFlex grids {grids.tolist()}; expected positive rows and columns")
    outside = mask & ((coords < 0) | (coords >= grids[:, None, :])).any(dim=-1)
    if outside.any():
        image, patch = outside.nonzero()[0].tolist()
        raise InputError(f"NaFlex patch {patch} of image {image} at (row, column) {tuple(coords[image, patch].tolist())} "
                         f"lies outside its grid {tuple(grids[image].tolist())}")


def size_for_patch_budget(height: int, width: int, patch_size: int, max_patches: int) -> tuple[int, int]:
    """The (height, width), multiples of ``patch_size``, of the image resized by one scale (each side rounded up
    to whole patches, at least one) with the most patches not over ``max_patches``: SigLIP 2's rule, the scale
    found by bisection to within 1e-5."""
    if not (isinstance(max_patches, int) and max_patches >= 1):
        raise InputError(f"max_patches={max_patches!r}; expected an int >= 1")

    def sides(scale: float) -> tuple[int, int]:
        return tuple(max(patch_size, math.ceil(side * scale / patch_size) * patch_size) for side in (height, width))

    low, high = 1e-6, 100.0
    while high - low >= 1e-5:
        scale = (low + high) / 2
        rows, cols = sides(scale)
        if (rows // patch_size) * (cols // patch_size) <= max_patches:
            low = scale
        else:
            high = scale
    return sides(low)


def patchify(image: torch.Tensor, patch_size: int) -> torch.Tensor:
    """A (C, H, W) image, H and W multiples of the patch, as (H/P * W/P, P*P*C) patches in row-major order."""
    channels, height, width = image.shape
    rows, cols = height // patch_size, width // patch_size
    grid = image.reshape(channels, rows, patch_size, cols, patch_size).permute(1, 3, 2, 4, 0)
    return grid.reshape(rows * cols, -1)


def naflex_batch(images: Sequence[torch.Tensor], patch_size: int, max_patches: int) -> PatchBatch:
    """Images of any sizes ((C, H, W) float tensors, normalised) as one :class:`PatchBatch` of ``max_patches``
    patches per image: each resized (bilinear, antialiased) keeping its aspect ratio to the most patches the
    budget allows, cut into patches, padded."""
    if not images:
        raise InputError("naflex_batch of no images; expected at least one")
    resized = []
    for index, image in enumerate(images):
        if image.ndim != 3 or not image.is_floating_point() or min(image.shape[1:]) < 1:
            raise InputError(f"image {index} of shape {tuple(image.shape)} ({image.dtype}); expected a floating-point "
                             f"(channels, height, width) tensor")
        size = size_for_patch_budget(image.shape[1], image.shape[2], patch_size, max_patches)
        resized.append(F.interpolate(image[None].float(), size=size, mode="bilinear", align_corners=False,
                                     antialias=True)[0].to(image.dtype))
    return patch_batch(resized, patch_size, max_patches)


def patch_batch(images: Sequence[torch.Tensor], patch_size: int, max_patches: int) -> PatchBatch:
    """Images already sized in whole patches, at most ``max_patches`` each, as one padded :class:`PatchBatch`."""
    patches, coords, masks, grids = [], [], [], []
    for image in images:
        rows, cols = image.shape[1] // patch_size, image.shape[2] // patch_size
        count = rows * cols
        if count > max_patches or (rows * patch_size, cols * patch_size) != tuple(image.shape[1:]):
            raise InputError(f"an image of {tuple(image.shape[1:])} pixels in a batch of {max_patches} patches of "
                             f"{patch_size} px; expected sides in whole patches, at most {max_patches} of them")
        row, col = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        patches.append(F.pad(patchify(image, patch_size), (0, 0, 0, max_patches - count)))
        coords.append(F.pad(torch.stack([row.flatten(), col.flatten()], dim=-1), (0, 0, 0, max_patches - count)))
        masks.append(torch.arange(max_patches) < count)
        grids.append(torch.tensor([rows, cols]))
    return PatchBatch(torch.stack(patches), torch.stack(coords), torch.stack(masks), torch.stack(grids))
