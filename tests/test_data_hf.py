"""hf:PATH: folders written by the `datasets` library itself (save_to_disk, and parquet in the hub's layout),
read back as streams."""

import pytest
from data_helpers import number_of, numbered_image

from vitkit.data import DatasetError, evaluation_loader, load_dataset, split_names, training_loader
from vitkit.data.survey import AS_IS
from vitkit.train import Recipe
from vitkit.train.run import run

datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")
CLASSES = ["ant", "bee", "cat", "dog"]


def numbered(start: int, count: int, label=lambda n: n % 4):
    from PIL import Image
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    rows = {"image": [Image.fromarray(numbered_image(n)) for n in range(start, start + count)],
            "label": [label(n) for n in range(start, start + count)]}
    return datasets.Dataset.from_dict(rows, features=features)


def read_back(split) -> list[tuple[int, int]]:
    return sorted((number_of(image.permute(1, 2, 0)), int(label))
                  for images, labels in evaluation_loader(split, AS_IS, batch_size=8, num_workers=2)
                  for image, label in zip(images, labels))


def test_save_to_disk_and_parquet_folders_read_back_exactly(tmp_path):
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": numbered(0, 40), "test": numbered(100, 10)}).save_to_disk(str(saved),
                                                                                              num_shards={"train": 3,
                                                                                                          "test": 1})
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    for index, start in enumerate((0, 20)):  # the hub's layout: data/<split>-NNNNN-of-NNNNN.parquet
        numbered(start, 20).to_parquet(str(hub / "data" / f"train-{index:05d}-of-00002.parquet"))
    numbered(100, 10).to_parquet(str(hub / "data" / "validation-00000-of-00001.parquet"))
    for root, splits in ((saved, ("train", "test")), (hub, ("train", "val"))):
        assert split_names(f"hf:{root}") == splits
        train = load_dataset(f"hf:{root}", "train")
        assert train.classes == CLASSES and len(train) == 40 and len(train.shards) in (2, 3)
        assert read_back(train) == [(n, n % 4) for n in range(40)]
        assert read_back(load_dataset(f"hf:{root}", splits[1])) == [(n, n % 4) for n in range(100, 110)]


def test_hf_trains_and_resumes_its_stream(tmp_path):
    root = tmp_path / "saved"
    datasets.DatasetDict({"train": numbered(0, 48), "test": numbered(100, 8)}).save_to_disk(str(root),
                                                                                             num_shards={"train": 4,
                                                                                                         "test": 1})
    split = load_dataset(f"hf:{root}", "train")

    def order(start):
        loader = training_loader(split, AS_IS, global_batch=8, total_steps=9, start_step=start, seed=2,
                                 num_workers=2)
        return [number_of(image.permute(1, 2, 0)) for _, (images, _, _) in zip(range(9 - start), loader)
                for image in images]
    straight = order(0)
    assert sorted(straight[:48]) == list(range(48)) and order(5) == straight[40:]
    model = {"patch_size": 2, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, "in_chans": 3}
    summary = run(Recipe(model=dict(image_size=4, args=model), data=dict(dataset=f"hf:{root}", num_workers=2),
                         schedule=dict(steps=3, batch_size=8), run=dict(threads=1, dir=str(tmp_path / "run"))))
    assert summary["test/images"] == 8


def test_labels_outside_the_classes_name_the_file_and_row(tmp_path):
    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    table = numbered(0, 6).cast_column("label", datasets.Value("int64"))
    table.map(lambda row, i: {"label": -1 if i == 4 else row["label"]}, with_indices=True).to_parquet(
        str(root / "data" / "train-00000-of-00001.parquet"))  # -1: how the hub marks an unlabelled image
    with pytest.raises(DatasetError, match=r"train-00000-of-00001.parquet: row 4: label -1 out of range 0..3") as e:
        load_dataset(f"hf:{root}", "train")
    assert "skip" in str(e.value)
    with pytest.warns(UserWarning, match="1 unusable sample.*row 4: label -1 out of range"):  # as shards warn
        loose = load_dataset(f"hf:{root}", "train", corrupt="skip")
    assert len(loose) == 6 and sum(loose.class_counts.values()) == 5 and len(loose.bad) == 1
    with pytest.raises(DatasetError, match="no test split"):
        load_dataset(f"hf:{root}", "test")
    (root / "data" / "train-00000-of-00001.parquet").unlink()
    numbered(0, 3).rename_column("image", "picture").to_parquet(str(root / "data" / "train-00000-of-00001.parquet"))
    renamed = load_dataset(f"hf:{root}", "train")  # the index pass reads labels only
    with pytest.raises(DatasetError, match="no column 'image'; it has .*picture"):
        read_back(renamed)


