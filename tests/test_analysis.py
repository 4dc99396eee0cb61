"""The analyses of section 4.5 against independent references: attention written out from the raw
weights, rollout computed by hand on a two-layer example and closed forms, distances by explicit loops, PCA by
numpy's SVD, cosine similarity pair by pair."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.analysis import (attention_maps, attention_rollout, capture_attention, filter_components,
                             mean_attention_distance, patch_filters, position_similarity, position_table,
                             rollout_matrix)


def tiny(**overrides):
    base = dict(image_size=32, patch_size=8, dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=5)
    model = vitkit.create_model(vitkit.ViTConfig(**{**base, **overrides})).eval()
    with torch.no_grad():  # sharper attention than the initialisation gives
        for block in model.blocks:
            block.attn.qkv.weight.mul_(4)
    return model


def explicit_attention(model, images):
    """softmax(q k^T / sqrt(d)) per block, from the raw qkv weights, advancing z with the fused blocks."""
    z, _ = model.embed(images)
    heads, width = model.config.num_heads, model.config.dim // model.config.num_heads
    maps = []
    for block in model.blocks:
        x = F.layer_norm(z, (model.config.dim,), block.norm1.weight, block.norm1.bias, model.config.ln_eps)
        q, k, _ = (x @ block.attn.qkv.weight.T + block.attn.qkv.bias).chunk(3, dim=-1)
        split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, width).transpose(1, 2)  # noqa: E731
        maps.append(torch.softmax(split(q) @ split(k).transpose(-1, -2) / math.sqrt(width), dim=-1))
        z = block(z)
    return torch.stack(maps)


@pytest.mark.parametrize("overrides,size", [
    (dict(), (32, 32)),
    (dict(pool="gap", class_token=False, pos_embed="sincos-2d"), (24, 40)),
    (dict(pos_embed="learned-2d"), (16, 48)),
])
def test_attention_maps_equal_explicit_softmax_from_the_weights(overrides, size):
    model = tiny(**overrides)
    images = torch.randn(3, 3, *size)
    logits = model(images)
    with torch.no_grad():
        expected = explicit_attention(model, images)
    maps, grid = capture_attention(model, images)
    assert grid == (size[0] // 8, size[1] // 8)
    assert maps.shape == (3, 3, 4, expected.shape[-1], expected.shape[-1])
    torch.testing.assert_close(maps, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    torch.testing.assert_close(attention_maps(model, images, layers=[-1, 0]), expected[[2, 0]], atol=1e-5, rtol=1e-4)
    assert torch.equal(model(images), logits)  # the normal path is untouched


def test_attention_maps_reject_layers_out_of_range():
    with pytest.raises(ValueError, match=r"layers \[3\] out of range for a model with 3 blocks"):
        attention_maps(tiny(), torch.randn(1, 3, 32, 32), layers=[0, 3])


def random_attention(layers, batch, heads, tokens, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layers, batch, heads, tokens, tokens, generator=generator).mul(2).softmax(-1)


# Two layers of two heads over two tokens, rolled out by hand as Abnar & Zuidema do: per layer, fuse the heads,
# add the identity for the residual, (A + I) / 2, renormalise the rows; multiply the layers, the last on the left.
TWO_LAYERS = [[[[1, 0], [1, 0]], [[1, 0], [0, 1]]],  # layer 1: head 1, head 2
              [[[0, 1], [0, 1]], [[0.5, 0.5], [0, 1]]]]  # layer 2
ROLLED_OUT = {
    # layer 1: mean [[1, 0], [.5, .5]] -> [[1, 0], [.25, .75]]; layer 2: mean [[.25, .75], [0, 1]] -> [[.625, .375],
    # [0, 1]]; layer 2 @ layer 1 = [[.625 + .375 * .25, .375 * .75], [.25, .75]]
    "mean": [[0.71875, 0.28125], [0.25, 0.75]],
    # layer 1: max [[1, 0], [1, 1]] -> (A + I) / 2 = [[1, 0], [.5, 1]] -> rows summing to 1: [[1, 0], [1/3, 2/3]];
    # layer 2: max [[.5, 1], [0, 1]] -> [[.75, .5], [0, 1]] -> [[.6, .4], [0, 1]]; product [[.6 + .4/3, .8/3], ...]
    "max": [[11 / 15, 4 / 15], [1 / 3, 2 / 3]],
    # layer 1: min [[1, 0], [0, 0]] -> [[1, 0], [0, .5]] -> the identity; layer 2: min [[0, .5], [0, 1]] ->
    # [[.5, .25], [0, 1]] -> [[2/3, 1/3], [0, 1]], the product
    "min": [[2 / 3, 1 / 3], [0, 1]],
}


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_rollout_of_two_layers_matches_the_hand_computed_one(fusion):
    attn = torch.tensor(TWO_LAYERS)[:, None]  # (layers, images, heads, tokens, tokens)
    expected = torch.tensor(ROLLED_OUT[fusion])
    torch.testing.assert_close(rollout_matrix(attn, fusion)[0], expected)
    torch.testing.assert_close(rollout_matrix([layer for layer in attn], fusion)[0], expected)  # a list of layers


def test_rollout_discards_the_weakest_share_of_each_map_before_the_residual():
    """A quarter of a 2x2 map is its one weakest entry, wherever it is (a rule row by row would drop none)."""
    attn = torch.tensor([[[0.9, 0.1], [0.3, 0.7]], [[0.2, 0.8], [0.6, 0.4]]])[:, None, None]
    # layer 1: 0.1 dropped -> (A + I) / 2 = [[.95, 0], [.15, .85]] -> [[1, 0], [.15, .85]]
    # layer 2: 0.2 dropped -> [[.5, .4], [.3, .7]] -> [[5/9, 4/9], [.3, .7]]; product [[5/9 + 4/9 * .15, 4/9 * .85],
    # [.3 + .7 * .15, .7 * .85]]
    expected = torch.tensor([[28 / 45, 17 / 45], [0.405, 0.595]])
    torch.testing.assert_close(rollout_matrix(attn, "mean", discard_ratio=0.25)[0], expected)


@pytest.mark.parametrize("readout, expected", [("mean", [31 / 33, 1]), (torch.tensor([[0.0, 1.0]]), [1 / 3, 1])])
def test_rollout_map_is_the_readout_of_the_rolled_out_rows_scaled_to_one(readout, expected):
    """Two patch tokens, no prefix: the output reads the mean of the rows of the mean rollout above, [31/64, 33/64],
    or the given weights (all on the second token: its row, [.25, .75]); the map's largest value is 1."""
    attn = torch.tensor(TWO_LAYERS)[:, None]
    maps = attention_rollout(attn, (1, 2), readout=readout)
    torch.testing.assert_close(maps, torch.tensor([[expected]]))


