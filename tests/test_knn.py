"""k-NN classification of frozen features (DINO's protocol): a case worked by hand, scikit-learn's
brute-force classifier with DINO's vote as its weight function, and `vitkit fewshot --knn` on digits."""

import json

import numpy as np
import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.evaluate.fewshot import sample_shots
from vitkit.evaluate.knn import class_votes, knn_classify, knn_evaluate, neighbours

sklearn_neighbors = pytest.importorskip("sklearn.neighbors")

# Six training points in 2-D, their classes, and two test points whose cosine similarities to them are read off
# the coordinates (every training point but the first and last lies on the unit circle):
TRAIN = np.array([[0, 2], [0.8, 0.6], [-0.8, 0.6], [1, 0], [0.6, -0.8], [-3, -4]])
TRAIN_LABELS = np.array([0, 1, 1, 2, 0, 2])
TEST = np.array([[1, 0], [0, 1]])  # labels 2 and 0
TEST_LABELS = np.array([2, 0])


def test_a_case_worked_by_hand():
    """k = 3. Test point (1, 0): similarities 1 ([1, 0], class 2), 0.8 ([0.8, 0.6], class 1), 0.6 ([0.6, -0.8],
    class 0). Test point (0, 1): 1 ([0, 2], class 0), then 0.6 twice ([+-0.8, 0.6], class 1). Votes exp(s / T),
    shown relative to the nearest's: at T = 0.1 the nearest neighbour's class wins both times (e^0 = 1 against
    2 e^-4 = 0.037 for the second point); at T = 10 the second point goes to its two class-1 neighbours,
    2 e^(-0.04) = 1.92 against 1."""
    similarities, index = neighbours(TRAIN, TEST, 3)
    torch.testing.assert_close(similarities, torch.tensor([[1.0, 0.8, 0.6], [1.0, 0.6, 0.6]]))
    assert index[0].tolist() == [3, 1, 4] and index[1, 0] == 0 and sorted(index[1, 1:].tolist()) == [1, 2]
    labels = torch.as_tensor(TRAIN_LABELS)[index]
    cool = [[np.exp(-4), np.exp(-2), 1.0], [1.0, 2 * np.exp(-4), 0.0]]
    warm = [[np.exp(-0.04), np.exp(-0.02), 1.0], [1.0, 2 * np.exp(-0.04), 0.0]]
    for temperature, expected, top1 in ((0.1, cool, 1.0), (10.0, warm, 0.5)):
        votes = class_votes(similarities, labels, temperature, 3)
        np.testing.assert_allclose(votes.numpy(), expected, rtol=1e-6, atol=1e-12)
        assert knn_classify(TRAIN, TRAIN_LABELS, TEST, TEST_LABELS, k=3, temperature=temperature) == (top1, None)
    # exp(1 / 0.001) overflows: the votes are taken relative to the nearest neighbour's, and stay finite
    assert knn_classify(TRAIN, TRAIN_LABELS, TEST, TEST_LABELS, k=3, temperature=1e-3) == (1.0, None)


@pytest.mark.parametrize("k", [1, 5, 20])
@pytest.mark.parametrize("temperature", [0.07, 0.5])
def test_equals_scikit_learns_brute_force_classifier(k, temperature):
    """scikit-learn's cosine distance is 1 - s, so its weight exp((1 - d) / T) is DINO's exp(s / T)."""
    rng = np.random.default_rng(k)
    features, labels = rng.normal(size=(400, 16)), rng.integers(0, 7, size=400)
    features[np.arange(400), labels] += 1.5  # some signal, so that accuracy is not chance
    train, test = slice(0, 300), slice(300, 400)
    reference = sklearn_neighbors.KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute",
                                                       weights=lambda d: np.exp((1 - d) / temperature))
    reference.fit(features[train], labels[train])
    probabilities = reference.predict_proba(features[test])
    similarities, index = neighbours(features[train], features[test], k)
    votes = class_votes(similarities, torch.as_tensor(labels[train])[index], temperature, 7).numpy()
    np.testing.assert_allclose(votes / votes.sum(axis=1, keepdims=True), probabilities, rtol=1e-5, atol=1e-9)
    ranked = np.argsort(-probabilities, axis=1, kind="stable")
    expected = ((reference.predict(features[test]) == labels[test]).mean(),
                (ranked[:, :5] == labels[test, None]).any(axis=1).mean())
    assert knn_classify(features[train], labels[train], features[test], labels[test], k, temperature) == expected
    assert 0.3 < expected[0] < expected[1] < 1  # neither chance (1/7) nor trivial


