"""WebDataset shards: index, streams split across ranks and workers, exact resume, bad input."""

import collections
import warnings

import pytest
import torch
import torchvision
import webdataset as wds
from data_helpers import mnist_folder, number_of, numbered_image, numbered_shards, png
from torch.utils.data import DataLoader

from vitkit.data import (DatasetError, build_transform, default_num_workers, evaluation_loader, load_dataset,
                         training_loader)
from vitkit.data.convert import parse_size, write_webdataset
from vitkit.data.shards import TrainingStream, split_by_slot
from vitkit.data.survey import AS_IS, describe
from vitkit.errors import ConfigError


def numbers(batches) -> list[int]:
    return [number_of(image.permute(1, 2, 0)) for images, *_ in batches for image in images]


def test_folder_to_shards_keeps_every_mnist_image_and_label(tmp_path, shared_data):
    """Convert real MNIST images (a folder of PNGs) to several shards; every image and label read back
    from the shards equals torchvision's MNIST item."""
    folder = mnist_folder(shared_data, tmp_path / "folder", train=120, test=80)
    splits = {split: load_dataset(f"imagefolder:{folder}", split) for split in ("train", "test")}
    written = write_webdataset(splits, tmp_path / "shards", parse_size("20KB"))
    assert written == {"train": 108, "test": 80}  # 10% of train held out for validation, not converted
    shards = load_dataset(f"webdataset:{tmp_path / 'shards'}", "test")
    assert len(shards.shards) > 1 and len(shards) == 80 and shards.classes == [str(d) for d in range(10)]
    reference = torchvision.datasets.MNIST(shared_data, train=False, download=False)
    expected = collections.Counter((reference.data[i].numpy().tobytes(), int(reference.targets[i])) for i in range(80))
    loader = evaluation_loader(shards, AS_IS, batch_size=16, num_workers=2)
    got = collections.Counter((image[0].numpy().tobytes(), int(label)) for images, labels in loader
                              for image, label in zip(images, labels))
    assert got == expected
    info = describe({"test": shards})
    assert info["splits"]["test"]["per_class"] == {str(d): n for d, n in sorted(collections.Counter(
        reference.targets[:80].tolist()).items())}


def test_slots_share_out_the_shards_of_every_epoch(tmp_path):
    all_numbers = numbered_shards(tmp_path, "train", [5, 7, 3, 6, 4, 5])
    split = load_dataset(f"webdataset:{tmp_path}", "train")
    for epoch in range(3):
        seen = []
        for rank in range(2):
            stream = TrainingStream(split, AS_IS, seed=1, micro_batch=2, start_micro_batch=0, rank=rank, world_size=2,
                                    num_workers=3)
            for worker in range(3):
                seen += [number_of(split.decode(shard, key, payload)[0].permute(1, 2, 0))
                         for _, shard, key, payload in stream.epoch(epoch, rank * 3 + worker, 6)]
        assert sorted(seen) == all_numbers, "every sample once per epoch"
    orders = [split_by_slot(split.shards, 0, 1, seed=1, epoch=e) for e in range(3)]
    assert orders[0] != orders[1] or orders[1] != orders[2], "shards are shuffled per epoch"
    with pytest.raises(DatasetError, match="6 shard.* cannot feed 2 rank.* x 4 worker"):
        TrainingStream(split, AS_IS, seed=1, micro_batch=2, start_micro_batch=0, world_size=2, num_workers=4)


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_resumes_at_any_step_with_the_same_samples(tmp_path, workers):
    numbered_shards(tmp_path, "train", [9, 11, 7, 10])
    split = load_dataset(f"webdataset:{tmp_path}", "train")

    def run(start):
        loader = training_loader(split, AS_IS, global_batch=12, total_steps=10, start_step=start, seed=3,
                                 accum_steps=2, rank=1, world_size=2, num_workers=workers)
        return numbers(batch for _, batch in zip(range((10 - start) * 2), loader))
    straight = run(0)
    assert len(straight) == 60 and set(straight) <= set(range(37))
    for start in (1, 4, 7):  # past the first epoch of some slots too
        assert run(start) == straight[start * 6:]
    odd = training_loader(split, AS_IS, global_batch=6, total_steps=10, start_step=3, seed=3, rank=1, world_size=2,
                          num_workers=workers)  # one micro-batch a step: resumed at an odd one
    assert numbers(batch for _, batch in zip(range(7), odd)) == straight[9:30]  # the same micro-batches of 3


