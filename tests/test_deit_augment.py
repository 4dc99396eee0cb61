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


def test_inception_crop_equals_torchvisions_crop_and_flip_draw_for_draw():
    """The pretrain preset's crop gives what v2.RandomResizedCrop then v2.RandomHorizontalFlip give from the same
    generator state: the same pixels, and the generator left in the same state."""
    from torchvision.transforms import v2

    from vitkit.data.transforms import InceptionCrop

    generator = torch.Generator().manual_seed(1)
    cases = [(32, 32, (32, 32), (0.35, 1.0), True), (40, 24, (16, 20), (0.08, 1.0), True),
             (7, 50, (32, 32), (0.5, 0.9), False), (224, 300, (224, 224), (0.08, 1.0), True)]
    for height, width, size, scale, flip in cases:
        image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
        ours = InceptionCrop(size, scale, flip=0.5 if flip else 0.0)
        theirs = v2.Compose([v2.RandomResizedCrop(list(size), scale=scale, antialias=True),
                             *([v2.RandomHorizontalFlip()] if flip else [])])
        for seed in range(20):
            torch.manual_seed(seed)
            expected, after = theirs(image), torch.rand(())
            torch.manual_seed(seed)
            assert torch.equal(ours(image), expected), (height, width, size, seed)
            assert torch.rand(()) == after
