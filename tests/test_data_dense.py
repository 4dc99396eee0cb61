"""Segmentation and depth datasets as people hold them on disk (VOC, Cityscapes, ADE20K, a mask folder, NYU Depth v2
in BTS's and the depth toolbox's layouts, a depth folder), built tiny here: items, id mappings, split counts as
torchvision's readers count them, what `vitkit data info` says, and every bad input refused naming its file."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from launch import VITKIT, launch
from PIL import Image
from torchvision import tv_tensors

from vitkit.data import DatasetError, default_split, load_dataset, load_splits
from vitkit.data.datasets import dataset_info, verify_dataset
from vitkit.data.dense import DenseDataset
from vitkit.data.map_style import held_part
from vitkit.data.sources.segmentation import ADE_CLASSES, CITYSCAPES_IDS, VOC_CLASSES, voc_colour
from vitkit.errors import DatasetNameError

W, H = 6, 4


def image(path: Path, seed: int = 0, size: tuple[int, int] = (W, H)) -> Path:
    """A small RGB image at ``path`` (its format from the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def grey(path: Path, values, mode: str = "L") -> Path:
    """A PNG of ``values`` (rows of stored values) as an 8-bit grey ("L") or palette ("P") image."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.array(values, dtype=np.uint8)
    picture = Image.frombytes(mode, (pixels.shape[1], pixels.shape[0]), pixels.tobytes())
    if mode == "P":
        picture.putpalette([channel for index in range(256) for channel in voc_colour(index)])
    picture.save(path)
    return path


def depth_png(path: Path, millimetres) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.array(millimetres, dtype=np.uint16)).save(path)
    return path


def rows(*values: int) -> list[list[int]]:
    """An H x W mask whose first row holds ``values`` (then zeros); every other row is zeros."""
    mask = np.zeros((H, W), dtype=np.int64)
    mask[0, :len(values)] = values
    return mask.tolist()


VOC_MASK = rows(0, 1, 15, 20, 255, 255)


def voc(root: Path, train: int = 3, val: int = 2) -> Path:
    """``root/VOCdevkit/VOC2012`` with ``train`` + ``val`` images, palette masks with class ids and 255."""
    folder = root / "VOCdevkit" / "VOC2012"
    names = {"train": [f"2007_{n:06d}" for n in range(train)], "val": [f"2008_{n:06d}" for n in range(val)]}
    for split, listed in names.items():
        (folder / "ImageSets" / "Segmentation").mkdir(parents=True, exist_ok=True)
        (folder / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("".join(f"{n}\n" for n in listed))
        for index, name in enumerate(listed):
            image(folder / "JPEGImages" / f"{name}.jpg", index)
            grey(folder / "SegmentationClass" / f"{name}.png", VOC_MASK, "P")
    return root


CITY_IDS = rows(7, 8, 0, 26, 33, 34)  # road, sidewalk, unlabeled, car, bicycle, an id past the table's


def cityscapes(root: Path) -> Path:
    """``leftImg8bit/`` and ``gtFine/`` of 3 train (two cities), 1 val and 1 test image."""
    for split, cities in {"train": {"aachen": 2, "bremen": 1}, "val": {"frankfurt": 1}, "test": {"berlin": 1}}.items():
        for city, count in cities.items():
            for index in range(count):
                stem = f"{city}_{index:06d}_000019"
                image(root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png", index)
                grey(root / "gtFine" / split / city / f"{stem}_gtFine_labelIds.png", CITY_IDS)
    return root


def ade20k(root: Path) -> Path:
    folder = root / "ADEChallengeData2016"
    for split, part, count in (("train", "training", 3), ("val", "validation", 2)):
        for index in range(count):
            image(folder / "images" / part / f"ADE_{split}_{index:08d}.jpg", index)
            grey(folder / "annotations" / part / f"ADE_{split}_{index:08d}.png", rows(0, 1, 150, 255, 7))
    return root


def maskfolder(root: Path) -> Path:
    (root).mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("sky\ntree\nroad\n")
    for split, names in (("train", ["a.jpg", "b.png"]), ("val", ["c.jpg"])):
        for index, name in enumerate(names):
            image(root / split / "images" / name, index)
            grey(root / split / "masks" / f"{Path(name).stem}.png", rows(0, 1, 2, 255))
    return root


NYU_MM = np.full((H, W), 2500, dtype=np.uint16)
NYU_MM[0, :3] = (0, 1234, 10000)


def nyu_toolbox(root: Path) -> Path:
    """NYU as the depth toolbox (and DINOv2's evaluation) holds it: ``nyu_{train,test}.txt`` beside the scenes."""
    lines = {"train": ["/kitchen_0028b/rgb_00045.jpg /kitchen_0028b/sync_depth_00045.png 518.8579",
                       "/bedroom_0060/rgb_00081.jpg /bedroom_0060/sync_depth_00081.png 518.8579"],
             "test": ["bathroom/rgb_00045.jpg bathroom/sync_depth_00045.png 518.8579"]}
    for split, listed in lines.items():
        for index, line in enumerate(listed):
            rgb, depth, _ = line.split()
            image(root / rgb.lstrip("/"), index)
            depth_png(root / depth.lstrip("/"), NYU_MM)
        root.joinpath(f"nyu_{split}.txt").write_text("\n".join(listed) + "\n")
    return root


def nyu_bts(root: Path) -> Path:
    """NYU as BTS holds it: ``sync/`` and ``official_splits/test/``, the lists in ``train_test_inputs/``."""
    (root / "train_test_inputs").mkdir(parents=True)
    for split, folder, scene in (("train", "sync", "/living_room_0019"), ("test", "official_splits/test", "office")):
        image(root / folder / scene.lstrip("/") / "rgb_00111.jpg")
        depth_png(root / folder / scene.lstrip("/") / "sync_depth_00111.png", NYU_MM)
        (root / "train_test_inputs" / f"nyudepthv2_{split}_files_with_gt.txt").write_text(
            f"{scene}/rgb_00111.jpg {scene}/sync_depth_00111.png 518.8579\n")
    return root


def depthfolder(root: Path) -> Path:
    for split, count in (("train", 2), ("test", 1)):
        for index in range(count):
            image(root / split / "images" / f"{index}.png", index)
            depth_png(root / split / "depth" / f"{index}.png", NYU_MM)
    return root


def counts(name: str) -> dict[str, int]:
    return {split: info["images"] for split, info in dataset_info(name)["splits"].items()}


def test_voc_items_keep_palette_indices_and_count_as_torchvision(tmp_path):
    root = voc(tmp_path / "voc")
    for split in ("train", "val"):
        assert len(load_dataset(f"voc:{root}", split)) == len(torchvision.datasets.VOCSegmentation(root, image_set=split))
    picture, mask = load_dataset(f"voc:{root}", "train")[0]
    assert picture.dtype == torch.uint8 and picture.shape == (3, H, W)
    assert isinstance(mask, tv_tensors.Mask) and mask.dtype == torch.int64 and mask.shape == (H, W)
    assert mask.tolist() == VOC_MASK
    for spelled in (root / "VOCdevkit", root / "VOCdevkit" / "VOC2012"):  # VOCdevkit or VOC2012 named directly
        assert counts(f"voc:{spelled}") == {"train": 3, "val": 2}
    dataset = load_dataset(f"voc:{root}", "val")
    assert (dataset.task, dataset.classes, dataset.ignore_index) == ("segmentation", list(VOC_CLASSES), 255)
    assert (dataset.max_depth, dataset.eval_crop) == (None, None) and default_split(f"voc:{root}") == "val"
    assert len(load_dataset(f"voc:{root}", "all")) == 5


def test_voc_rgb_masks_are_read_through_the_colour_map(tmp_path):
    root = voc(tmp_path / "voc", train=1, val=1)
    mask_file = root / "VOCdevkit" / "VOC2012" / "SegmentationClass" / "2007_000000.png"
    colours = np.array([[voc_colour(index) for index in row] for row in VOC_MASK], dtype=np.uint8)
    Image.fromarray(colours).save(mask_file)
    assert Image.open(mask_file).mode == "RGB"
    assert load_dataset(f"voc:{root}", "train")[0][1].tolist() == VOC_MASK
    colours[1, 1] = (1, 2, 3)
    Image.fromarray(colours).save(mask_file)
    with pytest.raises(DatasetError, match=rf"{mask_file}: colour \(1, 2, 3\) stands for no class"):
        load_dataset(f"voc:{root}", "train")[0]


def test_cityscapes_label_ids_become_train_ids(tmp_path):
    root = cityscapes(tmp_path / "cityscapes")
    for split in ("train", "val"):
        expected = len(torchvision.datasets.Cityscapes(root, split=split, target_type="semantic"))
        assert len(load_dataset(f"cityscapes:{root}", split)) == expected
    # the public test split's masks hold no class: it is not read, and evaluation measures val
    assert counts(f"cityscapes:{root}") == {"train": 3, "val": 1} and default_split(f"cityscapes:{root}") == "val"
    dataset = load_dataset(f"cityscapes:{root}", "train")
    assert dataset.classes == list(CITYSCAPES_IDS) and len(dataset.classes) == 19
    assert dataset.classes[13] == "car" and dataset.path(0).name == "aachen_000000_000019_leftImg8bit.png"
    assert dataset[0][1][0].tolist() == [0, 1, 255, 13, 18, 255] and dataset[0][1][1:].eq(255).all()


def test_ade20k_shifts_ids_down_and_ignores_zero(tmp_path):
    root = ade20k(tmp_path / "ade")
    assert counts(f"ade20k:{root}") == {"train": 3, "val": 2}
    assert counts(f"ade20k:{root / 'ADEChallengeData2016'}") == {"train": 3, "val": 2}
    dataset = load_dataset(f"ade20k:{root}", "val")
    assert dataset.classes == list(ADE_CLASSES) and len(dataset.classes) == 150 and dataset.classes[-1] == "flag"
    assert dataset[1][1][0].tolist() == [255, 0, 149, 255, 6, 255]
    mask_file = root / "ADEChallengeData2016" / "annotations" / "validation" / "ADE_val_00000001.png"
    grey(mask_file, rows(0, 151, 200))
    with pytest.raises(DatasetError, match=rf"{mask_file}: mask values 151, 200 name no class; expected 0..150, 255"):
        dataset[1]


def test_mask_folder_items_subsets_and_checks(tmp_path):
    root = maskfolder(tmp_path / "masks")
    assert counts(f"maskfolder:{root}") == {"train": 2, "val": 1}
    train = load_dataset(f"maskfolder:{root}", "train")
    assert train.classes == ["sky", "tree", "road"] and [train.path(i).name for i in range(2)] == ["a.jpg", "b.png"]
    assert train[1][1][0].tolist() == [0, 1, 2, 255, 0, 0]
    swapped = train.subset(np.array([1, 0]), "swapped")
    assert swapped.path(0).name == "b.png" and swapped.name == "swapped" and swapped.classes == train.classes
    assert len(held_part(train, 0.5, 0, True, "held")) == 1
    with pytest.raises(DatasetError, match=rf"{root / 'test' / 'images'}: no such folder"):
        load_dataset(f"maskfolder:{root}", "test")

    mask_file = root / "train" / "masks" / "a.png"
    grey(mask_file, rows(0, 3, 7))  # 3 classes: ids 3 and 7 name none
    with pytest.raises(DatasetError, match=rf"{mask_file}: mask values 3, 7 name no class; expected 0..2, 255"):
        train[0]
    assert verify_dataset(f"maskfolder:{root}") == [str(train.path(0))]  # `vitkit data verify` names its image
    grey(mask_file, np.zeros((H + 1, W), dtype=np.uint8).tolist())
    with pytest.raises(DatasetError, match=rf"{mask_file}: the mask is 6x5 but its image {train.path(0)} is 6x4; "
                                           rf"expected the same size"):
        train[0]
    Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(mask_file)
    with pytest.raises(DatasetError, match=rf"{mask_file}: a mask of mode 'RGB'; expected a palette"):
        train[0]


def test_nyu_in_both_layouts_gives_metres_and_the_eigen_crop(tmp_path):
    for root, expected in ((nyu_toolbox(tmp_path / "toolbox"), {"train": 2, "test": 1}),
                           (nyu_bts(tmp_path / "bts"), {"train": 1, "test": 1})):
        assert counts(f"nyu:{root}") == expected and default_split(f"nyu:{root}") == "test"
        splits = load_splits(f"nyu:{root}", ("train", "test"))
        for dataset in splits.values():
            picture, depth = dataset[0]
            assert picture.shape == (3, H, W) and isinstance(depth, tv_tensors.Mask)
            assert depth.dtype == torch.float32 and depth.shape == (H, W)
            assert depth[0, :3].tolist() == pytest.approx([0.0, 1.234, 10.0]) and depth[1, 1] == pytest.approx(2.5)
            assert (dataset.task, dataset.classes, dataset.max_depth) == ("depth", [], 10.0)
            assert dataset.eval_crop == (45, 471, 41, 601)
    info = dataset_info(f"nyu:{tmp_path / 'toolbox'}")
    assert info["classes"] == [] and info["task"] == "depth"
    assert load_dataset(f"nyu:{tmp_path / 'bts'}", "test").path(0).parts[-4:] == (
        "official_splits", "test", "office", "rgb_00111.jpg")


def test_depth_folder_and_bad_depth_maps(tmp_path):
    root = depthfolder(tmp_path / "depth")
    assert counts(f"depthfolder:{root}") == {"train": 2, "test": 1} and default_split(f"depthfolder:{root}") == "test"
    train = load_dataset(f"depthfolder:{root}", "train")
    assert (train.max_depth, train.eval_crop) == (None, None)
    assert train[0][1][0, 2].item() == pytest.approx(10.0)
    depth_file = root / "train" / "depth" / "1.png"
    grey(depth_file, np.full((H, W), 25))
    with pytest.raises(DatasetError, match=rf"{depth_file}: a depth map of mode 'L'; expected a 16-bit PNG of "
                                           rf"depth in millimetres"):
        train[1]


def test_empty_splits_and_missing_files_are_refused_when_listed(tmp_path):
    root = voc(tmp_path / "voc")
    lists = root / "VOCdevkit" / "VOC2012" / "ImageSets" / "Segmentation"
    (root / "VOCdevkit" / "VOC2012" / "JPEGImages" / "2008_000001.jpg").unlink()
    with pytest.raises(DatasetError, match=r"2008_000001\.jpg: no such image \(listed in .*val\.txt\)"):
        load_dataset(f"voc:{root}", "val")
    (lists / "val.txt").write_text("\n")
    with pytest.raises(DatasetError, match=rf"{lists / 'val.txt'}: an empty split"):
        load_dataset(f"voc:{root}", "val")

    ade = ade20k(tmp_path / "ade")
    mask_file = ade / "ADEChallengeData2016" / "annotations" / "training" / "ADE_train_00000002.png"
    mask_file.unlink()
    with pytest.raises(DatasetError, match=rf"{mask_file}: no such mask; expected the mask of .*ADE_train_00000002"):
        load_dataset(f"ade20k:{ade}", "train")

    masks = maskfolder(tmp_path / "masks")
    for name in os.listdir(masks / "val" / "images"):
        (masks / "val" / "images" / name).unlink()
    with pytest.raises(DatasetError, match=rf"{masks / 'val' / 'images'}: an empty split"):
        load_dataset(f"maskfolder:{masks}", "val")

    outside = image(tmp_path / "elsewhere.jpg")
    (masks / "train" / "images" / "c.jpg").symlink_to(outside)
    grey(masks / "train" / "masks" / "c.png", rows(0))
    with pytest.raises(DatasetError, match="leads outside"):
        load_dataset(f"maskfolder:{masks}", "train")


def test_a_bare_folder_is_recognised_by_its_layout(tmp_path):
    root = voc(tmp_path / "voc", train=1, val=1)
    with pytest.raises(DatasetNameError, match=f"did you mean voc:{root}"):
        load_dataset(str(root), "train")


def test_data_info_describes_voc_without_decoding(tmp_path):
    root = voc(tmp_path / "voc")
    for mask in (root / "VOCdevkit" / "VOC2012" / "SegmentationClass").iterdir():
        mask.write_bytes(b"not a png")  # never read by `info`
    info = json.loads(launch(VITKIT, "data", "info", f"voc:{root}", "--json"))
    assert {split: part["images"] for split, part in info["splits"].items()} == {"train": 3, "val": 2}
    assert info["classes"] == list(VOC_CLASSES) and info["task"] == "segmentation"
    assert isinstance(load_dataset(f"voc:{root}", "train"), DenseDataset)
