"""The sources of datasets, one module each, and ``SOURCES``: the registry that ``datasets`` dispatches on, keyed
by the prefix of a dataset's name (``npz:``, ``imagefolder:``, ``webdataset:``, ``hf:``, ``vtab:`` ...) or a plain name.

Adding a source (say a Lance or Zarr store, ``lance:PATH``): write ``sources/lance.py`` with a subclass of
``base.Source`` that implements ``open`` (and ``splits``, ``recognises`` where the defaults do not fit), build
its datasets from the shared pieces (``map_style.FileDataset`` / ``ArrayDataset`` for map-style data,
``shards.indexed_split`` for data read as streams, ``images.read_image`` to decode, ``splits`` for split names)
and add one entry ``"lance:": Lance()`` below. A source imports only those shared modules and ``base``, never
``datasets`` or this registry, so no import runs in a circle.
"""

from .base import ReadOptions, Source
from .depth import DepthFolder, Nyu
from .flowers102 import Flowers102
from .hf import HuggingFace
from .imagefolder import ImageFolder
from .imagenet import ImageNet
from .named import NAMED
from .npz import Npz
from .pets import Pets
from .segmentation import Ade20k, Cityscapes, MaskFolder, Voc
from .vtab import Vtab
from .webdataset import WebDataset

SOURCES: dict[str, Source] = {**NAMED, "npz:": Npz(), "imagefolder:": ImageFolder(), "webdataset:": WebDataset(),
                              "hf:": HuggingFace(), "imagenet:": ImageNet(), "pets:": Pets(), "flowers102:": Flowers102(),
                              "vtab:": Vtab(), "voc:": Voc(), "cityscapes:": Cityscapes(), "ade20k:": Ade20k(),
                              "maskfolder:": MaskFolder(), "nyu:": Nyu(), "depthfolder:": DepthFolder()}
"""Each source by the prefix that names it (``KIND:``, ending in a colon) or by the plain name of a dataset it
reads; in the order the help lists them."""

__all__ = ["SOURCES", "ReadOptions", "Source"]