def test_rollout_of_a_batch_is_the_rollout_of_each_image():
    attn = random_attention(3, 4, 2, 1 + 12, seed=1)
    together = attention_rollout(attn, (3, 4), "max", 0.3)
    alone = torch.cat([attention_rollout(attn[:, i:i + 1], (3, 4), "max", 0.3) for i in range(4)])
    torch.testing.assert_close(together, alone)
    assert together.shape == (4, 3, 4)
    torch.testing.assert_close(together.amax(dim=(1, 2)), torch.ones(4))


def test_rollout_of_identity_attention_is_one_hot_per_token():
    eye = torch.eye(1 + 6).expand(5, 2, 3, 7, 7)
    joint = rollout_matrix(eye)
    torch.testing.assert_close(joint, torch.eye(7).expand(2, 7, 7))
    assert torch.equal(attention_rollout(eye, (2, 3)), torch.zeros(2, 2, 3))  # the class token sees no patch


def test_rollout_when_every_token_attends_to_one_patch_is_one_hot_there():
    grid, tokens = (2, 4), 1 + 8
    attn = torch.zeros(3, 2, 2, tokens, tokens)
    attn[:, 0, :, :, 1 + 5] = 1  # image 0: everyone looks at patch (1, 1)
    attn[:, 1, :, :, 1 + 2] = 1  # image 1: at patch (0, 2)
    maps = attention_rollout(attn, grid)
    expected = torch.zeros(2, 2, 4)
    expected[0, 1, 1] = expected[1, 0, 2] = 1
    torch.testing.assert_close(maps, expected)


