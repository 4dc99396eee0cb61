"""Images packed into one sequence of patches (Qwen VL's vision towers): the patches of every image one after the
other, in any order, each told its image and its (row, column) in that image's grid. Every image attends to itself
alone; nothing is padded.

A batch is a :class:`PackedBatch`; ``VisionTransformer.forward_features`` takes it in place of an image tensor and
returns one row per patch, in the batch's order; ``forward_head(features, pre_logits=True)`` of a model with a patch
merger returns the merged tokens, image by image, each image's cells row by row.
``vitkit.checkpoints.qwen.packed_batch_from_hf`` makes one from transformers' Qwen2-VL image processor output."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError


@dataclass
class PackedBatch:
    """N patches of I images in one sequence.

    ``patches``: (N, P*P*C) pixels, each patch flattened row by row with the channels last (as a NaFlex
    ``PatchBatch``); ``coords``: (N, 2) int64 (row, column) of each patch in its image's grid; ``images``: (N,)
    int64, the image each patch belongs to; ``grids``: (I, 2) int64 (rows, columns) of each image's grid."""

    patches: torch.Tensor
    coords: torch.Tensor
    images: torch.Tensor
    grids: torch.Tensor

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None, non_blocking: bool = False
           ) -> "PackedBatch":
        move = dict(device=device, non_blocking=non_blocking)
        return PackedBatch(self.patches.to(dtype=dtype, **move), self.coords.to(**move), self.images.to(**move),
                           self.grids.to(**move))

    def __len__(self) -> int:
        return self.grids.shape[0]

    @property
    def token_grids(self) -> torch.Tensor:
        """(N, 2) the grid of each patch's image."""
        return self.grids[self.images]


def check_packed_batch(batch: PackedBatch, patch_size: int, in_chans: int) -> None:
    """Shapes, types and ranges of a packed batch, before anything is computed from it; one line naming what is
    wrong."""
    patches, coords, images, grids = batch.patches, batch.coords, batch.images, batch.grids
    width = patch_size * patch_size * in_chans
    if patches.ndim != 2 or patches.shape[-1] != width or not patches.is_floating_point() or not len(patches):
        raise InputError(f"packed patches of shape {tuple(patches.shape)} ({patches.dtype}); expected floating-point "
                         f"(patches, {width}) for {patch_size}x{patch_size} patches of {in_chans} channels")
    count = patches.shape[0]
    if coords.shape != (count, 2) or images.shape != (count,) or grids.ndim != 2 or grids.shape[-1] != 2:
        raise InputError(f"packed coords {tuple(coords.shape)}, images {tuple(images.shape)}, grids "
                         f"{tuple(grids.shape)} for patches {tuple(patches.shape)}; expected ({count}, 2), ({count},) "
                         f"and (images, 2)")
    if coords.is_floating_point() or images.is_floating_point() or grids.is_floating_point():
        raise InputError(f"packed coords of {coords.dtype}, images of {images.dtype}, grids of {grids.dtype}; "
                         f"expected integers")
    if (grids < 1).any() or (images < 0).any() or (images >= len(grids)).any():
        raise InputError(f"packed grids {grids.tolist()} and image indices from {images.min().item()} to "
                         f"{images.max().item()}; expected positive sides and indices of the {len(grids)} grids")
    sizes = torch.bincount(images, minlength=len(grids))
    wrong = (sizes != grids.prod(dim=-1)).nonzero().flatten().tolist()
    if wrong:
        i = wrong[0]
        raise InputError(f"packed image {i} has {sizes[i].item()} patches for its grid {tuple(grids[i].tolist())}; "
                         f"expected {grids[i].prod().item()}, one per cell")
    cells = (images * grids[:, 0].max() + coords[:, 0]) * grids[:, 1].max() + coords[:, 1]
    if len(torch.unique(cells)) != count:
        raise InputError(f"packed patches of {count} share cells: expected each (row, column) of an image once")
    outside = ((coords < 0) | (coords >= grids[images])).any(dim=-1)
    if outside.any():
        patch = outside.nonzero()[0].item()
        raise InputError(f"packed patch {patch} of image {images[patch].item()} at (row, column) "
                         f"{tuple(coords[patch].tolist())} lies outside its grid "
                         f"{tuple(grids[images[patch]].tolist())}")
