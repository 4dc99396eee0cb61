"""Datasets, transform presets and the step-indexed sampler."""

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import (DatasetError, SplitSpec, StepSampler, Transformed, build_transform, load_dataset,
                         load_splits, scan_folder, split_names)
from vitkit.data.map_style import ArrayDataset
from vitkit.errors import ConfigError
from vitkit.data.transforms import ToChannels
from vitkit.normalization import normalization


def test_embedded_digits_are_scikit_learns():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    reference = sklearn_datasets.load_digits()
    train = load_dataset("digits", "train", spec=SplitSpec(val_fraction=0.0))
    test = load_dataset("digits", "test")
    assert len(train) + len(test) == 1797 and len(test) == 359
    images = torch.cat([train.images, test.images]).float()
    labels = torch.cat([train.labels, test.labels])
    expected = torch.from_numpy(reference.images * 255 / 16).round()
    # the same multiset of (image, label) pairs: match each image to its original by sorting keys
    ours = sorted(zip(images.flatten(1).tolist(), labels.tolist()))
    theirs = sorted(zip(expected.flatten(1).tolist(), reference.target.tolist()))
    assert ours == theirs
    assert train.classes == [str(d) for d in range(10)]


def test_validation_split_is_held_out_of_train():
    spec = SplitSpec(val_fraction=0.25, seed=3)
    full = load_dataset("digits", "train", spec=SplitSpec(val_fraction=0.0))
    train, val = load_dataset("digits", "train", spec=spec), load_dataset("digits", "val", spec=spec)
    assert len(train) + len(val) == len(full) and len(val) == round(0.25 * len(full))
    rows = lambda d: {tuple(x) for x in d.images.flatten(1).tolist()}  # noqa: E731
    assert rows(train) | rows(val) == rows(full)
    with pytest.raises(DatasetError, match="no validation split"):
        load_dataset("digits", "val", spec=SplitSpec(val_fraction=0.0))


def test_mnist_from_shared_data(shared_data):
    test = load_dataset("mnist", "test", shared_data)
    assert len(test) == 10000 and tuple(test.images.shape[1:]) == (1, 28, 28)
    counts = torch.bincount(test.labels).tolist()
    assert counts == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # the README's class counts
    fashion = load_dataset("fashion-mnist", "train", shared_data, SplitSpec(val_fraction=0.1))
    assert len(fashion) == 54000 and fashion.classes[0] == "T-shirt/top"