def test_chunks_shot_banks_and_refusals():
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(60, 8)), np.arange(60) % 3
    whole = neighbours(features[:40], features[40:], 4)
    one_row_at_a_time = neighbours(features[:40], features[40:], 4, max_similarities=1)
    torch.testing.assert_close(one_row_at_a_time[0], whole[0])  # a vector product rounds unlike a matrix one
    assert torch.equal(one_row_at_a_time[1], whole[1])
    results = knn_evaluate(features[:40], labels[:40], features[40:], labels[40:], ks=(1, 4), shots=(2,), seeds=(0, 1))
    assert [(r.k, r.shots, r.top5) for r in results] == [(1, 2, None), (4, 2, None)]
    for result in results:  # each seed's bank: 2 training features per class, drawn as the few-shot probe draws
        banks = [sample_shots(labels[:40], 2, 3, np.random.default_rng(seed)) for seed in (0, 1)]
        assert result.per_seed == [knn_classify(features[bank], labels[bank], features[40:], labels[40:],
                                                result.k)[0] for bank in banks]
        assert (result.top1, result.std) == (np.mean(result.per_seed), np.std(result.per_seed))
    with pytest.raises(ConfigError, match="k=7 neighbours, but the memory bank holds 6 training features"):
        knn_evaluate(features[:40], labels[:40], features[40:], labels[40:], ks=(7,), shots=(2,))
    with pytest.raises(ConfigError, match="k=0: expected at least 1 neighbour"):
        knn_classify(features[:40], labels[:40], features[40:], labels[40:], k=0)
    with pytest.raises(ConfigError, match="temperature=0.0: expected a positive number"):
        knn_classify(features[:40], labels[:40], features[40:], labels[40:], temperature=0.0)
    with pytest.raises(ValueError, match=r"expected features \(N, d\) and \(M, d\) with labels"):
        knn_classify(features[:40], labels[:40], features[40:, :4], labels[40:])


def test_fewshot_command_reports_knn(tmp_path, capsys):
    """On digits: without --knn the report is as before; with it, fewshot.json holds a row per k, which for the
    whole training split is scikit-learn's accuracy on the same features."""
    from vitkit.data import SplitSpec, evaluation_loader, load_splits
    from vitkit.evaluate.fewshot import extract_features
    from vitkit.evaluate.preprocessing import checkpoint_transform

    config = vitkit.ViTConfig(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2, mlp_dim=32, in_chans=1,
                              num_classes=10)
    torch.manual_seed(0)
    vitkit.create_model(config).save(tmp_path / "ckpt")
    command = ["fewshot", str(tmp_path / "ckpt"), "--dataset", "digits", "--shots", "1", "--seeds", "1"]
    assert main([*command, "--out", str(tmp_path / "plain")]) == 0
    assert "knn" not in json.loads((tmp_path / "plain" / "fewshot.json").read_text())
    assert main(["fewshot", str(tmp_path / "ckpt"), "--dataset", "digits", "--seeds", "1", "--knn", "1", "20",
                 "--out", str(tmp_path)]) == 0
    assert "k-NN on frozen representations" in capsys.readouterr().out
    knn = json.loads((tmp_path / "fewshot.json").read_text())["knn"]
    assert knn["temperature"] == 0.07 and [(r["k"], r["shots"]) for r in knn["results"]] == [(1, None), (20, None)]
    model = vitkit.load(tmp_path / "ckpt")
    train, test = (extract_features(model, evaluation_loader(split, checkpoint_transform(config), 256))
                   for split in load_splits("digits", ("train", "test"), None, SplitSpec(0.0)).values())
    reference = sklearn_neighbors.KNeighborsClassifier(n_neighbors=20, metric="cosine", algorithm="brute",
                                                       weights=lambda d: np.exp((1 - d) / 0.07)).fit(*train)
    # one image either way: float32 similarities here, float64 there, may order a near tie differently
    assert knn["results"][1]["top1"] == pytest.approx((reference.predict(test[0]) == test[1]).mean(), abs=1 / 359)
    assert knn["results"][1]["top1"] <= knn["results"][1]["top5"] and knn["results"][1]["top1"] > 0.2  # chance: 0.1
    assert main([*command, "--knn", "11"]) == 2  # a bank of 1 shot of each of the 10 digits
    assert "k=11 neighbours, but the memory bank holds 10 training features" in capsys.readouterr().err
