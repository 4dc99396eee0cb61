"""The evaluation suite's dataset layouts (Pets, Flowers-102, ImageNet, VTAB-1k), made tiny in tmp folders and
read against torchvision where it reads the layout, else against the lists the test wrote."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import savemat
from torchvision import datasets as tvd

from vitkit.data.sources import flowers102 as flowers, imagenet, pets, vtab
from vitkit.errors import ConfigError, DatasetError


def image(path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 5, 3), value, np.uint8)).save(path, quality=100)


PET_ROWS = {"trainval": [("Abyssinian_1", 1), ("great_pyrenees_2", 3), ("Bengal_7", 2), ("Abyssinian_3", 1)],
            "test": [("Bengal_4", 2), ("great_pyrenees_5", 3), ("Abyssinian_6", 1)]}


@pytest.fixture
def pets_root(tmp_path):
    base = tmp_path / "oxford-iiit-pet"
    for split, rows in PET_ROWS.items():
        (base / "annotations").mkdir(parents=True, exist_ok=True)
        (base / "annotations" / f"{split}.txt").write_text(
            "".join(f"{name} {label} {1 + label % 2} 1\n" for name, label in rows))
        for index, (name, _) in enumerate(rows):
            image(base / "images" / f"{name}.jpg", 40 * index)
    return tmp_path


@pytest.mark.parametrize("split", ["trainval", "test"])
def test_pets_reads_as_torchvision(pets_root, split):
    ours, theirs = pets.read(pets_root, split), tvd.OxfordIIITPet(pets_root, split, download=False)
    assert len(ours) == len(theirs) and ours.classes == theirs.classes
    assert ours.labels.tolist() == [theirs[index][1] for index in range(len(theirs))]
    for index in range(len(theirs)):
        pixels = torch.from_numpy(np.array(theirs[index][0])).permute(2, 0, 1)
        assert torch.equal(ours[index][0], pixels)


def test_pets_refuses_a_file_outside_and_a_bad_line(pets_root):
    annotations = pets_root / "oxford-iiit-pet" / "annotations"
    (annotations / "test.txt").write_text("../../escape 1 1 1\n")
    with pytest.raises(DatasetError, match="leads outside"):
        pets.read(pets_root, "test")
    (annotations / "test.txt").write_text("Bengal_4 two 1 1\n")
    with pytest.raises(DatasetError, match=r"test.txt:1: class 'two' is not an integer"):
        pets.read(pets_root, "test")
    with pytest.raises(DatasetError, match="torchvision's layout"):
        pets.read(pets_root / "oxford-iiit-pet" / "images", "test")


@pytest.fixture
def flowers_root(tmp_path):
    base = tmp_path / "flowers-102"
    labels = np.array([3, 1, 2, 3, 1, 2, 2])  # 1-based, image 1..7
    savemat(base.mkdir(parents=True) or base / "imagelabels.mat", {"labels": labels})
    savemat(base / "setid.mat", {"trnid": np.array([1, 2, 3]), "valid": np.array([4, 5]), "tstid": np.array([7, 6])})
    for number in range(1, 8):
        image(base / "jpg" / f"image_{number:05d}.jpg", 30 * number)
    return tmp_path


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_flowers_reads_as_torchvision(flowers_root, split, monkeypatch):
    monkeypatch.setattr(tvd.Flowers102, "_check_integrity", lambda self: True)  # its md5s are of the real files
    ours, theirs = flowers.read(flowers_root, split), tvd.Flowers102(flowers_root, split, download=False)
    assert len(ours) == len(theirs)
    assert ours.labels.tolist() == [theirs[index][1] for index in range(len(theirs))]
    assert [ours.path(index).name for index in range(len(ours))] == [path.name for path in theirs._image_files]


def test_flowers_trainval_is_train_then_val(flowers_root):
    both = flowers.read(flowers_root, "trainval")
    assert [both.path(index).name for index in range(len(both))] == [
        f"image_{number:05d}.jpg" for number in (1, 2, 3, 4, 5)]
    assert both.labels.tolist() == [2, 0, 1, 2, 0]


def test_flowers_refuses_numbers_past_the_labels(flowers_root):
    savemat(flowers_root / "flowers-102" / "setid.mat", {"trnid": np.array([9]), "valid": np.array([1]),
                                                         "tstid": np.array([2])})
    with pytest.raises(DatasetError, match=r"image numbers reach 9; expected 1..7"):
        flowers.read(flowers_root, "train")


WNIDS = ["n03", "n01", "n02"]  # ILSVRC ids 1, 2, 3: their sorted order differs from the devkit's


def devkit(root, truth: list[int], archive: bool) -> None:
    synsets = np.array([(index + 1, wnid, f"thing {wnid}, other", 0) for index, wnid in enumerate(WNIDS)]
                       + [(4, "n99", "a parent", 2)],
                       dtype=[("ILSVRC2012_ID", object), ("WNID", object), ("words", object), ("num_children", object)])
    folder = root / "build" / imagenet.DEVKIT / "data"
    folder.mkdir(parents=True)
    savemat(folder / "meta.mat", {"synsets": synsets})
    (folder / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{value}\n" for value in truth))
    if archive:
        with tarfile.open(root / f"{imagenet.DEVKIT}.tar.gz", "w:gz") as tar:
            tar.add(root / "build" / imagenet.DEVKIT, arcname=imagenet.DEVKIT)
    else:
        (root / "build" / imagenet.DEVKIT).rename(root / imagenet.DEVKIT)


@pytest.mark.parametrize("archive", [True, False])
def test_imagenet_flat_val_labelled_by_the_devkit(tmp_path, archive):
    truth = [2, 1, 3, 1]  # images 1..4: n01, n03, n02, n03
    devkit(tmp_path, truth, archive)
    for number in (4, 1, 3, 2):
        image(tmp_path / "val" / f"ILSVRC2012_val_{number:08d}.JPEG", number)
    val = imagenet.read(tmp_path, "val")
    assert val.classes == ["n01", "n02", "n03"]
    assert [imagenet.val_number(val.path(index)) for index in range(len(val))] == [1, 2, 3, 4]
    assert val.labels.tolist() == [0, 2, 1, 2]


def test_imagenet_class_folders_and_missing_devkit(tmp_path):
    for split in ("train", "val"):
        for wnid in ("n02", "n01"):
            image(tmp_path / split / wnid / f"{split}_{wnid}.JPEG", 9)
    assert imagenet.read(tmp_path, "train").labels.tolist() == [0, 1]
    assert imagenet.read(tmp_path, "val").classes == ["n01", "n02"]
    flat = tmp_path / "flat"
    image(flat / "val" / "ILSVRC2012_val_00000001.JPEG", 1)
    with pytest.raises(DatasetError, match="no train/ folder and no devkit"):
        imagenet.read(flat, "val")


def vtab_task(root, sizes: dict[str, int]):
    root.mkdir(parents=True)
    for split, size in sizes.items():
        rows = [(f"images/{split}_{index}.png", index % 3) for index in range(size)]
        (root / f"{split}.txt").write_text("".join(f"{name} {label}\n" for name, label in rows))
    return root


def test_vtab_splits_and_sizes(tmp_path):
    task = vtab_task(tmp_path / "dtd", {"train800": 800, "val200": 200, "train800val200": 1000, "test": 7})
    sizes = {split: len(vtab.read(task, split)) for split in (*vtab.LISTS, "train", "val", "trainval")}
    assert sizes == {"train800": 800, "val200": 200, "train800val200": 1000, "test": 7,
                     "train": 800, "val": 200, "trainval": 1000}
    test = vtab.read(task, "test")
    assert test.labels.tolist() == [0, 1, 2, 0, 1, 2, 0] and test.classes == ["0", "1", "2"]
    assert test.path(3) == (task / "images" / "test_3.png").resolve()


def test_vtab_refuses_a_short_list_and_a_missing_one(tmp_path):
    task = vtab_task(tmp_path / "eurosat", {"train800": 799, "val200": 200, "train800val200": 1000, "test": 2})
    with pytest.raises(DatasetError, match="799 examples; a VTAB-1k task has exactly 800 in train800"):
        vtab.read(task, "test")
    task = vtab_task(tmp_path / "dtd", {"train800": 800, "val200": 200, "train800val200": 1000, "test": 2})
    (tmp_path / "dtd" / "val200.txt").unlink()
    with pytest.raises(DatasetError, match="val200.txt: no such file"):
        vtab.read(task, "test")


def test_sources_through_load_dataset(pets_root, flowers_root, tmp_path):
    from vitkit.data import load_dataset
    from vitkit.data.map_style import SplitSpec

    spec = SplitSpec(val_fraction=0.25, seed=0)
    train, val = (load_dataset(f"pets:{pets_root}", split, spec=spec) for split in ("train", "val"))
    assert (len(train), len(val)) == (3, 1)  # 25% of trainval's 4 held out
    assert sorted(map(str, [*train.files, *val.files])) == sorted(map(str, pets.read(pets_root, "trainval").files))
    assert len(load_dataset(f"pets:{pets_root}", "all")) == 7
    assert len(load_dataset(f"flowers102:{flowers_root}", "all")) == 7
    task = vtab_task(tmp_path / "svhn", {"train800": 800, "val200": 200, "train800val200": 1000, "test": 5})
    assert len(load_dataset(f"vtab:{task}", "train800val200")) == 1000
    with pytest.raises(ConfigError, match=r"pets:.* has no train800 split; expected one of train, val, test, trainval"):
        load_dataset(f"pets:{pets_root}", "train800")


def test_a_run_on_trainval_holds_its_validation_out_of_trainval(pets_root, flowers_root):
    """Pets' and Flowers' val images are part of trainval: a run trained on trainval validates on a part held out
    of it and trains on the rest, so no validation image is trained on."""
    from vitkit.data.map_style import SplitSpec
    from vitkit.train.recipes import Recipe
    from vitkit.train.run import TRAINING, evaluated_splits, training_splits

    for spec, trainval in ((f"pets:{pets_root}", pets.read(pets_root, "trainval")),
                           (f"flowers102:{flowers_root}", flowers.read(flowers_root, "trainval"))):
        recipe = Recipe(data={"dataset": spec, "train_split": "trainval", "val_fraction": 0.25})
        evaluated = evaluated_splits(recipe, pretraining=False)
        assert evaluated == ("val", "test")
        splits = training_splits(recipe, evaluated, SplitSpec(0.25))
        trained, val = ({str(path) for path in splits[name].files} for name in (TRAINING, "val"))
        assert not trained & val and trained | val == {str(path) for path in trainval.files}
        assert len(val) == round(0.25 * len(trainval)) and len(splits["test"]) == 2 + (spec[0] == "p")


def test_a_truncated_matlab_file_is_one_line(flowers_root):
    (flowers_root / "flowers-102" / "setid.mat").write_bytes(b"garbage")
    with pytest.raises(DatasetError, match=r"setid.mat: not a readable MATLAB file"):
        flowers.read(flowers_root, "train")
