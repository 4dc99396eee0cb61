"""The shard index cache: a second load reads it, a changed shard or a damaged entry is indexed again, the
split is the same with and without it, and under torchrun each rank indexes only its share of the shards."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from data_helpers import numbered_image, numbered_shards, png
from launch import TORCHRUN, launch

import vitkit.data.sources.webdataset as webdataset
from vitkit.data import DatasetError, load_dataset

SIZES = [5, 7, 3, 6]


@pytest.fixture
def passes(monkeypatch, tmp_path):
    """The shards the index pass reads (the real pass, counted), with a cache of this test's own."""
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    read = []
    index = webdataset.tar_index
    monkeypatch.setattr(webdataset, "tar_index", lambda path: read.append(Path(path).name) or index(path))
    return read


def facts(split):
    return split.shards, split.classes, split.class_counts, split.bad


def test_second_load_reads_the_cache_and_a_changed_shard_is_indexed_again(tmp_path, passes):
    root = tmp_path / "shards"
    numbered_shards(root, "train", SIZES)
    listing = sorted(os.listdir(root))
    first = load_dataset(f"webdataset:{root}", "train")
    assert len(passes) == 4 and len(first) == 21
    again = load_dataset(f"webdataset:{root}", "train")
    assert len(passes) == 4, "the second load reads the cache"
    assert facts(again) == facts(first)
    assert sorted(os.listdir(root)) == listing, "nothing is written beside the shards"

    numbered_shards(tmp_path / "other", "train", [2, 9])  # a rewritten shard 1: 9 samples instead of 7
    os.replace(tmp_path / "other" / "train-000001.tar", root / "train-000001.tar")
    changed = load_dataset(f"webdataset:{root}", "train")
    assert passes[4:] == ["train-000001.tar"] and [s.size for s in changed.shards] == [5, 9, 3, 6]
    assert changed.class_counts != first.class_counts


def test_damaged_entries_are_indexed_again_and_bad_samples_stay_bad(tmp_path, passes):
    root = tmp_path / "shards"
    numbered_shards(root, "train", SIZES)
    with wds.TarWriter(str(root / "train-000004.tar")) as sink:
        sink.write({"__key__": "big", "png": png(numbered_image(0)), "cls": "7"})
    (root / "classes.txt").write_text("a\nb\nc\nd\n")
    with pytest.raises(DatasetError, match="train-000004.tar: sample big: label 7 out of range 0..3"):
        load_dataset(f"webdataset:{root}", "train")
    with pytest.raises(DatasetError, match="train-000004.tar: sample big: label 7 out of range 0..3"):
        load_dataset(f"webdataset:{root}", "train")  # from the cache: the label is checked, not the verdict
    assert len(passes) == 5
    with pytest.warns(UserWarning, match="1 unusable"):
        fresh = load_dataset(f"webdataset:{root}", "train", corrupt="skip")
    entries = sorted((tmp_path / "cache" / "shard-index").iterdir())
    assert len(entries) == 5 and {entry.suffix for entry in entries} == {".npz"}
    with np.load(entries[0], allow_pickle=False) as arrays:
        good = dict(arrays)
    damage = [b"\x00garbage", entries[1].read_bytes()[:-40],  # torn: the zip's directory cut off
              {**good, "labels": good["labels"].astype(np.float64)},
              {**good, "missing": np.array([len(good["labels"])])},
              {**good, "labels": np.array([{"pickled": 1}], dtype=object)}]  # np.load would have to unpickle it
    for entry, data in zip(entries, damage):
        if isinstance(data, bytes):
            entry.write_bytes(data)
        else:
            with entry.open("wb") as handle:
                np.savez(handle, **data)
    with pytest.warns(UserWarning, match="1 unusable"):
        rebuilt = load_dataset(f"webdataset:{root}", "train", corrupt="skip")
    assert len(passes) == 10 and facts(rebuilt) == facts(fresh)
    with pytest.warns(UserWarning, match="1 unusable"):
        load_dataset(f"webdataset:{root}", "train", corrupt="skip")
    assert len(passes) == 10, "the entries were written again"


def test_the_split_is_the_same_without_a_writable_cache(tmp_path, passes, monkeypatch):
    root = tmp_path / "shards"
    numbered_shards(root, "train", SIZES)
    cached = facts(load_dataset(f"webdataset:{root}", "train"))
    assert facts(load_dataset(f"webdataset:{root}", "train")) == cached
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "a file"))
    with pytest.warns(UserWarning, match="could not cache the shard index in .*a file"):
        uncached = load_dataset(f"webdataset:{root}", "train")
    assert facts(uncached) == cached and len(passes) == 8


