"""WebDataset tar shards (``webdataset:ROOT`` or ``webdataset:PATTERN``): ``ROOT/{train,val,test}-NNNNNN.tar`` of
``KEY.EXT`` + ``KEY.cls`` samples and an optional ``ROOT/classes.txt``, read as streams (``shards``). The index
pass reads the tar headers and the ``.cls`` members only.

Dense samples hold a target instead of ``.cls``: ``KEY.mask.png`` (a grey or palette PNG of class ids, 255 for
pixels that count for nothing; ``ROOT/classes.txt`` names the classes) or ``KEY.depth.png`` (a 16-bit PNG of
millimetres, 0 where there is no depth), as ``vitkit data convert`` writes a dense dataset. A sample with a
``.cls`` is an image label's, whatever else it holds; the shards of a split hold one kind."""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import braceexpand
import torch
from webdataset.handlers import ignore_and_stop
from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_expander

from ...errors import DatasetError
from ...paths import open_regular, regular_file, resolved, within
from ..dense import TARGET_KEYS, TARGET_KINDS, read_pair
from ..images import read_image
from ..index_cache import CLASSIFICATION, ShardIndex
from ..listed import read_class_names
from ..shards import Shard, ShardedSplit, indexed_split, label_problem
from ..splits import ALL, SPLITS, named_split
from .base import ReadOptions, Source

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
MAX_SHARDS = 1_000_000  # a brace pattern naming more is taken for a mistake (LAION-5B's shards number ~500k)


class WebDataset(Source):
    """``webdataset:ROOT`` or ``webdataset:PATTERN``: the splits its shard names say."""

    argument = "ROOT"
    streamed = True

    def recognises(self, path: Path) -> int:
        return 2 * (path.is_dir() and next(path.glob("*.tar"), None) is not None)

    def splits(self, path: str) -> tuple[str, ...]:
        return tuple(split for split, files in shard_files(path).items() if files)

    def open(self, path: str, split: str, options: ReadOptions) -> ShardedSplit:
        return webdataset_split(path, split, options.corrupt)


def shard_files(spec: str) -> dict[str, list[str]]:
    """``ROOT`` (``train-*.tar``, ``val-*.tar`` or ``validation-*.tar``, ``test-*.tar``: the shards whose names
    say a split) or a brace pattern / single file; a file belongs to the split named by a ``-``/``_``/``.``
    separated word of its name (see ``splits.named_split``), a file of a pattern that names none to train."""
    if os.path.isdir(spec):
        found = {split: [] for split in SPLITS}
        for file in sorted(str(p) for p in Path(spec).glob("*.tar")):
            split = named_split(re.split(r"[-_.]", os.path.basename(file)), file)
            if split is not None:
                found[split].append(file)
        if not any(found.values()):
            raise DatasetError(f"{spec}: no shards (expected {spec}/train-000000.tar, val-..., test-...)")
        root = resolved(spec)
        for file in (file for files in found.values() for file in files):
            within(root, file, DatasetError, "a shard")
            regular_shard(file)
        return found
    if pattern_size(spec) > MAX_SHARDS:
        raise DatasetError(f"{spec}: names more than {MAX_SHARDS:,} shards; expected at most {MAX_SHARDS:,}")
    try:
        files = list(braceexpand.braceexpand(spec))
    except braceexpand.UnbalancedBracesError:
        raise DatasetError(f"{spec}: unbalanced braces; expected a folder, a shard file or a brace pattern such as "
                           f"train-{{000000..000009}}.tar") from None
    missing = [f for f in files if not os.path.lexists(f)]
    if missing:
        raise DatasetError(f"{spec}: {len(missing)} of {len(files)} shard(s) not found, e.g. {missing[0]}")
    for file in files:
        regular_shard(file)
    found = {split: [] for split in SPLITS}
    for file in sorted(files):
        found[named_split(re.split(r"[-_.]", os.path.basename(file)), file) or "train"].append(file)
    return found


def regular_shard(path: str) -> None:
    """Refuse a shard that is not a regular file (a FIFO would block its reader, a device never end)."""
    try:
        regular_file(path)
    except OSError as error:
        raise DatasetError(f"{path}: {error.strerror}; expected a shard file") from None


_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.-?\d+)?\}")


def pattern_size(spec: str) -> int:
    """An upper bound of the names a brace pattern expands to, found without expanding it (``braceexpand``
    builds each numeric range whole, so ``{0..99999999999}`` would fill the memory first)."""
    size = 1
    for low, high in _RANGE.findall(spec):
        size *= abs(int(high) - int(low)) + 1 if max(len(low), len(high)) < 19 else 10**19
    for group in re.findall(r"\{([^{}]*)\}", spec):
        size *= group.count(",") + 1
    return size


