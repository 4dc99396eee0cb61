import numpy as np
import pytest
import torch

import vitkit
from vitkit.evaluate.fewshot import (accuracy, extract_features, fewshot_evaluate, linear_probe,
                                     ridge_solutions, sample_shots)

sklearn_linear = pytest.importorskip("sklearn.linear_model")


def problem(n, d, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.integers(0, classes, size=n)


@pytest.mark.parametrize("n,d", [(20, 50), (200, 16)])  # dual (n < d) and primal (n >= d) forms
def test_closed_form_equals_sklearn_ridge(n, d):
    x, labels = problem(n, d)
    targets = 2.0 * np.eye(4)[labels] - 1.0
    l2_regs = [0.01, 1.0, 100.0]
    for l2, (weights, bias) in zip(l2_regs, ridge_solutions(x, labels, 4, l2_regs)):
        reference = sklearn_linear.Ridge(alpha=l2, fit_intercept=True, solver="svd").fit(x, targets)
        np.testing.assert_allclose(weights, reference.coef_.T, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(bias, reference.intercept_, rtol=1e-7, atol=1e-9)


def test_unregularised_solution_equals_lstsq():
    x, labels = problem(300, 12)
    targets = 2.0 * np.eye(4)[labels] - 1.0
    design = np.hstack([x, np.ones((300, 1))])
    reference, *_ = np.linalg.lstsq(design, targets, rcond=None)
    weights, bias = ridge_solutions(x, labels, 4, [0.0])[0]
    np.testing.assert_allclose(np.vstack([weights, bias]), reference, rtol=1e-8, atol=1e-10)


def test_shot_sampling_and_errors():
    labels = np.repeat(np.arange(3), 7)
    picked = sample_shots(labels, 5, 3, np.random.default_rng(0))
    assert np.bincount(labels[picked]).tolist() == [5, 5, 5] and len(set(picked)) == 15
    with pytest.raises(ValueError, match="class 0 has 7 training examples, fewer than 8 shots"):
        sample_shots(labels, 8, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        ridge_solutions(np.zeros((3, 2)), np.array([0, 1, 2]), 2, [1.0])


def test_fewshot_on_separable_clusters():
    """Well separated class means: a handful of shots already classifies the test set perfectly, while
    with one shot on heavily overlapping clusters accuracy stays near chance."""
    rng = np.random.default_rng(0)
    means = rng.normal(scale=10.0, size=(5, 32))
    def draw(n, spread):
        labels = np.arange(5).repeat(n)
        return means[labels] + rng.normal(scale=spread, size=(5 * n, 32)), labels
    train, test = draw(40, 1.0), draw(20, 1.0)
    results = fewshot_evaluate(*train, *test, shots=(1, 5), seeds=(0, 1))
    assert [r.shots for r in results] == [1, 5]
    assert results[1].mean == 1.0 and results[1].std == 0.0
    best_row = results[1].l2_regs.index(results[1].selected_l2)
    assert results[1].selected == results[1].accuracies[best_row].tolist()
    noisy_train, noisy_test = draw(40, 200.0), draw(20, 200.0)
    assert fewshot_evaluate(*noisy_train, *noisy_test, shots=(1,), seeds=(0, 1, 2))[0].mean < 0.5


def test_linear_probe_and_feature_extraction():
    model = vitkit.create_model(vitkit.ViTConfig(image_size=16, patch_size=4, dim=32, depth=1, num_heads=2,
                                                 mlp_dim=64, num_classes=3, representation_size=8))
    images, labels = torch.randn(12, 3, 16, 16), torch.arange(12) % 3
    features, got = extract_features(model, [(images[:5], labels[:5]), (images[5:], labels[5:])])
    assert features.shape == (12, 8) and got.tolist() == labels.tolist()
    with torch.no_grad():
        expected = model.pre_logits(model.forward_features(images)[:, 0])
    np.testing.assert_allclose(features, expected.numpy(), rtol=1e-5, atol=1e-6)
    x, y = problem(400, 8, classes=3, seed=1)
    x[np.arange(400), y] += 4.0  # a linearly decodable signal
    test_acc, l2 = linear_probe(x[:300], y[:300], x[300:], y[300:])
    weights, bias = ridge_solutions(x[:300], y[:300], 3, [l2])[0]
    assert test_acc == accuracy(x[300:], y[300:], weights, bias) and test_acc > 0.9
