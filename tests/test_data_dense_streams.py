"""Masks and depth maps in the streamed formats: WebDataset shards (``KEY.mask.png`` / ``KEY.depth.png``, as ``vitkit
data convert`` writes any dense dataset) and ``hf:`` folders (a ``mask`` or ``depth`` Image column), read item for
item as the folder they came from, trained on and measured, and their bad samples named."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from launch import VITKIT, launch
from PIL import Image
from test_data_dense import depthfolder, maskfolder, nyu_toolbox, voc
from test_dense_training import backbone, colour_boxes
from webdataset import TarWriter

from vitkit.cli import main
from vitkit.data import DatasetError, SplitSpec, load_dataset
from vitkit.data.convert import convert_dataset
from vitkit.data.datasets import dataset_info
from vitkit.data.sources.segmentation import VOC_CLASSES

HALF = SplitSpec(0.5)  # the small folders' held-out validation part


def items(split) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every (image, target) of a sharded split, decoded in shard order."""
    return [split.decode(shard, key, payload) for shard in split.shards for key, payload in split.raw(shard)]


def assert_same_items(ours: list, theirs) -> None:
    assert len(ours) == len(theirs)
    for index, (image, target) in enumerate(ours):
        image_there, target_there = theirs[index]
        assert torch.equal(image, image_there) and torch.equal(target, target_there), index
        assert type(target) is type(target_there) and target.dtype == target_there.dtype


@pytest.mark.parametrize("kind, make", [("voc", voc), ("maskfolder", maskfolder), ("nyu", nyu_toolbox),
                                        ("depthfolder", depthfolder)])
def test_converted_dense_datasets_read_back_item_for_item(kind, make, tmp_path):
    """VOC's palette masks, a mask folder, NYU's and a folder's 16-bit depth: the shards give every split's images
    and targets as the source reads them, and `data info` the same task, classes and counts."""
    root = make(tmp_path / kind)
    written = convert_dataset(f"{kind}:{root}", tmp_path / "shards", val_fraction=0.5)
    source = dataset_info(f"{kind}:{root}")
    info = json.loads(launch(VITKIT, "data", "info", f"webdataset:{tmp_path / 'shards'}", "--json"))
    assert info["task"] == source["task"] and info["classes"] == source["classes"]
    assert {split: part["images"] for split, part in info["splits"].items()} == written
    for split in written:
        streamed = load_dataset(f"webdataset:{tmp_path / 'shards'}", split)
        assert streamed.task == source["task"] and streamed.classes == source["classes"]
        assert_same_items(items(streamed), load_dataset(f"{kind}:{root}", split, spec=HALF))
    if kind == "voc":
        assert info["classes"] == list(VOC_CLASSES)
    with tarfile.open(next((tmp_path / "shards").glob("train-*.tar"))) as tar:
        members = {name.split(".", 1)[1] for name in tar.getnames()}  # KEY.EXT: the keys hold no dot
    target = "depth.png" if source["task"] == "depth" else "mask.png"
    assert target in members and "cls" not in members and members - {target} <= {"jpg", "png"}


def _image_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _hf_rows(root, column: str, count: int = 3) -> tuple[list[dict], list[dict]]:
    """Image and target cells (the Image feature's {bytes, path}) of a maskfolder's or depthfolder's train split."""
    dataset = load_dataset(f"{'maskfolder' if column == 'mask' else 'depthfolder'}:{root}", "train")
    images, targets = [], []
    for index in range(len(dataset)):
        images.append({"bytes": dataset.path(index).read_bytes(), "path": None})
        targets.append({"bytes": dataset.target_path(index).read_bytes(), "path": None})
    return images, targets


@pytest.mark.parametrize("column", ["mask", "depth"])
def test_hf_folders_with_a_mask_or_depth_column(column, tmp_path):
    """A parquet folder (classes from HF's id2label.json) and a save_to_disk folder (classes.txt) with an Image
    column ``mask`` or ``depth`` give the folder's items."""
    datasets = pytest.importorskip("datasets")
    source = (maskfolder if column == "mask" else depthfolder)(tmp_path / "source")
    images, targets = _hf_rows(source, column)
    table = datasets.Dataset.from_dict({"image": images, column: targets},
                                       features=datasets.Features({"image": datasets.Image(),
                                                                   column: datasets.Image()}))
    parquet = tmp_path / "parquet"
    (parquet / "data").mkdir(parents=True)
    table.to_parquet(str(parquet / "data" / "train-00000-of-00001.parquet"))
    arrow = tmp_path / "arrow"
    table.save_to_disk(str(arrow))
    if column == "mask":
        (parquet / "id2label.json").write_text(json.dumps({"0": "sky", "1": "tree", "2": "road"}))
        (arrow / "classes.txt").write_text("sky\ntree\nroad\n")
    expected = load_dataset(f"{'maskfolder' if column == 'mask' else 'depthfolder'}:{source}", "train")
    for folder in (parquet, arrow):
        split = load_dataset(f"hf:{folder}", "train")
        assert split.task == ("segmentation" if column == "mask" else "depth")
        assert split.classes == (["sky", "tree", "road"] if column == "mask" else [])
        assert_same_items(items(split), expected)