def test_missing_torchvision_dataset_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("torchvision.datasets.MNIST.download", lambda self: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(DatasetError, match=f"not found under {tmp_path}"):
        load_dataset("mnist", "train", tmp_path)


def test_npz_arrays_with_classes(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "set.npz"
    np.savez(path, x_train=rng.integers(0, 256, (40, 6, 6, 3), dtype=np.uint8), y_train=np.arange(40) % 4,
             x_test=rng.integers(0, 256, (8, 6, 6, 3), dtype=np.uint8), y_test=np.arange(8) % 4,
             classes=np.array(["a", "b", "c", "d"]))
    train = load_dataset(f"npz:{path}", "train", spec=SplitSpec(val_fraction=0.25))
    test = load_dataset(f"npz:{path}", "test")
    assert len(train) == 30 and len(test) == 8 and train.classes == ["a", "b", "c", "d"]
    image, label = test[3]
    assert image.shape == (3, 6, 6) and label == 3
    assert torch.equal(image, torch.from_numpy(np.load(path)["x_test"][3]).permute(2, 0, 1))
    with pytest.raises(DatasetError, match="needs arrays x_val"):
        np.savez(path, x_train=np.zeros((4, 2, 2), np.uint8), y_train=np.zeros(4), x_val=np.zeros((1, 2, 2), np.uint8))
        load_dataset(f"npz:{path}", "val")


def _folder(tmp_path):
    for name, colour in (("cat", 10), ("dog", 200)):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(np.full((5, 7, 3), colour + i, np.uint8)).save(tmp_path / name / f"{i}.png")
    return tmp_path


def test_image_folder_reads_classes_and_pixels(tmp_path):
    folder = scan_folder(_folder(tmp_path))
    assert folder.classes == ["cat", "dog"] and len(folder) == 6
    image, label = folder[4]
    assert label == 1 and image.shape == (3, 5, 7) and int(image[0, 0, 0]) == 201


def test_corrupt_and_truncated_files_are_reported_by_name(tmp_path):
    """Listing opens nothing; decoding follows ``corrupt``: fail names the file, skip replaces it in training
    (by the next readable index, the same every time) and leaves it out of evaluation."""
    root = _folder(tmp_path)
    (root / "cat" / "notes.txt").write_text("not an image")
    good = (root / "dog" / "0.png").read_bytes()
    (root / "dog" / "cut.png").write_bytes(good[: len(good) // 2])
    folder = scan_folder(root)
    assert len(folder) == 8 and [folder.path(i).name for i in (3, 7)] == ["notes.txt", "cut.png"]
    as_is = build_transform("eval", (5, 7), channels=3)
    with pytest.raises(DatasetError, match="notes.txt: not a readable image.*--corrupt skip"):
        Transformed(folder, as_is)[(3, 0)]
    training = Transformed(folder, as_is, corrupt="skip")
    image, label, skipped = training[(3, 0)]
    assert label == 1 and skipped == (str(root / "cat" / "notes.txt"),)
    assert torch.equal(image, training[(4, 0)][0]), "the next readable image stands in"
    assert training[(7, 0)][2] == (str(root / "dog" / "cut.png"),) and training[(7, 0)][1] == 0  # wraps around
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        images, labels = training.collate([training[i] for i in range(8)])
    assert len(images) == 6 and labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert "left out 2 unreadable image(s)" in str(caught[0].message)


def test_split_folders_share_one_class_list(tmp_path):
    """A class missing from test/ must not shift the labels of the classes after it."""
    for split, names in (("train", "abc"), ("test", "ac")):
        for name in names:
            (tmp_path / split / name).mkdir(parents=True)
            Image.fromarray(np.zeros((2, 2), np.uint8)).save(tmp_path / split / name / "0.png")
    test = load_dataset(f"imagefolder:{tmp_path}", "test")
    assert test.classes == ["a", "b", "c"] and test.labels.tolist() == [0, 2]
    train = load_dataset(f"imagefolder:{tmp_path}", "train", spec=SplitSpec(val_fraction=0.0))
    assert train.labels.tolist() == [0, 1, 2]
    assert split_names(f"imagefolder:{tmp_path}") == ("train", "val", "test")
    (tmp_path / "test").rename(tmp_path / "val")  # ImageNet's layout
    assert split_names(f"imagefolder:{tmp_path}") == ("train", "val")


def test_empty_dataset_and_empty_class_are_clear_errors(tmp_path):
    with pytest.raises(DatasetError, match="no class folders"):
        scan_folder(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="empty.*class folder is empty"):
        scan_folder(tmp_path)


def test_grey_images_expand_to_model_channels_and_normalise():
    image = torch.tensor([[[0, 255], [51, 102]]], dtype=torch.uint8)
    out = build_transform("eval", (2, 2), channels=3, family="google")(image)
    assert out.shape == (3, 2, 2)
    expected = image.float() / 255 * 2 - 1  # Google: mean = std = 0.5 maps [0, 1] to [-1, 1]
    for channel in out:
        torch.testing.assert_close(channel, expected[0])
    imagenet = build_transform("eval", (2, 2), channels=3, family="imagenet")(image)
    torch.testing.assert_close(imagenet[1], (image[0].float() / 255 - 0.456) / 0.224)
    with pytest.raises(ValueError, match="cannot turn a 2-channel image into 3"):
        ToChannels(3)(torch.zeros(2, 4, 4))


def test_a_finished_batch_is_each_image_normalised_into_its_row():
    """finished_batch writes every image straight into its row: the values of torchvision's ToDtype + Normalize
    (ImageNet statistics) within float rounding, and a clear error where an image of another shape would be
    broadcast."""
    from torchvision.transforms import v2
    from vitkit.data.loading import finished_batch
    from vitkit.data.transforms import Preset
    preset = build_transform("eval", (4, 4), channels=3, family="imagenet")
    images = [torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
              for i in range(3)]
    reference = v2.Compose([v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    torch.testing.assert_close(finished_batch(preset, images), reference(torch.stack(images)))
    for step in (preset, Preset(preset.per_image, torch.nn.Identity())):  # normalised here, or in a loader's worker
        with pytest.raises(DatasetError, match=r"shapes \(1, 4, 4\) and \(3, 4, 4\) in one batch"):
            finished_batch(step, [images[0], images[1][:1]])
    with pytest.raises(ValueError, match=r"out must be float32 \(3, 4, 4\)"):
        preset.per_batch(images[0], out=torch.empty(2, 3, 4, 4))  # would be filled by broadcasting


def test_a_batch_slot_is_reused_only_once_nothing_holds_its_batch():
    """A slot is taken again when its batch's storage is freed: not while a view of it lives, nor while autograd
    keeps it for a backward pass; with every slot held, a batch goes into fresh memory."""
    from vitkit.data.slots import BatchSlots
    slots, shape = BatchSlots(count=2), (1, 3, 4, 4)

    def lent(shape=shape):
        slot = slots.take(shape)
        return None if slot is None else slot.lend()
    first = lent()
    row, address = first[0], first.data_ptr()
    del first
    other = lent()
    assert other.data_ptr() != address  # the view still holds it
    assert lent() is None  # both slots held
    del row, other
    batch = lent()
    assert batch.data_ptr() == address  # free again, reused
    loss = torch.nn.Conv2d(3, 2, 2)(batch.fill_(1.0)).sum()  # the convolution saves its input for backward
    del batch
    kept = lent()
    assert kept.data_ptr() != address and lent() is None
    loss.backward()
    del loss
    small = lent((1, 3, 2, 4))
    assert small.data_ptr() == address  # a smaller batch takes the front of a slot
    del kept, small
    assert lent((2, 3, 4, 4)).data_ptr() != address  # a larger one: new slots
    slots = BatchSlots(count=2)  # a slot made while a small batch was held must still take a full one
    full = lent((4, 3))
    short = lent((2, 3))
    del full
    full = lent((4, 3))
    del short
    assert lent((4, 3)).shape == (4, 3) and full.shape == (4, 3)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert BatchSlots().take((1, 2)).images.dtype == torch.float32  # what ToModelInput writes
    finally:
        torch.set_default_dtype(default)


def test_workers_batches_in_their_slots_are_the_in_process_ones_and_never_written_over(monkeypatch):
    """Two workers finishing batches in shared slots give the batches the main process makes alone, even when
    every batch of the pass is kept (more than the slots: the rest in fresh memory); dropped batches' slots are
    taken again, and the main process maps each slot once a pass, not once a batch."""
    from vitkit.data.pipelines import training_loader
    from vitkit.data.slots import SLOTS
    images = torch.randint(0, 256, (48, 3, 12, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    dataset = ArrayDataset(images, torch.arange(48) % 3, ["a", "b", "c"], "toy")
    preset = build_transform("pretrain", (8, 8), 3)

    def batches(workers: int, steps: int = 24):
        return training_loader(dataset, preset, global_batch=4, total_steps=steps, start_step=0, seed=5,
                               num_workers=workers)
    alone = [images.clone() for images, _, _ in batches(0)]
    kept = [images for images, _, _ in batches(2)]
    assert len(kept) == 24 > 2 * SLOTS
    for ours, reference in zip(kept, alone):
        assert torch.equal(ours, reference)
    mapped, map_shared = [], torch.UntypedStorage._new_shared_fd_cpu  # what unpickling a worker's storage calls
    monkeypatch.setattr(torch.UntypedStorage, "_new_shared_fd_cpu",
                        classmethod(lambda cls, fd, size: mapped.append(size) or map_shared(fd, size)))
    for step, (images, _, _) in enumerate(batches(2)):
        assert torch.equal(images, alone[step])
    slot_bytes = 4 * 3 * 8 * 8 * 4
    assert 0 < mapped.count(slot_bytes) <= 2 * SLOTS < 24


def test_a_loader_left_in_mid_pass_says_nothing_as_the_interpreter_exits():
    """A pass abandoned at exit closes its generator during the interpreter's teardown: letting its slots go then
    must not call into a torch already torn down (it printed 'Exception ignored ... NoneType')."""
    import subprocess
    import sys
    from launch import child_env
    code = ("from vitkit.data import build_transform, load_dataset; from vitkit.data.pipelines import training_loader;"
            "loader = training_loader(load_dataset('digits', 'train'), build_transform('pretrain', (8, 8), 1), "
            "global_batch=8, total_steps=5, start_step=0, seed=0); passing = iter(loader); next(passing)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]


def test_the_public_loaders_give_tensors_whatever_their_workers():
    """Slot batches are what the run's loaders lend (pipelines.Arrived); ``eval_loader`` and ``step_loader`` over a
    plain ``Transformed`` give tensors from a worker too."""
    from vitkit.data import eval_loader
    data = Transformed(load_dataset("digits", "train"), build_transform("eval", (8, 8), 1))
    images, labels = next(iter(eval_loader(data, 16, num_workers=1)))
    assert type(images) is torch.Tensor and images.shape == (16, 1, 8, 8) and labels.shape == (16,)


def test_pretrain_preset_is_random_and_seeded_per_sample():
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    dataset = [(images[i], i) for i in range(4)]
    transform = build_transform("pretrain", (8, 8), 3, aug_level="light2")
    data = Transformed(dataset, transform, seed=7)
    first, again, other_epoch = data[(2, 0)][0], data[(2, 0)][0], data[(2, 1)][0]
    assert first.shape == (3, 8, 8)
    assert torch.equal(first, again) and not torch.equal(first, other_epoch)
    state = torch.get_rng_state()
    data[(1, 0)]
    assert torch.equal(state, torch.get_rng_state()), "seeded transforms must not consume the global RNG"


def test_sampler_epochs_ranks_accumulation_and_resume():
    full = list(StepSampler(20, 8, total_steps=6, seed=1, accum_steps=2))
    assert len(full) == 12 and all(len(mb) == 4 for mb in full)
    steps_per_epoch = 20 // 8
    for epoch in range(3):  # each epoch draws distinct images, in a seed-fixed order
        keys = [k for mb in full[epoch * 4:(epoch + 1) * 4] for k in mb]
        assert {e for _, e in keys} == {epoch} and len({i for i, _ in keys}) == 8 * steps_per_epoch
    resumed = list(StepSampler(20, 8, total_steps=6, seed=1, accum_steps=2, start_step=4))
    assert resumed == full[8:]
    ranks = [list(StepSampler(20, 8, total_steps=6, seed=1, rank=r, world_size=2)) for r in range(2)]
    single = list(StepSampler(20, 8, total_steps=6, seed=1))
    assert [a + b for a, b in zip(*ranks)] == single
    with pytest.raises(ValueError, match="multiple of world size 3"):
        StepSampler(20, 8, total_steps=1, world_size=3)


def test_normalisation_statistics_fit_the_channel_count():
    assert normalization("google", 4) == ((0.5,) * 4, (0.5,) * 4)  # the same for every channel
    (mean,), (std,) = normalization("imagenet", 1)  # grey: the mean over RGB
    assert mean == pytest.approx((0.485 + 0.456 + 0.406) / 3) and std == pytest.approx((0.229 + 0.224 + 0.225) / 3)
    with pytest.raises(ValueError, match="'imagenet' normalisation has statistics for 1 or 3 channels, not 4"):
        normalization("imagenet", 4)


def test_load_splits_lists_a_flat_folder_once_and_gives_load_datasets_splits(tmp_path, monkeypatch):
    import vitkit.data.sources.imagefolder as imagefolder

    root, spec = _folder(tmp_path), SplitSpec(0.2, seed=3)
    alone = {split: load_dataset(f"imagefolder:{root}", split, spec=spec) for split in ("train", "val", "test")}
    listed = []
    real = imagefolder._list_folder
    monkeypatch.setattr(imagefolder, "_list_folder", lambda *args: listed.append(args[0]) or real(*args))
    together = load_splits(f"imagefolder:{root}", ("train", "val", "test"), spec=spec)
    assert listed == [root]  # once, not once per split
    for split in together:
        assert list(together[split].files) == list(alone[split].files)
        assert torch.equal(together[split].labels, alone[split].labels)
    load_dataset(f"imagefolder:{root}", "train", spec=spec)
    assert len(listed) == 2  # outside load_splits nothing is kept: a folder that changes is listed afresh


def test_a_source_registered_under_a_prefix_is_read_by_every_entry_point(monkeypatch):
    """A source that writes only ``open`` (two splits of its own) is reached through load_dataset, load_splits,
    split_names, default_split and dataset_info by its prefix alone; a split it does not have is refused."""
    from vitkit.data import dataset_info, default_split, load_splits
    from vitkit.data.sources import SOURCES, Source

    class Toy(Source):
        known_splits = ("train", "test")

        def open(self, path, split, options):
            labels = {"train": [0, 0, 1], "test": [1, 0]}[split]
            images = torch.full((len(labels), 1, 2, 2), len(path), dtype=torch.uint8)
            return ArrayDataset(images, torch.tensor(labels), ["a", "b"], f"{path}[{split}]")

    monkeypatch.setitem(SOURCES, "toy:", Toy())
    assert split_names("toy:abc") == ("train", "test") and default_split("toy:abc") == "test"
    train = load_dataset("toy:abc", "train")
    assert train.name == "abc[train]" and int(train[0][0].max()) == 3 and train.labels.tolist() == [0, 0, 1]
    assert list(load_splits("toy:abc", ("test", "train"))) == ["test", "train"]
    assert dataset_info("toy:abc") == {"classes": ["a", "b"], "splits": {
        "train": {"images": 3, "per_class": {"a": 2, "b": 1}}, "test": {"images": 2, "per_class": {"a": 1, "b": 1}}}}
    with pytest.raises(ConfigError, match=r"^toy:abc has no val split; expected one of train, test, all$"):
        load_dataset("toy:abc", "val")


@pytest.mark.parametrize("name, home", [("ArrayDataset", "vitkit.data.map_style"), ("read_image", "vitkit.data.images"),
                                        ("scan_folder", "vitkit.data.sources.imagefolder"),
                                        ("default_data_dir", "vitkit.data.sources.named")])
def test_names_that_moved_out_of_datasets_still_read_there_with_a_warning(name, home):
    import importlib

    from vitkit.data import datasets
    with pytest.warns(DeprecationWarning, match=rf"vitkit\.data\.datasets\.{name} is deprecated; use {home}\.{name}"):
        moved = getattr(datasets, name)
    assert moved is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError):
        datasets.no_such_name
