"""The analyses of section 4.5 against independent references: attention written out from the raw
weights, rollout by a hand-written numpy loop and closed forms, distances by explicit loops, PCA by
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


def rollout_by_hand(attn, fusion, discard):
    """Abnar & Zuidema for one image, written as a plain numpy loop."""
    attn = attn.double().numpy()
    tokens = attn.shape[-1]
    result = np.eye(tokens)
    for layer in attn:
        fused = {"mean": layer.mean(0), "max": layer.max(0), "min": layer.min(0)}[fusion]
        flat = fused.flatten()
        flat[np.argsort(flat, kind="stable")[:int(tokens * tokens * discard)]] = 0
        fused = (flat.reshape(tokens, tokens) + np.eye(tokens)) / 2
        fused /= fused.sum(axis=1, keepdims=True)
        result = fused @ result
    return result


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard", [0.0, 0.6])
def test_rollout_of_one_image_matches_a_hand_written_loop(fusion, discard):
    attn = random_attention(4, 1, 3, 1 + 2 * 3)
    expected = rollout_by_hand(attn[:, 0], fusion, discard)
    torch.testing.assert_close(rollout_matrix(attn, fusion, discard)[0].double(), torch.from_numpy(expected),
                               atol=1e-6, rtol=1e-5)
    row = expected[0, 1:].reshape(2, 3)
    torch.testing.assert_close(attention_rollout(attn, (2, 3), fusion, discard)[0].double(),
                               torch.from_numpy(row / row.max()), atol=1e-6, rtol=1e-5)


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