def test_default_workers_fit_the_cores_and_the_shards(tmp_path, monkeypatch):
    numbered_shards(tmp_path, "train", [2, 2, 2])
    split = load_dataset(f"webdataset:{tmp_path}", "train")
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert default_num_workers(split) == 3 and default_num_workers(split, local_ranks=8, world_size=2) == 1
    assert default_num_workers(load_dataset("digits", "train")) == 0


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # more workers than this machine's cores
def test_eval_counts_every_image_once_whatever_the_workers(tmp_path):
    expected = numbered_shards(tmp_path, "test", [5, 1, 8])
    split = load_dataset(f"webdataset:{tmp_path}", "test")
    for workers in (0, 2, 5):
        assert sorted(numbers(evaluation_loader(split, AS_IS, batch_size=4, num_workers=workers))) == expected


def test_bad_shards_name_the_shard_and_the_key(tmp_path):
    numbered_shards(tmp_path / "cut", "train", [6])
    whole = (tmp_path / "cut" / "train-000000.tar").read_bytes()
    (tmp_path / "cut" / "train-000000.tar").write_bytes(whole[:15000])  # in the 4th sample (2 kB a member)
    with pytest.raises(DatasetError, match=r"train-000000.tar: truncated in sample train000003"):
        load_dataset(f"webdataset:{tmp_path / 'cut'}", "train")
    with pytest.warns(UserWarning, match="1 unusable sample"):
        cut = load_dataset(f"webdataset:{tmp_path / 'cut'}", "train", corrupt="skip")
    assert len(cut) == 3

    root = tmp_path / "labels"
    numbered_shards(root, "train", [3])
    (root / "classes.txt").write_text("a\nb\nc\nd\n")
    with wds.TarWriter(str(root / "train-000001.tar")) as sink:
        sink.write({"__key__": "nolabel", "png": b"x"})
        sink.write({"__key__": "big", "png": b"x", "cls": "7"})
    with pytest.raises(DatasetError, match="train-000001.tar: sample nolabel: no .cls label"):
        load_dataset(f"webdataset:{root}", "train")
    with pytest.warns(UserWarning, match="2 unusable.*label 7 out of range 0..3"):
        loose = load_dataset(f"webdataset:{root}", "train", corrupt="skip")
    # in training both stand-ins come from their shard's first usable sample... of which there is none
    stream = training_loader(loose, AS_IS, global_batch=5, total_steps=1, start_step=0, seed=0, corrupt="skip")
    with pytest.raises(DatasetError, match="train-000001.tar: no readable sample to stand in for"):
        next(iter(stream))

    with pytest.raises(DatasetError, match=r"2 of 2 shard\(s\) not found, e.g. .*none-000000.tar"):
        load_dataset(f"webdataset:{tmp_path}/none-{{000000..000001}}.tar", "train")
    with pytest.raises(DatasetError, match="no val shards"):
        load_dataset(f"webdataset:{root}", "val")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no shards"):
        load_dataset(f"webdataset:{tmp_path / 'empty'}", "train")


def test_brace_pattern_gives_one_split(tmp_path):
    numbered_shards(tmp_path, "in21k-train", [3, 4, 5])
    split = load_dataset(f"webdataset:{tmp_path}/in21k-train-{{000000..000001}}.tar", "train")
    assert [s.size for s in split.shards] == [3, 4] and len(split) == 7


