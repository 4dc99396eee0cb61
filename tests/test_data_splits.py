"""Held-out partitions kept in the cache (``data/splits.py``): drawn once, read back mapped and equal to
``torch.randperm`` of the seed; a bad entry, or no cache at all, costs only a new draw."""

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import SplitSpec, StepSampler, load_dataset
from vitkit.data import splits
from vitkit.data.splits import held_out, seeded_permutation


def reference(size: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(kept, held out) from int64 ``torch.randperm``, sorted by Python."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()
    count = round(size * fraction)
    return sorted(order[count:]), sorted(order[:count])


def as_lists(parts) -> tuple[list[int], list[int]]:
    return tuple(part.tolist() for part in parts)


def test_splits_and_epoch_orders_are_torch_randperm_of_the_seed():
    """Held-out splits and the sampler's epochs keep the order of int64 ``torch.randperm`` (what earlier
    versions drew, so a run resumed across versions sees the same images), though drawn as int32."""
    for size, seed in ((1, 0), (10, 3), (1000, 7), (100_003, 11)):
        reference_order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(seeded_permutation(size, seed).long(), reference_order)
        assert as_lists(held_out(size, 0.1, seed)) == reference(size, 0.1, seed)
    sampler = StepSampler(1000, 10, total_steps=200, seed=2)
    assert torch.equal(sampler.permutation(1).long(),
                       torch.randperm(1000, generator=torch.Generator().manual_seed(2 * 100_003 + 1)))


@pytest.mark.parametrize("size", [10, splits.CACHED_FROM_SIZE])
def test_partitions_are_read_only_and_fractions_checked(size, entries):
    """Drawn or read from the cache, a partition cannot be written to (else a write would fail on a later run
    only); a fraction outside 0..1 would give one partition drawn and another read back."""
    for _ in range(2):
        assert not any(part.flags.writeable for part in held_out(size, 0.3, 0))
    for fraction in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"between 0 and 1, not {fraction}"):
            held_out(size, fraction, 0)


@pytest.fixture
def entries(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "held-out"


def test_a_large_partition_is_drawn_once_then_read_mapped(entries):
    size = splits.CACHED_FROM_SIZE + 7
    assert as_lists(held_out(size, 0.1, 5)) == reference(size, 0.1, 5)
    assert len(list(entries.glob("*.npy"))) == 1
    again = held_out(size, 0.1, 5)
    assert all(isinstance(part, np.memmap) for part in again)
    assert as_lists(again) == reference(size, 0.1, 5) and again[0].dtype == np.int32
    assert as_lists(held_out(size, 0.25, 5)) == reference(size, 0.25, 5)  # another count: another entry
    assert as_lists(held_out(size, 0.1, 6)) == reference(size, 0.1, 6)  # another seed: another entry
    assert len(list(entries.glob("*.npy"))) == 3


DAMAGE = {
    "garbage": lambda entry, size: entry.write_bytes(b"not an array"),
    "truncated": lambda entry, size: entry.write_bytes(entry.read_bytes()[:-100]),
    "another shape": lambda entry, size: np.save(entry, np.arange(size - 1, dtype=np.int32)),
    "another type": lambda entry, size: np.save(entry, np.arange(size, dtype=np.int64)),
    "objects": lambda entry, size: np.save(entry, np.array([None] * size, dtype=object), allow_pickle=True),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_bad_entry_is_drawn_again_and_replaced(entries, damage):
    size = splits.CACHED_FROM_SIZE
    held_out(size, 0.1, 1)
    (entry,) = entries.glob("*.npy")
    DAMAGE[damage](entry, size)
    assert as_lists(held_out(size, 0.1, 1)) == reference(size, 0.1, 1)
    again = held_out(size, 0.1, 1)
    assert isinstance(again[0], np.memmap) and as_lists(again) == reference(size, 0.1, 1)


def test_without_a_cache_folder_a_partition_is_drawn_each_time(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "a-file"))
    size = splits.CACHED_FROM_SIZE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert as_lists(held_out(size, 0.1, 2)) == reference(size, 0.1, 2)


def test_splits_from_cached_partitions_are_the_drawn_ones(tmp_path, entries, monkeypatch):
    """Every partition through the cache (threshold 1): mapped rows go through a folder's splits (nested: test,
    then validation out of the rest) and an in-memory dataset's, with nothing warned."""
    root = tmp_path / "folder"
    for label in range(3):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(9):
            Image.fromarray(np.full((4, 4), 20 * label + i, np.uint8)).save(root / f"class{label}" / f"{i}.png")
    spec = SplitSpec(0.2, seed=4)

    def everything():
        folder = {split: load_dataset(f"imagefolder:{root}", split, spec=spec) for split in ("train", "val", "test")}
        digits = {split: load_dataset("digits", split, spec=spec) for split in ("train", "val")}
        return ({split: ([str(data.path(i).relative_to(root)) for i in range(len(data))], data.labels.tolist(),
                         [int(data[i][0][0, 0, 0]) for i in range(len(data))]) for split, data in folder.items()},
                {split: (data.images.sum().item(), data.labels.tolist()) for split, data in digits.items()})
    drawn = everything()
    monkeypatch.setattr(splits, "CACHED_FROM_SIZE", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns of a tensor made from a read-only (mapped) array
        written, read = everything(), everything()
    assert written == drawn and read == drawn
    assert len(list(entries.glob("*.npy"))) == 4  # folder: test, val; digits: its test, then val
    files = {split: set(names) for split, (names, _, _) in drawn[0].items()}
    assert not (files["train"] & files["val"] or files["train"] & files["test"] or files["val"] & files["test"])
    assert sum(map(len, files.values())) == 27
