"""HF datasets as shards (``hf:PATH``, ``hf:ORG/NAME``): a folder written by ``datasets``' ``save_to_disk``
(arrow files, memory-mapped) or a folder of parquet files with ``image`` and ``label`` columns (the
layout of ImageNet and most image datasets on the hub: ``data/train-00000-of-00042.parquet``). Each
file is a shard of ``shards.py``, read batch by batch, so nothing is held in memory whole. An
``ORG/NAME`` that is not a local folder is fetched from the hub (its parquet files) with huggingface_hub.
Needs pyarrow (``pip install 'vitkit[data]'``).
"""

from __future__ import annotations

import functools
import io
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch

from ..errors import DatasetError
from .datasets import SPLITS, read_image
from .shards import Shard, ShardedSplit

COLUMNS = ("image", "label")
ROWS_PER_READ = 256


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError("hf: datasets need pyarrow: pip install 'vitkit[data]'") from error
    return pa, pq


def hf_root(spec: str) -> Path:
    return Path(spec) if Path(spec).is_dir() else hub_folder(spec)


def hub_folder(name: str) -> Path:
    """The local copy of hub dataset ``ORG/NAME``'s parquet files (downloaded once, then cached)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise ImportError(f"hf:{name} is read from the hub: pip install 'vitkit[hub]'") from error
    try:
        return Path(snapshot_download(name, repo_type="dataset", allow_patterns=["*.parquet", "*.json"]))
    except Exception as error:  # offline, no such repository, gated: the hub says which
        raise DatasetError(f"hf:{name}: not a local folder, and the hub did not give it ({error})") from error


def split_of(name: str) -> str | None:
    """vitkit's name for an HF split (``validation`` is ``val``), or None for one vitkit has no use for."""
    name = "val" if name == "validation" else name
    return name if name in SPLITS else None


def split_files(root: Path) -> dict[str, list[Path]]:
    """The arrow or parquet files of each split under ``root``."""
    if (root / "dataset_dict.json").is_file():  # save_to_disk of a DatasetDict
        try:
            names = json.loads((root / "dataset_dict.json").read_text())["splits"]
            found = {split_of(name): sorted((root / name).glob("*.arrow")) for name in names}
        except (ValueError, KeyError, TypeError) as error:
            raise DatasetError(f"{root / 'dataset_dict.json'}: expected {{\"splits\": [names]}} ({error!r})") from None
        return {split: files for split, files in found.items() if split is not None}
    if (root / "state.json").is_file():  # save_to_disk of one Dataset: its only split is train
        return {"train": sorted(root.glob("*.arrow"))}
    found: dict[str, list[Path]] = {split: [] for split in SPLITS}
    for path in sorted(root.rglob("*.parquet")):
        words = {path.parent.name, path.stem.split("-")[0]}
        split = next((s for s in SPLITS if s in {split_of(word) for word in words}), None)
        if split is not None:
            found[split].append(path)
    return {split: files for split, files in found.items() if files}


def open_table(path: Path):
    """A file's rows as record batches: parquet read in pieces, arrow memory-mapped."""
    pa, pq = _pyarrow()
    if path.suffix == ".parquet":
        return pq.ParquetFile(path)
    return pa.ipc.open_stream(pa.memory_map(str(path)))


def class_names(schema) -> list[str] | None:
    """The ``label`` ClassLabel's names from the features that ``datasets`` stores in every file's schema."""
    meta = (schema.metadata or {}).get(b"huggingface")
    if meta is None:
        return None
    features = json.loads(meta).get("info", {}).get("features", {})
    names = features.get("label", {}).get("names")
    return list(names) if names else None


def schema_of(table):
    return table.schema_arrow if hasattr(table, "schema_arrow") else table.schema


def batches(path: Path, columns: tuple[str, ...]):
    """The ``columns`` of a file, in record batches; a damaged file or a column of the wrong kind is named."""
    pa, _ = _pyarrow()
    try:
        table = open_table(path)
        schema = schema_of(table)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise DatasetError(f"{path}: no column {missing[0]!r}; it has {schema.names} (expected {list(COLUMNS)})")
        if "label" in columns and not pa.types.is_integer(schema.field("label").type):
            raise DatasetError(f"{path}: column 'label' holds {schema.field('label').type}, expected integers")
        if hasattr(table, "iter_batches"):
            yield from table.iter_batches(batch_size=ROWS_PER_READ, columns=list(columns))
        else:
            for batch in table:
                yield batch.select(list(columns))
    except (pa.ArrowException, OSError) as error:  # truncated or not arrow/parquet at all
        raise DatasetError(f"{path}: not a readable {path.suffix[1:]} file ({error})") from None


def read_rows(shard: Shard) -> Iterator[tuple[str, tuple[dict | None, int | None]]]:
    row = 0
    for batch in batches(Path(shard.path), COLUMNS):
        for image, label in zip(batch.column("image").to_pylist(), batch.column("label").to_pylist()):
            yield f"row {row}", (image, label)
            row += 1


def decode_row(classes: int, shard: Shard, key: str, row: tuple[dict | None, int | None]) -> tuple[torch.Tensor, int]:
    image, label = row
    if label is None or not 0 <= label < classes:
        raise DatasetError(f"{shard.path}: {key}: label {label} out of range 0..{classes - 1}")
    if not isinstance(image, dict) or not (image.get("bytes") or image.get("path")):
        raise DatasetError(f"{shard.path}: {key}: no image (expected the Image feature's bytes or path)")
    source = io.BytesIO(image["bytes"]) if image.get("bytes") else Path(image["path"])
    return read_image(source, f"{shard.path}: {key}"), label


def labels_of(path: Path) -> list[int | None]:
    return [label for batch in batches(path, ("label",)) for label in batch.column("label").to_pylist()]


def hf_split(spec: str, split: str, corrupt: str = "fail") -> ShardedSplit:
    """The ``split`` of ``hf:PATH`` or ``hf:ORG/NAME`` (see module doc); its index pass reads the label
    column only."""
    root = hf_root(spec)
    files = split_files(root).get(split)
    if not files:
        raise DatasetError(f"hf:{spec}: no {split} split (found {sorted(split_files(root)) or 'none'})")
    labels = {path: labels_of(path) for path in files}
    table = open_table(files[0])
    names = class_names(schema_of(table))
    largest = max((label for column in labels.values() for label in column if label is not None), default=-1)
    classes = names or [str(c) for c in range(largest + 1)]
    shards, counts, bad, offset = [], Counter(), [], 0
    for path, column in labels.items():
        for row, label in enumerate(column):
            if label is not None and 0 <= label < len(classes):
                counts[label] += 1
                continue
            problem = f"{path}: row {row}: label {label} out of range 0..{len(classes) - 1}"
            if corrupt == "fail":
                raise DatasetError(f"{problem} (pass --corrupt skip to go on without it)")
            bad.append(problem)
        if column:
            shards.append(Shard(str(path), len(column), offset))
            offset += len(column)
    if not shards:
        raise DatasetError(f"hf:{spec}: the {split} split is empty")
    return ShardedSplit(f"hf:{spec}[{split}]", shards, classes, read_rows,
                        functools.partial(decode_row, len(classes)), counts, bad)