def tar_members(tar: tarfile.TarFile, size: int) -> tuple[dict[str, dict[str, tarfile.TarInfo]], str | None]:
    """The shard's files grouped by sample key, and the key at which the file is cut short (None if whole:
    tarfile stops quietly at a missing header, hence the check of every member's extent)."""
    keys: dict[str, dict[str, tarfile.TarInfo]] = {}
    members = iter(tar)
    while True:
        try:
            member = next(members)
        except StopIteration:
            return keys, None
        except tarfile.ReadError:
            if not keys:
                raise
            return keys, next(reversed(keys))  # a header cut short: the sample before it may be too
        key, extension = base_plus_ext(member.name)
        if member.isfile() and key is not None:
            if member.offset_data + member.size > size:
                return keys, key
            keys.setdefault(key, {})[extension.lower()] = member


# what a sample's target member says it holds, in order of precedence
TARGETS = {"cls": CLASSIFICATION, **{f"{key}.png": task for task, key in TARGET_KEYS.items()}}


def tar_index(path: str) -> ShardIndex:
    """The samples of one tar shard and their labels, from its headers and ``.cls`` members (a dense shard's
    from its headers alone: the kind of target of its first sample that has one is the shard's)."""
    names, labels, problems, cut = [], [], {}, None
    try:
        with open_regular(path) as handle, tarfile.open(fileobj=handle) as tar:
            keys, cut = tar_members(tar, os.fstat(handle.fileno()).st_size)
            if cut is not None:
                keys.pop(cut, None)  # the sample cut in two is not used
            target = next((ext for members in keys.values() for ext in TARGETS if ext in members), "cls")
            for position, (key, members) in enumerate(keys.items()):
                label = None
                if not any(e in members for e in IMAGE_EXTENSIONS):
                    problems[position] = f"no image (.{'/.'.join(IMAGE_EXTENSIONS)})"
                elif target not in members:
                    what = "label" if target == "cls" else TARGET_KINDS[TARGETS[target]]
                    problems[position] = f"no .{target} {what}"
                elif target != "cls":
                    label = 0
                else:
                    label, problem = parse_label(tar.extractfile(members["cls"]).read())
                    if problem is not None:
                        problems[position] = problem
                names.append(f"sample {key}")
                labels.append(label)
    except (tarfile.TarError, OSError) as error:
        raise DatasetError(f"{path}: not a readable tar shard ({' '.join(str(error).split())})") from error
    return ShardIndex.of(labels, names, problems, None if cut is None else f"sample {cut}", TARGETS[target])


def parse_label(text: bytes) -> tuple[int | None, str | None]:
    """The integer of a ``.cls`` member, or None and why there is none (a label must fit the index's int64)."""
    try:
        label = int(text.decode().strip())
    except (UnicodeDecodeError, ValueError):
        return None, f".cls is {text[:20]!r}, not an integer"
    if not -2**63 <= label < 2**63:
        return None, f".cls is {text[:20]!r}, out of range for a class index"
    return label, None


def decode_tar_sample(task: str, classes: int, shard: Shard, key: str, sample: dict) -> tuple[torch.Tensor, object]:
    image = next((sample[e] for e in IMAGE_EXTENSIONS if e in sample), None)
    if task != CLASSIFICATION:
        target = f"{TARGET_KEYS[task]}.png"
        if image is None or target not in sample:
            raise DatasetError(f"{shard.path}: sample {key} lacks an image or its .{target} {TARGET_KINDS[task]}")
        name = f"{shard.path}: sample {key}"
        return read_pair(task, classes, io.BytesIO(image), io.BytesIO(sample[target]), name, f"{name} .{target}")
    if image is None or "cls" not in sample:
        raise DatasetError(f"{shard.path}: sample {key} lacks an image or its .cls label")
    label, problem = parse_label(sample["cls"])
    problem = problem or label_problem(label, classes)
    if problem is not None:
        raise DatasetError(f"{shard.path}: sample {key}: {problem}")
    return read_image(io.BytesIO(image), f"{shard.path}: sample {key}"), label


def read_tar(shard: Shard) -> Iterator[tuple[str, dict]]:
    """The samples of a tar shard in file order (webdataset groups the members by key); a read error ends
    the stream, which ``ShardedSplit.raw`` then finds short."""
    with open_regular(shard.path) as handle:
        members = tar_file_expander([{"url": shard.path, "stream": handle}], handler=ignore_and_stop)
        for sample in group_by_keys(members, handler=ignore_and_stop):
            yield sample["__key__"], {k.lower(): v for k, v in sample.items() if not k.startswith("__")}


def webdataset_split(spec: str, split: str, corrupt: str = "fail") -> ShardedSplit:
    """The ``split`` of ``webdataset:ROOT`` or ``webdataset:PATTERN`` (see ``shard_files``)."""
    found = shard_files(spec)
    files = sum(found.values(), []) if split == ALL else found[split]
    if not files:
        raise DatasetError(f"{spec}: no {split} shards ({split}-NNNNNN.tar)")
    root = spec if os.path.isdir(spec) else os.path.dirname(files[0])
    listed = os.path.lexists(os.path.join(root, "classes.txt"))  # a broken link is a class list that fails, not none
    names = read_class_names(within(resolved(root), "classes.txt", DatasetError, "the class list")) if listed else None
    return indexed_split(f"{spec}[{split}]", files, "tar", tar_index, names, read_tar, decode_tar_sample, corrupt)