def test_a_saved_validation_split_is_val_and_string_labels_are_refused(tmp_path):
    """A DatasetDict's `validation` split (HF's usual name) is vitkit's val, in saved folders as in parquet;
    a label column that is not integers is named, not a traceback."""
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": numbered(0, 8), "validation": numbered(100, 4)}).save_to_disk(str(saved))
    assert split_names(f"hf:{saved}") == ("train", "val")
    assert read_back(load_dataset(f"hf:{saved}", "val")) == [(n, n % 4) for n in range(100, 104)]
    words = numbered(0, 4).cast_column("label", datasets.Value("string"))
    (tmp_path / "words" / "data").mkdir(parents=True)
    words.to_parquet(str(tmp_path / "words" / "data" / "train-00000-of-00001.parquet"))
    with pytest.raises(DatasetError, match="column 'label' holds string, expected integers"):
        load_dataset(f"hf:{tmp_path / 'words'}", "train")


def parquet_folder(root, image, label, metadata: bytes | None = None) -> str:
    """``hf:root`` holding one train file of the given arrow ``image`` and ``label`` columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"image": image, "label": label})
    if metadata is not None:
        table = table.replace_schema_metadata({"huggingface": metadata})
    (root / "data").mkdir(parents=True)
    pq.write_table(table, root / "data" / "train-00000-of-00001.parquet")
    return f"hf:{root}"


def image_structs(numbers):
    import pyarrow as pa
    from data_helpers import png
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.array([{"bytes": png(numbered_image(n)), "path": None} for n in numbers], kind)


@pytest.mark.parametrize("metadata, expected", [
    (b"{not json", "is not JSON"),
    (b"\xff\xfe", "is not JSON"),
    (b"[]", r"the document is \[\], expected an object"),
    (b'{"info": {"features": []}}', r"info.features is \[\], expected an object"),
    (b'{"info": {"features": {"label": "ClassLabel"}}}', 'info.features.label is "ClassLabel", expected an object'),
    (b'{"info": {"features": {"label": {"names": 3, "_type": "ClassLabel"}}}}', "has names 3, expected a list"),
    (b'{"info": {"features": {"label": {"names": ["a", 1]}}}}', r'has names \["a", 1\], expected a list'),
    (b'{"info": {"features": {"label": {"_type": "ClassLabel"}}}}', "has names null, expected a list"),
])
def test_malformed_schema_metadata_is_named(tmp_path, metadata, expected):
    import pyarrow as pa
    spec = parquet_folder(tmp_path, image_structs([0, 1]), pa.array([0, 1]), metadata)
    with pytest.raises(DatasetError, match=rf"train-00000-of-00001.parquet: schema metadata 'huggingface'.*{expected}"):
        load_dataset(spec, "train")


def test_plain_integer_labels_and_image_bytes_read_and_other_image_columns_are_named(tmp_path):
    import pyarrow as pa
    from data_helpers import png
    plain = b'{"info": {"features": {"label": {"dtype": "int64", "_type": "Value"}}}}'
    spec = parquet_folder(tmp_path / "bytes", pa.array([png(numbered_image(n)) for n in range(3)]),
                          pa.array([2, 0, 1]), plain)
    split = load_dataset(spec, "train")
    assert split.classes == ["0", "1", "2"] and read_back(split) == [(0, 2), (1, 0), (2, 1)]
    spec = parquet_folder(tmp_path / "words", pa.array(["a.png", "b.png"]), pa.array([0, 1]))
    with pytest.raises(DatasetError, match="column 'image' holds string, expected the Image feature"):
        read_back(load_dataset(spec, "train"))


def test_unsigned_labels_past_int64_name_the_row(tmp_path):
    """A uint64 label column: its values fit no int64 (the cast failed as 'not a readable parquet file')."""
    import pyarrow as pa
    from data_helpers import png
    spec = parquet_folder(tmp_path / "unsigned", pa.array([png(numbered_image(n)) for n in range(3)]),
                          pa.array([1, 2**64 - 1, 0], type=pa.uint64()))
    with pytest.raises(DatasetError, match=r"train-00000-of-00001.parquet: row 1: label 18446744073709551615 is not "
                                           r"a class index \(pass --corrupt skip"):
        load_dataset(spec, "train")
    with pytest.warns(UserWarning, match="1 unusable sample.*row 1: label 18446744073709551615"):
        loose = load_dataset(spec, "train", corrupt="skip")
    assert loose.classes == ["0", "1"] and dict(loose.class_counts) == {0: 1, 1: 1}
    with pytest.warns(UserWarning, match=r"left out 1 unreadable image\(s\): .*parquet:row 1"):
        read = [(number_of(image.permute(1, 2, 0)), int(label))
                for images, labels in evaluation_loader(loose, AS_IS, batch_size=8, corrupt="skip")
                for image, label in zip(images, labels)]
    assert read == [(0, 1), (2, 0)]  # evaluation leaves the unusable row out


def test_a_hub_dataset_is_resolved_once_per_run(tmp_path, monkeypatch):
    """hf:ORG/NAME through huggingface_hub's own snapshot_download, offline, from a cache laid out as the hub
    leaves it: a run's split listing and its splits ask the hub once."""
    import huggingface_hub
    import pyarrow as pa

    from vitkit.data import load_splits
    from vitkit.data.sources.hf import hub_folder
    commit = "1" * 40
    repo = tmp_path / "hub-cache" / "datasets--someone--numbers"
    parquet_folder(repo / "snapshots" / commit, image_structs(range(4)), pa.array([0, 1, 0, 1]))
    (repo / "snapshots" / commit / "data" / "train-00000-of-00001.parquet").rename(
        repo / "snapshots" / commit / "data" / "test-00000-of-00001.parquet")
    parquet_folder(repo / "snapshots" / commit / "more", image_structs(range(6)), pa.array([1, 0] * 3))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    asked, download = [], huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: asked.append(a) or download(*a, **k))
    hub_folder.cache_clear()
    names = split_names("hf:someone/numbers")
    splits = load_splits("hf:someone/numbers", names)
    assert names == ("train", "test") and {name: len(s) for name, s in splits.items()} == {"train": 6, "test": 4}
    assert read_back(splits["test"]) == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert len(asked) == 1
    hub_folder.cache_clear()
    with pytest.raises(DatasetError, match="hf:someone/absent: not a local folder, and the hub did not give it"):
        load_dataset("hf:someone/absent", "train")


def test_a_parquet_file_under_another_split_s_folder_is_refused_and_all_reads_every_split(tmp_path):
    """``train/validation-*.parquet`` says two splits: read as train, its validation rows would be trained on."""
    (tmp_path / "ok" / "data").mkdir(parents=True)
    numbered(0, 6).to_parquet(str(tmp_path / "ok" / "data" / "train-00000-of-00001.parquet"))
    numbered(100, 3).to_parquet(str(tmp_path / "ok" / "data" / "validation-00000-of-00001.parquet"))
    assert sorted(n for n, _ in read_back(load_dataset(f"hf:{tmp_path / 'ok'}", "all"))) == [*range(6), 100, 101, 102]
    (tmp_path / "mixed" / "train").mkdir(parents=True)
    numbered(0, 3).to_parquet(str(tmp_path / "mixed" / "train" / "validation-00000-of-00001.parquet"))
    with pytest.raises(DatasetError, match="validation-00000-of-00001.parquet: names two splits"):
        load_dataset(f"hf:{tmp_path / 'mixed'}", "train")