def test_skipped_samples_are_replaced_from_their_shard(tmp_path):
    numbered_shards(tmp_path, "train", [4, 4])
    with wds.TarWriter(str(tmp_path / "train-000002.tar")) as sink:
        sink.write({"__key__": "broken", "png": b"not a png", "cls": "1"})
        sink.write({"__key__": "fine", "png": png(numbered_image(99)), "cls": "3"})
    split = load_dataset(f"webdataset:{tmp_path}", "train")
    with pytest.raises(DatasetError, match="train-000002.tar: sample broken"):
        list(zip(range(10), training_loader(split, AS_IS, global_batch=2, total_steps=5, start_step=0, seed=0)))
    loader = training_loader(split, AS_IS, global_batch=2, total_steps=5, start_step=0, seed=0, corrupt="skip")
    batches = list(zip(range(5), loader))
    replaced = [names for _, (_, _, names) in batches if names]
    assert replaced == [[f"{tmp_path}/train-000002.tar:broken"]]
    assert numbers(batch for _, batch in batches).count(99) == 2, "the stand-in is the shard's readable sample"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluated = numbers(evaluation_loader(split, AS_IS, batch_size=3, corrupt="skip"))
    assert sorted(evaluated) == [*range(8), 99] and "left out 1 unreadable image" in str(caught[0].message)


def test_shard_sizes_parse():
    assert parse_size("256MB") == 256_000_000 and parse_size("1GiB") == 2**30 and parse_size("4096") == 4096
    with pytest.raises(ValueError, match="expected a size such as 256MB"):
        parse_size("lots")


def test_raw_loader_batches_are_dataloader_batches(tmp_path):
    """The stream under a plain DataLoader yields (images, labels, skipped names)."""
    numbered_shards(tmp_path, "train", [4, 4])
    split = load_dataset(f"webdataset:{tmp_path}", "train")
    stream = TrainingStream(split, AS_IS, seed=0, micro_batch=2, start_micro_batch=0)
    images, labels, skipped = next(iter(DataLoader(stream, batch_size=2, collate_fn=stream.collate_training)))
    assert images.shape == (2, 3, 4, 4) and labels.dtype == torch.long and skipped == []



@pytest.mark.parametrize("name", ["digits", "shards"])
def test_workers_finish_cpu_batches_in_slots_and_send_uint8_for_an_accelerator(tmp_path, name):
    """For the CPU, two workers send finished float batches in their slots; for an accelerator they send uint8
    images, which the step left for the batch's arrival converts and normalises to [-1, 1] (Google's mean =
    std = 0.5): the same values either way."""
    from vitkit.data.pipelines import for_workers
    from vitkit.data.slots import SlotBatch
    numbered_shards(tmp_path, "train", [6, 6, 6, 6])
    dataset = load_dataset(f"webdataset:{tmp_path}" if name == "shards" else "digits", "train")
    preset = build_transform("pretrain", (8, 8), 3, "google")

    def loader(preset):
        return training_loader(dataset, preset, global_batch=4, total_steps=3, start_step=0, seed=0, num_workers=2)
    on_cpu = loader(preset)
    sent = [images for _, (images, _, _) in zip(range(3), on_cpu.loader)]  # a stream has no end: 3 steps
    assert all(isinstance(batch, SlotBatch) and batch.images.dtype == torch.float32 for batch in sent)
    finished = [images for _, (images, _, _) in zip(range(3), on_cpu)]
    in_workers, on_arrival = for_workers(preset, torch.device("cuda"))  # the split only: no accelerator needed
    uint8 = [images for _, (images, _, _) in zip(range(3), loader(in_workers))]
    assert len(uint8) == len(finished) == 3 and all(images.dtype == torch.uint8 for images in uint8)
    for pixels, batch in zip(uint8, finished):
        assert torch.equal(on_arrival(pixels), batch)
        torch.testing.assert_close(batch, (pixels.float() / 255 - 0.5) / 0.5)


@pytest.mark.parametrize("content, expected", [
    ("folder", "not a readable class list .*Is a directory"),
    (b"", "names no class"),
])
def test_a_class_list_that_is_not_one_is_named(tmp_path, content, expected):
    numbered_shards(tmp_path, "train", [3])
    if content == "folder":
        (tmp_path / "classes.txt").mkdir()
    else:
        (tmp_path / "classes.txt").write_bytes(content)
    with pytest.raises(DatasetError, match=rf"classes.txt: {expected}"):
        load_dataset(f"webdataset:{tmp_path}", "train")


