"""HF datasets as shards (``hf:PATH``, ``hf:ORG/NAME``): a folder written by ``datasets``' ``save_to_disk``
(arrow files, memory-mapped) or a folder of parquet files with ``image`` and ``label`` columns (the
layout of ImageNet and most image datasets on the hub: ``data/train-00000-of-00042.parquet``). Each
file is a shard of ``shards.py``, read batch by batch, so nothing is held in memory whole.

A dense dataset has an image column for its target instead of ``label``: ``mask`` (grey or palette PNGs of class
ids, 255 for pixels that count for nothing; the classes named by ``classes.txt``, one a line, or an HF
``id2label.json`` in the dataset's folder) or ``depth`` (16-bit PNGs of millimetres, 0 where there is no depth).
Its index pass counts rows; a missing target is found when its row is read. An
``ORG/NAME`` that is not a local folder is fetched from the hub (its parquet files) with huggingface_hub.
Needs pyarrow (``pip install 'vitkit[data]'``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ...errors import DatasetError, parse_json
from ...paths import TEXT_LIMIT, id_segments, read_text, regular_file, resolved, within
from ..dense import SEGMENTATION, TARGET_KEYS, read_pair
from ..images import read_image
from ..index_cache import CLASSIFICATION, ShardIndex
from ..listed import read_class_names
from ..shards import Shard, ShardedSplit, indexed_split, label_problem
from ..splits import ALL, SPLITS, named_split
from .base import ReadOptions, Source

COLUMNS = ("image", "label")
TARGET_COLUMNS = {"label": CLASSIFICATION, **{column: task for task, column in TARGET_KEYS.items()}}
"""A file's target column, in order of precedence, and the task it says."""
ROWS_PER_READ = 256


class HuggingFace(Source):
    """``hf:PATH`` or ``hf:ORG/NAME``: the splits its files say."""

    streamed = True

    def recognises(self, path: Path) -> int:
        return 2 * (path.is_dir() and next(path.rglob("*.parquet"), None) is not None)

    def splits(self, path: str) -> tuple[str, ...]:
        found = tuple(split_files(hf_root(path)))
        if not found:
            raise DatasetError(f"hf:{path}: no split found; expected parquet files of a train, validation or test "
                               f"split (or a datasets save_to_disk folder)")
        return found

    def open(self, path: str, split: str, options: ReadOptions) -> ShardedSplit:
        return hf_split(path, split, options.corrupt)


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError("hf: datasets need pyarrow: pip install 'vitkit[data]'") from error
    return pa, pq


def hf_root(spec: str) -> Path:
    return Path(spec) if Path(spec).is_dir() else hub_folder(spec)


def held_to(spec: str, root: Path) -> Path:
    """The resolved folder that ``hf:spec``'s files and row image paths must stay in: the folder the user named,
    or for a hub dataset its repository's folder in the hub cache (whose snapshot files link into its blobs)."""
    return resolved(root if Path(spec).is_dir() else root.parents[1])


@functools.cache
def hub_folder(name: str) -> Path:
    """The local copy of hub dataset ``ORG/NAME``'s parquet files (downloaded once, then cached). The hub is
    asked once per process: a run's splits and its split listing all read the same snapshot."""
    id_segments(name, "hf:", DatasetError)
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise ImportError(f"hf:{name} is read from the hub: pip install 'vitkit[hub]'") from error
    try:
        return Path(snapshot_download(name, repo_type="dataset", allow_patterns=["*.parquet", "*.json"]))
    except Exception as error:  # offline, no such repository, gated: the hub says which
        raise DatasetError(f"hf:{name}: not a local folder, and the hub did not give it ({error})") from error


def split_files(root: Path) -> dict[str, list[Path]]:
    """The arrow or parquet files of each split under ``root``."""
    if (root / "dataset_dict.json").is_file():  # save_to_disk of a DatasetDict
        try:
            names = parse_json(read_text(root / "dataset_dict.json", "dataset description"))["splits"]
            found = {named_split([name], root / name): sorted((root / name).glob("*.arrow")) for name in names}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DatasetError(f"{root / 'dataset_dict.json'}: expected {{\"splits\": [names]}} ({error!r})") from None
        return {split: files for split, files in found.items() if split is not None}
    if (root / "state.json").is_file():  # save_to_disk of one Dataset: its only split is train
        return {"train": sorted(root.glob("*.arrow"))}
    found: dict[str, list[Path]] = {split: [] for split in SPLITS}
    for path in sorted(root.rglob("*.parquet")):
        split = named_split([path.parent.name, path.stem.split("-")[0]], path)
        if split is not None:
            found[split].append(path)
    return {split: files for split, files in found.items() if files}