@pytest.mark.parametrize("prefix,readout", [(1, "token"), (1, "mean"), (0, None)])
def test_rollout_of_uniform_attention_is_uniform(prefix, readout):
    tokens = prefix + 3 * 5
    uniform = torch.full((4, 2, 3, tokens, tokens), 1 / tokens)
    torch.testing.assert_close(attention_rollout(uniform, (3, 5), readout=readout), torch.ones(2, 3, 5))


def test_rollout_infers_square_grids_and_rejects_bad_arguments():
    assert attention_rollout(random_attention(2, 1, 2, 17)).shape == (1, 4, 4)  # class token + 4x4
    assert attention_rollout(random_attention(2, 1, 2, 9)).shape == (1, 3, 3)  # 3x3, no class token
    with pytest.raises(ValueError, match="do not form a square grid"):
        attention_rollout(random_attention(2, 1, 2, 7))
    with pytest.raises(ValueError, match="head_fusion='median'"):
        attention_rollout(random_attention(2, 1, 2, 17), head_fusion="median")
    with pytest.raises(ValueError, match=r"discard_ratio=1.0 must be in \[0, 1\)"):
        attention_rollout(random_attention(2, 1, 2, 17), discard_ratio=1.0)
    with pytest.raises(ValueError, match="needs a \\[class\\] token"):
        attention_rollout(random_attention(2, 1, 2, 9), readout="token")
    with pytest.raises(ValueError, match=r"expected attention of shape \(layers, batch, heads, tokens, tokens\)"):
        attention_rollout(torch.rand(2, 3, 9, 9))


def mean_pairwise_centre_distance(grid, patch):
    """The mean over all ordered pairs of patch centres (self-pairs included) of their distance."""
    centres = [(i * patch[0], j * patch[1]) for i in range(grid[0]) for j in range(grid[1])]
    return sum(math.dist(a, b) for a, b in itertools.product(centres, centres)) / len(centres) ** 2


@pytest.mark.parametrize("prefix", [0, 1])
def test_mean_attention_distance_of_uniform_and_identity_attention(prefix):
    grid, patch = (3, 5), (16, 8)
    tokens = prefix + 15
    uniform = torch.full((2, 4, 3, tokens, tokens), 1 / tokens)
    distance = mean_attention_distance(uniform, grid, patch)
    assert distance.shape == (2, 3)
    torch.testing.assert_close(distance, torch.full((2, 3), mean_pairwise_centre_distance(grid, patch)))
    identity = torch.eye(tokens).expand(2, 4, 3, tokens, tokens)
    assert torch.equal(mean_attention_distance(identity, grid, 16), torch.zeros(2, 3))


def test_mean_attention_distance_drops_the_class_token_and_averages_heads_separately():
    # 1x2 grid of 14 px patches: a head that attends only to the other patch sees 14 px, one that attends
    # to itself 0, whatever weight goes to the class token (renormalised away).
    attn = torch.zeros(1, 2, 2, 3, 3)
    attn[0, :, 0, 1:, 0] = 0.9
    attn[0, :, 0, 1, 2] = attn[0, :, 0, 2, 1] = 0.1
    attn[0, :, 1, :, :] = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5]])
    torch.testing.assert_close(mean_attention_distance(attn, (1, 2), 14), torch.tensor([[14.0, 0.0]]))


def test_mean_attention_distance_averages_queries_then_images():
    attn = random_attention(2, 3, 2, 1 + 4, seed=2)
    centres = [(16 * i, 16 * j) for i in range(2) for j in range(2)]
    expected = torch.zeros(2, 2, dtype=torch.float64)
    for layer, image, head in itertools.product(range(2), range(3), range(2)):
        rows = attn[layer, image, head, 1:, 1:].double()
        rows = rows / rows.sum(-1, keepdim=True)
        per_query = [sum(rows[q, k] * math.dist(centres[q], centres[k]) for k in range(4)) for q in range(4)]
        expected[layer, head] += sum(per_query) / 4 / 3
    torch.testing.assert_close(mean_attention_distance(attn, (2, 2), 16).double(), expected)


