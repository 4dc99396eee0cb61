"""Monocular depth datasets as people hold them on disk, read as ``dense.DenseDataset``s (images with depth maps
in metres, 0 where there is no depth); nothing is downloaded. Depth maps are 16-bit PNGs of millimetres.

- ``nyu:DIR``: NYU Depth v2 as the depth code bases hold it, split lists of lines ``IMAGE DEPTH FOCAL``
  (``/kitchen_0028b/rgb_00045.jpg /kitchen_0028b/sync_depth_00045.png 518.8579``; the focal length is not read,
  a leading slash is dropped) in either of two layouts:

  - the Monocular-Depth-Estimation-Toolbox's, which DINOv2's depth evaluation reads: ``DIR/nyu_train.txt`` and
    ``DIR/nyu_test.txt``, their paths relative to DIR (the training scenes and the test scenes side by side);
  - BTS's: ``DIR/sync/`` (the training scenes) and ``DIR/official_splits/test/`` (the 654 test images), listed by
    ``nyudepthv2_train_files_with_gt.txt`` and ``nyudepthv2_test_files_with_gt.txt`` (in DIR or in
    ``DIR/train_test_inputs/``, where BTS keeps them), their paths relative to those two folders.

  Depth is capped at 10 m and evaluated in Eigen's crop of the 480x640 images, rows 45:471 and columns 41:601 (as
  BTS and the toolbox evaluate). Splits ``train`` and ``test``, those listed.
- ``depthfolder:DIR``: ``DIR/SPLIT/images/NAME.*`` (any image the image reader takes) with
  ``DIR/SPLIT/depth/NAME.png``; no depth cap, no crop. The splits present among ``train``, ``val`` and ``test``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import DatasetError
from ...paths import resolved, within
from ..dense import DEPTH, DenseDataset, checked_pairs, present_splits, split_folder_pairs
from ..listed import list_lines
from ..splits import SPLITS
from .base import DenseSource

NYU_SPLITS = ("train", "test")
NYU_MAX_DEPTH = 10.0
EIGEN_CROP = (45, 471, 41, 601)
"""Where NYU depth is evaluated: rows 45:471 and columns 41:601 of a 480x640 depth map (Eigen et al., 2014)."""
BTS_FOLDERS = {"train": "sync", "test": "official_splits/test"}  # where the paths of BTS's lists start


def nyu_list(root: Path, split: str) -> tuple[str, str] | None:
    """The list file of ``split`` in the NYU folder ``root`` and the folder its paths start from, both relative
    to ``root``: the toolbox's ``nyu_SPLIT.txt`` first, then BTS's list; None when there is neither."""
    if (root / f"nyu_{split}.txt").is_file():
        return f"nyu_{split}.txt", ""
    for folder in ("", "train_test_inputs/"):
        if (root / f"{folder}nyudepthv2_{split}_files_with_gt.txt").is_file():
            return f"{folder}nyudepthv2_{split}_files_with_gt.txt", BTS_FOLDERS[split]
    return None


class Nyu(DenseSource):
    """``nyu:DIR``."""

    argument = "DIR"
    known_splits = (*NYU_SPLITS, "val")  # val held out of train

    def recognises(self, path: Path) -> int:
        return 2 * any(nyu_list(path, split) for split in NYU_SPLITS)

    def present(self, path: str) -> tuple[str, ...]:
        return tuple(split for split in NYU_SPLITS if nyu_list(Path(path), split)) or NYU_SPLITS

    def read(self, path: str, split: str) -> DenseDataset:
        return read_nyu(Path(path), split)


def read_nyu(root: Path, split: str) -> DenseDataset:
    """The ``train`` or ``test`` split of NYU Depth v2 at ``root``, in the order its list gives."""
    found = nyu_list(root, split)
    if found is None:
        raise DatasetError(f"{root}: no nyu_{split}.txt (the layout DINOv2's depth toolbox reads) nor "
                           f"nyudepthv2_{split}_files_with_gt.txt in it or its train_test_inputs/ (BTS's); "
                           f"expected one of them")
    name, base = found
    listing = within(resolved(root), name, DatasetError, "the split list")
    pairs = []
    for line, fields in enumerate(list_lines(listing, "the NYU split list"), 1):
        if len(fields) not in (2, 3):
            raise DatasetError(f"{listing}:{line}: expected '<image> <depth map> <focal length>'")
        pairs.append((os.path.join(base, fields[0].lstrip("/")), os.path.join(base, fields[1].lstrip("/"))))
    return DenseDataset(checked_pairs(root, pairs, listing, "depth map"), DEPTH, [], f"{root}[{split}]",
                        max_depth=NYU_MAX_DEPTH, eval_crop=EIGEN_CROP)


class DepthFolder(DenseSource):
    """``depthfolder:DIR``."""

    argument = "DIR"

    def recognises(self, path: Path) -> int:
        return 2 * any((path / split / "depth").is_dir() for split in SPLITS)

    def present(self, path: str) -> tuple[str, ...]:
        return present_splits(Path(path))

    def read(self, path: str, split: str) -> DenseDataset:
        return read_depth_folder(Path(path), split)


def read_depth_folder(root: Path, split: str) -> DenseDataset:
    """The ``split`` of the depth folder ``root``, its images by name."""
    return DenseDataset(split_folder_pairs(root, split, "depth", "depth map"), DEPTH, [], f"{root}[{split}]")