def open_table(path: Path):
    """A file's rows as record batches: parquet read in pieces, arrow memory-mapped."""
    pa, pq = _pyarrow()
    regular_file(path)  # a FIFO would block pyarrow's open
    if path.suffix == ".parquet":
        return pq.ParquetFile(path)
    return pa.ipc.open_stream(pa.memory_map(str(path)))


def class_names(path: Path, schema) -> list[str] | None:
    """The ``label`` ClassLabel's names from the features that ``datasets`` stores in every file's schema
    (``{"info": {"features": {"label": {"names": [...]}}}}``); None when the file has no such metadata or its
    label is a plain integer. Metadata that is not what ``datasets`` writes is named, not guessed at."""
    meta = (schema.metadata or {}).get(b"huggingface")
    if meta is None:
        return None
    where = f"{path}: schema metadata 'huggingface'"
    if len(meta) > TEXT_LIMIT:
        raise DatasetError(f"{where} holds {len(meta):,} bytes, more than the {TEXT_LIMIT:,} bytes metadata may hold")
    try:
        node = parse_json(meta)
    except ValueError as error:  # not UTF-8, or not JSON
        raise DatasetError(f"{where} is not JSON ({error})") from None
    for trail in ("", "info", "info.features", "info.features.label"):
        node = node.get(trail.rsplit(".", 1)[-1], {}) if trail else node
        if not isinstance(node, dict):
            raise DatasetError(f"{where}: {trail or 'the document'} is {json.dumps(node)[:60]}, expected an object")
    names = node.get("names")
    if names is None and node.get("_type") != "ClassLabel":
        return None
    if not (isinstance(names, list) and names and all(isinstance(name, str) for name in names)):
        raise DatasetError(f"{where}: the ClassLabel 'label' has names {json.dumps(names)[:60]}, expected a "
                           f"list of class names")
    return names


def schema_of(table):
    return table.schema_arrow if hasattr(table, "schema_arrow") else table.schema


@contextlib.contextmanager
def named_errors(path: Path):
    """Report a damaged file (truncated, or not arrow/parquet at all) by name; yields pyarrow."""
    pa, _ = _pyarrow()
    try:
        yield pa
    except (pa.ArrowException, OSError) as error:
        raise DatasetError(f"{path}: not a readable {path.suffix[1:]} file ({error})") from None


def batches(path: Path, columns: tuple[str, ...]):
    """The ``columns`` of a file, in record batches; a damaged file or a column of the wrong kind is named."""
    with named_errors(path) as pa:
        table = open_table(path)
        schema = schema_of(table)
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise DatasetError(f"{path}: no column {missing[0]!r}; it has {schema.names} (expected {list(columns)})")
        if "label" in columns and not pa.types.is_integer(schema.field("label").type):
            raise DatasetError(f"{path}: column 'label' holds {schema.field('label').type}, expected integers")
        for column in (c for c in columns if c in ("image", *TARGET_KEYS.values())):
            if not holds_images(pa, schema.field(column).type):
                raise DatasetError(f"{path}: column {column!r} holds {schema.field(column).type}, expected the Image "
                                   f"feature (a struct of bytes and path) or encoded image bytes")
        if hasattr(table, "iter_batches"):
            yield from table.iter_batches(batch_size=ROWS_PER_READ, columns=list(columns))
        else:
            for batch in table:
                yield batch.select(list(columns))


def holds_images(pa, kind) -> bool:
    """Whether a column of arrow type ``kind`` can hold images: the Image feature's struct, or plain bytes."""
    if pa.types.is_struct(kind):
        return bool({"bytes", "path"} & {kind.field(i).name for i in range(kind.num_fields)})
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def target_column(path: Path, schema) -> str:
    """The column of a file's targets: ``label``, else ``mask`` or ``depth`` (``TARGET_COLUMNS``)."""
    column = next((name for name in TARGET_COLUMNS if name in schema.names), None)
    if column is None:
        raise DatasetError(f"{path}: no column 'label', 'mask' or 'depth'; it has {schema.names} (expected an "
                           f"'image' column with one of them)")
    return column


def read_rows(column: str, shard: Shard) -> Iterator[tuple[str, tuple[dict | bytes | None, object]]]:
    row = 0
    for batch in batches(Path(shard.path), ("image", column)):
        for image, target in zip(batch.column("image").to_pylist(), batch.column(column).to_pylist()):
            yield f"row {row}", (image, target)
            row += 1


def image_source(root: Path, image: dict | bytes | None, where: str, what: str = "image") -> io.BytesIO | Path:
    """An Image feature's value (or plain bytes) as something to decode: its bytes, else its path, read only from
    inside the dataset's resolved ``root`` (a path relative to it, or one that leads into it)."""
    encoded, path = (image.get("bytes"), image.get("path")) if isinstance(image, dict) else (image, None)
    if not (encoded or path):
        raise DatasetError(f"{where}: no {what} (expected the Image feature's bytes or path)")
    return io.BytesIO(encoded) if encoded else within(root, path, DatasetError, f"{where}: the {what} path")


