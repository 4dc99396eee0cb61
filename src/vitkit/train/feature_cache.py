"""A frozen backbone's dense features, computed once per image: what makes a probe's later epochs cost only its
head. An image is known by its pixels (a digest of the batch row the loader made), so the cache is right whatever
order the images come in, and only where the same image always reaches the model as the same pixels (no random
crops or flips: ``--transform eval``) and the backbone is deterministic (frozen, no dropout) does it ever hit.
"""

from __future__ import annotations

import hashlib

import torch

from ..models.dense import Features
from ..models.vit import VisionTransformer



class CachedFeatures:
    """``model.dense_features`` of a batch, each image's taken from the cache when its pixels were seen before,
    else computed (without a gradient: the backbone is frozen) and kept in host memory while the cache holds
    under ``limit_bytes``. ``hits`` and ``misses`` count images."""

    def __init__(self, model: VisionTransformer, limit_bytes: int):
        self.model, self.limit = model, limit_bytes
        self.entries: dict[bytes, Features] = {}  # one image's (patch map, [class] state) per block, unbatched
        self.bytes = self.hits = self.misses = 0

    @staticmethod
    def key(image: torch.Tensor) -> bytes:
        """A digest of one image's pixels as the model receives them."""
        return hashlib.blake2b(image.detach().cpu().contiguous().numpy().tobytes(), digest_size=16).digest()

    def __call__(self, images: torch.Tensor) -> Features:
        keys = [self.key(image) for image in images]
        found = {index: self.entries[key] for index, key in enumerate(keys) if key in self.entries}
        missing = [index for index in range(len(keys)) if index not in found]
        self.hits, self.misses = self.hits + len(found), self.misses + len(missing)
        if missing:
            with torch.no_grad():
                computed = self.model.dense_features(images[missing])
            for row, index in enumerate(missing):
                entry = [(patches[row].cpu().clone(), None if state is None else state[row].cpu().clone())
                         for patches, state in computed]
                found[index] = entry
                size = sum(t.numel() * t.element_size() for pair in entry for t in pair if t is not None)
                if self.bytes + size <= self.limit:
                    self.entries[keys[index]] = entry
                    self.bytes += size
        ordered = [found[index] for index in range(len(keys))]
        device = images.device
        return [(torch.stack([entry[block][0] for entry in ordered]).to(device),
                 None if ordered[0][block][1] is None else
                 torch.stack([entry[block][1] for entry in ordered]).to(device))
                for block in range(len(ordered[0]))]