def test_a_class_list_another_tool_wrote_keeps_its_bytes_and_backslashes(tmp_path):
    """Bytes that are not UTF-8 become surrogate escapes (as a folder of that name lists), a CRLF ends a line,
    a backslash that starts no escape stays."""
    numbered_shards(tmp_path, "train", [3])
    (tmp_path / "classes.txt").write_bytes(b"ant\xff\xfe\r\nC:\\data\\q\nbee\\x\n")
    assert load_dataset(f"webdataset:{tmp_path}", "train").classes == ["ant\udcff\udcfe", "C:\\data\\q", "bee\\x"]


def test_labels_no_class_count_can_hold_are_refused_not_allocated(tmp_path):
    """Without classes.txt the classes are 0..largest label: a damaged .cls must not ask for millions."""
    numbered_shards(tmp_path, "train", [3])
    with wds.TarWriter(str(tmp_path / "train-000001.tar")) as sink:
        sink.write({"__key__": "huge", "png": png(numbered_image(1)), "cls": "2000000"})
    with pytest.raises(DatasetError, match="train-000001.tar: sample huge: label 2000000 out of range 0..2"):
        load_dataset(f"webdataset:{tmp_path}", "train")
    for tar in tmp_path.glob("*.tar"):
        tar.unlink()
    with wds.TarWriter(str(tmp_path / "train-000000.tar")) as sink:
        sink.write({"__key__": "negative", "png": png(numbered_image(1)), "cls": "-1"})
    with pytest.raises(DatasetError, match="sample negative: label -1 is not a class index"):
        load_dataset(f"webdataset:{tmp_path}", "train")


def test_unusable_samples_of_a_shard_cost_one_search_for_their_stand_in(tmp_path):
    numbered_shards(tmp_path, "train", [4])
    with wds.TarWriter(str(tmp_path / "train-000001.tar")) as sink:
        for number in range(4):
            sink.write({"__key__": f"broken{number}", "png": b"not a png", "cls": "1"})
        sink.write({"__key__": "fine", "png": png(numbered_image(99)), "cls": "3"})
    split = load_dataset(f"webdataset:{tmp_path}", "train")
    opened, read = collections.Counter(), split.read

    def counted_read(shard):
        opened[shard.path] += 1
        return read(shard)

    split.read = counted_read
    loader = training_loader(split, AS_IS, global_batch=9, total_steps=1, start_step=0, seed=0, corrupt="skip")
    batch = next(iter(loader))
    assert sorted(numbers([batch])) == [*range(4), *[99] * 5] and len(batch[2]) == 4
    assert opened[str(tmp_path / "train-000001.tar")] == 2, "the stream's pass, and one search for a stand-in"


def test_data_info_reads_the_index_not_the_images(tmp_path):
    """`vitkit data info` counts from tar headers and .cls members: shards of undecodable images describe
    fully, while decoding them (data verify) names every one."""
    from vitkit.data.survey import unreadable_images
    with wds.TarWriter(str(tmp_path / "train-000000.tar")) as sink:
        for number in range(6):
            sink.write({"__key__": f"garbled{number}", "jpg": b"\xff\xd8 not a jpeg", "cls": str(number % 2)})
    split = load_dataset(f"webdataset:{tmp_path}", "train")
    assert describe({"train": split})["splits"]["train"]["per_class"] == {"0": 3, "1": 3}
    assert len(unreadable_images(split)) == 6


def test_repeated_augmentation_needs_random_access(tmp_path):
    numbered_shards(tmp_path, "train", [4, 4])
    split = load_dataset(f"webdataset:{tmp_path}", "train")
    with pytest.raises(ConfigError, match="repeated augmentation needs a dataset with random access"):
        training_loader(split, AS_IS, global_batch=2, total_steps=1, start_step=0, seed=0, repeats=3)