def decode_row(root: Path, task: str, classes: int, shard: Shard, key: str,
               row: tuple[dict | bytes | None, object]) -> tuple[torch.Tensor, object]:
    """A row's image and label, or its image and mask / depth map (``task``); images given by path are read only
    from inside the dataset's ``root``."""
    image, target = row
    where = f"{shard.path}: {key}"
    if task != CLASSIFICATION:
        kind = TARGET_KEYS[task]
        return read_pair(task, classes, image_source(root, image, where), image_source(root, target, where, kind),
                         where, f"{where} {kind}")
    problem = label_problem(target, classes)
    if problem is not None:
        raise DatasetError(f"{where}: {problem}")
    return read_image(image_source(root, image, where), where), target


def label_index(path: str) -> ShardIndex:
    """A file's rows and their labels, from its label column alone (null labels are missing ones); a dense file's
    rows, counted without reading them (parquet's metadata; an arrow file's batches, mapped)."""
    labels, missing, problems, rows = [], [], {}, 0
    with named_errors(Path(path)) as pa:
        table = open_table(Path(path))
        column = target_column(Path(path), schema_of(table))
        if column != "label":
            count = table.metadata.num_rows if hasattr(table, "metadata") and table.metadata is not None \
                else sum(len(batch) for batch in table)
            return ShardIndex(np.zeros(count, dtype=np.int64), task=TARGET_COLUMNS[column])
        import pyarrow.compute as pc
        for batch in batches(Path(path), ("label",)):
            column = batch.column("label")
            unlabelled = column.is_null()
            if pa.types.is_uint64(column.type):  # a label past int64's range is no class index: named, not cast
                huge = pc.greater(column, pa.scalar(np.iinfo(np.int64).max, pa.uint64())).fill_null(False)
                for position in np.flatnonzero(huge.to_numpy(zero_copy_only=False)).tolist():
                    problems[rows + position] = f"label {column[position].as_py()} is not a class index"
                column, unlabelled = pc.if_else(huge, pa.scalar(0, pa.uint64()), column), pc.or_(unlabelled, huge)
            labels.append(column.fill_null(0).cast(pa.int64()).to_numpy())
            missing.append(np.flatnonzero(unlabelled.to_numpy(zero_copy_only=False)) + rows)
            rows += len(column)
    nothing = [np.zeros(0, dtype=np.int64)]
    return ShardIndex(np.concatenate(nothing + labels), np.concatenate(nothing + missing).astype(np.int64),
                      problems=problems)


def hf_split(spec: str, split: str, corrupt: str = "fail") -> ShardedSplit:
    """The ``split`` of ``hf:PATH`` or ``hf:ORG/NAME`` (see module doc); its index pass reads the label
    column only."""
    root = hf_root(spec)
    found = split_files(root)
    files = sum(found.values(), []) if split == ALL else found.get(split)
    if not files:
        raise DatasetError(f"hf:{spec}: no {split} split (found {sorted(found) or 'none'})")
    real_root = held_to(spec, root)
    for file in files:
        within(real_root, file, DatasetError, "a data file")
    with named_errors(files[0]):
        schema = schema_of(open_table(files[0]))
    column = target_column(files[0], schema)
    names = class_names(files[0], schema) if column == "label" else \
        dense_class_names(root, real_root) if TARGET_COLUMNS[column] == SEGMENTATION else []
    return indexed_split(f"hf:{spec}[{split}]", [str(path) for path in files], "hf-labels", label_index, names,
                         functools.partial(read_rows, column), functools.partial(decode_row, real_root), corrupt)


def dense_class_names(root: Path, real_root: Path) -> list[str] | None:
    """The classes of a dense dataset's masks: ``classes.txt`` (one a line), else HF's ``id2label.json`` (ids 0 to
    N-1, each named); None when it has neither."""
    if (root / "classes.txt").exists():
        return read_class_names(within(real_root, root / "classes.txt", DatasetError, "the class list"))
    if not (root / "id2label.json").exists():
        return None
    where = within(real_root, root / "id2label.json", DatasetError, "the class list")
    try:
        table = parse_json(read_text(where, "class list"))
        names = [table[str(index)] for index in range(len(table))]
    except (ValueError, KeyError, TypeError) as error:
        raise DatasetError(f"{where}: expected {{\"0\": NAME, \"1\": NAME, ...}} for ids 0 to N-1 ({error!r})") from None
    if not names or not all(isinstance(name, str) for name in names):
        raise DatasetError(f"{where}: expected a class name (a string) for each id 0 to N-1")
    return names