@pytest.mark.parametrize("pos_embed", ["learned", "learned-2d", "sincos-2d"])
@pytest.mark.parametrize("class_token", [True, False])
def test_position_similarity_is_the_pairwise_cosine(pos_embed, class_token):
    model = tiny(pos_embed=pos_embed, class_token=class_token, pool="token" if class_token else "gap",
                 image_size=(24, 40))
    table, grid = position_table(model)
    assert grid == (3, 5) and table.shape == (15, 32)
    similarity = position_similarity(table, grid)
    assert similarity.shape == (3, 5, 3, 5)
    pairwise = torch.tensor([[F.cosine_similarity(a, b, dim=0).item() for b in table] for a in table])
    torch.testing.assert_close(similarity.reshape(15, 15), pairwise, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.diagonal(similarity.reshape(15, 15)), torch.ones(15))


def test_position_similarity_rejects_what_it_cannot_use():
    with pytest.raises(ValueError, match=r"does not hold a 3x5 grid \(expected \(15, dim\)\)"):
        position_similarity(torch.randn(16, 8), (3, 5))
    with pytest.raises(ValueError, match="pos_embed='none'"):
        position_table(tiny(pos_embed="none"))


def test_filter_components_match_numpy_svd():
    model = tiny()
    weights = patch_filters(model)
    assert weights.shape == (32, 3, 8, 8)
    components, explained = filter_components(weights, count=28)
    flat = weights.double().numpy().reshape(32, -1)
    _, singular, vt = np.linalg.svd(flat - flat.mean(axis=0), full_matrices=False)
    ours = components.double().numpy().reshape(28, -1)
    signs = np.sign((ours * vt[:28]).sum(axis=1))
    np.testing.assert_allclose(ours, vt[:28] * signs[:, None], atol=1e-5)
    np.testing.assert_allclose(explained.numpy(), (singular ** 2 / (singular ** 2).sum())[:28], rtol=1e-5)
    assert (explained[:-1] >= explained[1:]).all()
    assert filter_components(weights, count=100)[0].shape[0] == 32  # no more than there are filters


def test_filter_components_need_pixel_filters():
    model = tiny()
    model.patch_embed.proj = torch.nn.Conv2d(7, 32, 1)  # what a hybrid's projection over CNN features looks like
    with pytest.raises(ValueError, match="no pixel patch projection"):
        patch_filters(model)
    with pytest.raises(ValueError, match=r"\(filters, channels, height, width\), got \(4, 5\)"):
        filter_components(torch.randn(4, 5))


@pytest.fixture
def one_thread():
    """A model this small trains fastest on one thread, and a shared machine is not oversubscribed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_rollout_of_a_model_trained_on_mnist_looks_at_the_digit(shared_data, one_thread):
    import torchvision

    train = torchvision.datasets.MNIST(shared_data, train=True, download=False)
    test = torchvision.datasets.MNIST(shared_data, train=False, download=False)
    images, labels = (train.data[:4096].float() / 255 - 0.5).unsqueeze(1) / 0.5, train.targets[:4096]
    probe = test.data[:256].float().unsqueeze(1) / 255
    inked = F.avg_pool2d(probe, 7)[:, 0] > 0.1  # 7x7 patches with strokes in them
    model = vitkit.create_model(vitkit.ViTConfig(image_size=28, patch_size=7, in_chans=1, dim=32, depth=2,
                                                 num_heads=2, mlp_dim=64, num_classes=10))

    def mass_on_ink():
        maps = attention_rollout(*capture_attention(model.eval(), (probe - 0.5) / 0.5))
        return ((maps / maps.sum(dim=(1, 2), keepdim=True)) * inked).sum(dim=(1, 2)).mean().item()

    before = mass_on_ink()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    for _ in range(100):
        batch = torch.randint(0, len(images), (64,))
        loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = mass_on_ink()
    area = inked.float().mean().item()  # ~0.37: what a uniform map would put on the strokes
    assert after > 1.5 * area and after > before + 0.15, (before, after, area)
