"""DeiT's data-efficient augmentations: repeated augmentation (each drawn image several times in its batch, each
copy augmented apart, the order fixed by seed and step) and random erasing."""

import collections

import torch

from vitkit.data.loading import StepSampler, Transformed
from vitkit.data.transforms import RandomErasing, build_transform


def test_repeated_augmentation_draws_a_share_of_the_images_each_several_times():
    sampler = StepSampler(10, global_batch=6, total_steps=1, seed=3, repeats=3)
    keys = sampler.keys(epoch=2)
    assert len(keys) == 10 and len(set(keys)) == 10  # as many draws as images, every copy keyed apart
    counts = collections.Counter(index for index, _ in keys)
    assert sorted(counts.values()) == [1, 3, 3, 3] and len(counts) == 4  # ceil(10 / 3) images, the last cut short
    first = [index for index, _ in keys[:3]]
    assert first == [first[0]] * 3  # the copies of an image side by side: in one batch
    assert {copy for _, copy in keys} <= {6, 7, 8}  # epoch 2's draws: keys 2 * 3 + copy
    assert StepSampler(10, 6, 1, seed=3, repeats=3).keys(2) == keys  # fixed by seed and epoch
    assert StepSampler(10, 6, 1, seed=3).keys(2) == [(i, 2) for i in sampler.permutation(2).tolist()]


def test_the_copies_of_an_image_are_augmented_apart():
    image = torch.arange(3 * 16 * 16, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(3, 16, 16)
    preset = build_transform("pretrain", (8, 8), 3, crop_scale=(0.2, 0.5))
    items = Transformed([(image, 0)], preset, seed=1)
    copies = [items[(0, 2 * 3 + copy)][0] for copy in range(3)]
    assert not torch.equal(copies[0], copies[1]) and not torch.equal(copies[1], copies[2])
    assert torch.equal(items[(0, 7)][0], copies[1])  # each copy the same whichever process draws it


def test_random_erasing_fills_one_rectangle_of_2_to_33_percent_with_noise():
    torch.manual_seed(0)
    image = torch.full((3, 40, 40), 7, dtype=torch.uint8)
    assert torch.equal(RandomErasing(0.0)(image), image)
    for _ in range(20):
        erased = RandomErasing(1.0)(image)
        changed = (erased != image).any(dim=0)
        rows, cols = changed.any(dim=1).nonzero(), changed.any(dim=0).nonzero()
        box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert 0.02 * 1600 * 0.9 <= box <= 1600 / 3 + 40  # area within the bounds (rounding to whole pixels)
        assert changed.sum() >= 0.9 * box  # the rectangle filled with noise (a pixel may draw 7 by chance)