def test_a_head_trains_on_shards_and_measures_them_as_the_folder(tmp_path, capsys):
    """`finetune` streams the converted shards (joint crops and flips on the stream) and `eval` on the shards'
    val split reports the mIoU that the folder's val split gives the same model."""
    folder = colour_boxes(tmp_path / "boxes", splits=(("train", 24), ("val", 8)))
    convert_dataset(f"maskfolder:{folder}", tmp_path / "shards")
    run_dir = tmp_path / "run"
    assert main(["finetune", str(backbone(tmp_path / "backbone")), "--objective", "segmentation", "--head", "linear",
                 "--peft", "linear", "--dataset", f"webdataset:{tmp_path / 'shards'}", "--image-size", "32",
                 "--steps", "40", "--batch-size", "8", "--optimizer", "adamw", "--lr", "0.02", "--weight-decay", "0",
                 "--warmup-steps", "5", "--run-dir", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test/images"] == 8 and summary["test/mIoU"] > 0.4, summary
    reports = {}
    for name, spec in (("shards", f"webdataset:{tmp_path / 'shards'}"), ("folder", f"maskfolder:{folder}")):
        assert main(["eval", str(run_dir / "model"), "--dataset", spec, "--split", "val", "--out",
                     str(tmp_path / name)]) == 0
        reports[name] = json.loads((tmp_path / name / "eval-val.json").read_text())
    assert reports["shards"]["mIoU"] == pytest.approx(reports["folder"]["mIoU"], abs=1e-9)
    assert reports["shards"]["mIoU"] == pytest.approx(summary["test/mIoU"], abs=1e-9)


def _shard(path, samples: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)


GREY = np.zeros((4, 6), np.uint8)
RGB = np.zeros((4, 6, 3), np.uint8)


def test_bad_dense_shards_are_named_in_one_line(tmp_path):
    image, mask = _image_bytes(RGB), _image_bytes(GREY)
    root = tmp_path / "missing"
    _shard(root / "train-000000.tar", [{"__key__": "a", "png": image, "mask.png": mask},
                                       {"__key__": "b", "png": image}])
    (root / "classes.txt").write_text("sky\n")
    with pytest.raises(DatasetError, match=r"train-000000.tar: sample b: no .mask.png mask"):
        load_dataset(f"webdataset:{root}", "train")

    root = tmp_path / "mixed"
    _shard(root / "train-000000.tar", [{"__key__": "a", "png": image, "cls": "0"}])
    _shard(root / "train-000001.tar", [{"__key__": "b", "png": image, "mask.png": mask}])
    with pytest.raises(DatasetError, match=r"shards of different kinds, .*000000.tar of classification samples, "
                                           r".*000001.tar of segmentation samples"):
        load_dataset(f"webdataset:{root}", "train")

    root = tmp_path / "unnamed"
    _shard(root / "train-000000.tar", [{"__key__": "a", "png": image, "mask.png": mask}])
    with pytest.raises(DatasetError, match="masks, but no class names; expected classes.txt"):
        load_dataset(f"webdataset:{root}", "train")

    root = tmp_path / "decoded"
    _shard(root / "train-000000.tar", [
        {"__key__": "small", "png": image, "mask.png": _image_bytes(np.zeros((4, 5), np.uint8))},
        {"__key__": "class", "png": image, "mask.png": _image_bytes(np.full((4, 6), 7, np.uint8))}])
    (root / "classes.txt").write_text("sky\nroad\n")
    split = load_dataset(f"webdataset:{root}", "train")
    with pytest.raises(DatasetError, match=r"sample small .mask.png: the mask is 5x4 but its image .*sample small "
                                           r"is 6x4; expected the same size"):
        items(split)
    second = list(split.raw(split.shards[0]))[1]
    with pytest.raises(DatasetError, match=r"sample class .mask.png: mask value 7 names no class; expected 0..1, 255"):
        split.decode(split.shards[0], *second)

    root = tmp_path / "depth8"
    _shard(root / "train-000000.tar", [{"__key__": "a", "png": image, "depth.png": mask}])
    split = load_dataset(f"webdataset:{root}", "train")
    with pytest.raises(DatasetError, match=r"sample a .depth.png: a depth map of mode 'L'; expected a 16-bit PNG"):
        items(split)


def test_an_hf_mask_column_that_holds_no_images_is_named(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"image": [_image_bytes(RGB)], "mask": [3]}),
                   tmp_path / "data" / "train-00000-of-00001.parquet")
    (tmp_path / "classes.txt").write_text("sky\n")
    with pytest.raises(DatasetError, match=r"column 'mask' holds int64, expected the Image feature"):
        items(load_dataset(f"hf:{tmp_path}", "train"))