SHARE_OUT = """
import json, os, sys
import torch.distributed as dist
import vitkit.data.sources.webdataset as webdataset
from vitkit.data import DatasetError, load_dataset

dist.init_process_group("gloo")
read, index = [], webdataset.tar_index
webdataset.tar_index = lambda path: read.append(os.path.basename(path)) or index(path)
split = load_dataset("webdataset:" + sys.argv[1], "train")
try:
    load_dataset("webdataset:" + sys.argv[2], "train")
except DatasetError as error:
    failed = str(error)
found = {"read": read, "sizes": [s.size for s in split.shards], "counts": sorted(split.class_counts.items()),
         "failed": failed}
open(os.path.join(sys.argv[3], "rank-" + os.environ["RANK"]), "w").write(json.dumps(found))
dist.destroy_process_group()
"""


def test_torchrun_ranks_index_their_share_and_exchange_it(tmp_path, passes):
    """5 shards over 2 ranks: rank 0 reads 3, rank 1 reads 2, both get the whole index; a shard that cannot be
    read (rank 1's share) stops both ranks with its name instead of leaving one waiting."""
    numbered_shards(tmp_path / "good", "train", [*SIZES, 4])
    numbered_shards(tmp_path / "bad", "train", [3, 3])
    (tmp_path / "bad" / "train-000001.tar").write_bytes(b"not a tar file" * 100)
    script = tmp_path / "share_out.py"
    script.write_text(SHARE_OUT)
    launch(TORCHRUN, script, tmp_path / "good", tmp_path / "bad", tmp_path)
    found = [json.loads((tmp_path / f"rank-{rank}").read_text()) for rank in (0, 1)]
    assert [r["read"] for r in found] == [["train-000000.tar", "train-000002.tar", "train-000004.tar",
                                           "train-000000.tar"], ["train-000001.tar", "train-000003.tar",
                                                                  "train-000001.tar"]]
    alone = load_dataset(f"webdataset:{tmp_path / 'good'}", "train")  # from the cache the ranks wrote
    assert passes == [] and all(r["sizes"] == [s.size for s in alone.shards] for r in found)
    assert all(r["counts"] == [list(c) for c in sorted(alone.class_counts.items())] for r in found)
    assert all("bad/train-000001.tar: not a readable tar shard" in r["failed"] for r in found)


def test_an_hf_entry_keeps_labels_not_row_names_and_replaces_a_format_1_entry(tmp_path, monkeypatch):
    """Rows are named by number, so an hf: file's entry holds its labels as an array and no names; a null label
    and one out of range are named by row from the cache as on the first pass; the JSON entry of format 1 is
    not read, and is removed when the new one is written."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    import vitkit.data.index_cache as index_cache
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    labels = [0, 1, None, 3, -1, 2, 1]
    table = pa.table({"image": pa.array([png(numbered_image(n)) for n in range(7)], pa.binary()),
                      "label": pa.array(labels, pa.int64())})
    (tmp_path / "hub").mkdir()
    pq.write_table(table, tmp_path / "hub" / "train.parquet")
    stamp = index_cache._stamp(str(tmp_path / "hub" / "train.parquet"), "hf-labels")
    legacy = index_cache._entry(stamp, ".json")
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"stamp": {**stamp, "version": 1},
                                  "index": {"names": [f"row {n}" for n in range(7)], "labels": [0] * 7,
                                            "problems": {}, "cut": None, "error": None}}))
    expected = ["train.parquet: row 2: label None out of range 0..3",
                "train.parquet: row 4: label -1 out of range 0..3"]
    for _ in range(2):  # the index pass, then the cache
        with pytest.warns(UserWarning, match="2 unusable") as warned:
            split = load_dataset(f"hf:{tmp_path / 'hub'}", "train", corrupt="skip")
        assert all(text in str(warned[0].message) for text in expected)
        assert split.classes == list("0123") and [s.size for s in split.shards] == [7]
        assert sorted(split.class_counts.items()) == [(0, 1), (1, 2), (2, 1), (3, 1)]
    entries = list((tmp_path / "cache" / "shard-index").iterdir())
    assert [entry.suffix for entry in entries] == [".npz"], "the format-1 entry is gone"
    with np.load(entries[0], allow_pickle=False) as arrays:
        assert sorted(arrays.files) == ["about", "labels", "missing"]
        assert arrays["labels"].tolist() == [0, 1, 0, 3, -1, 2, 1] and arrays["missing"].tolist() == [2]
