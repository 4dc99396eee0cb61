"""Evaluation metrics against scikit-learn, the confusion figure, predictions and the eval/predict CLI."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.evaluate import confusion_figure, evaluate, predict

metrics = pytest.importorskip("sklearn.metrics")


class FixedLogits(torch.nn.Module):
    """A 'model' that returns the logits stored for each image id (image = its id as a 1x1 tensor)."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, images):
        return self.logits[images.flatten().long()]


def test_top1_top5_per_class_and_confusion_match_sklearn():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 7, generator=generator)
    labels = torch.randint(0, 7, (200,), generator=generator)
    logits[labels < 3, 0] += 2.0  # some structure, so that the metrics are not all near chance
    loader = [(torch.arange(i, i + 50).float()[:, None, None, None], labels[i:i + 50]) for i in range(0, 200, 50)]
    result = evaluate(FixedLogits(logits), loader, num_classes=7)
    predicted = logits.argmax(1).numpy()
    assert result.top1 == pytest.approx(metrics.accuracy_score(labels.numpy(), predicted))
    assert result.top5 == pytest.approx(metrics.top_k_accuracy_score(labels.numpy(), logits.numpy(), k=5))
    expected = metrics.confusion_matrix(labels.numpy(), predicted, labels=list(range(7)))
    assert np.array_equal(result.confusion.numpy(), expected)
    np.testing.assert_allclose(result.per_class.numpy(), expected.diagonal() / expected.sum(1))
    assert result.loss == pytest.approx(metrics.log_loss(labels.numpy(), logits.softmax(1).numpy()), rel=1e-5)


def test_confusion_figure_is_a_png(tmp_path):
    path = confusion_figure(torch.tensor([[5, 1], [0, 4]]), ["cat", "dog"], tmp_path / "c.png", "test")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 100


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """A briefly trained digits model (the default recipe, shortened)."""
    run_dir = tmp_path_factory.mktemp("run")
    assert main(["train", "--steps", "100", "--batch-size", "32", "--warmup-steps", "10", "--lr", "0.003",
                 "--model-args", '{"dim": 32, "mlp_dim": 64, "depth": 2}',
                 "--run-dir", str(run_dir), "--log-every", "50"]) == 0
    return run_dir


def test_eval_command_writes_report_and_figure(digits_model, tmp_path, capsys):
    assert main(["eval", str(digits_model / "model"), "--dataset", "digits", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "eval-test.json").read_text())
    summary = json.loads((digits_model / "summary.json").read_text())
    assert report["top1"] == pytest.approx(summary["test/accuracy"]) and report["top1"] > 0.15  # chance: 0.1
    confusion = np.array(report["confusion"])
    assert confusion.sum() == report["images"] == 359
    assert report["per_class"]["3"] == pytest.approx(confusion[3, 3] / confusion[3].sum())
    assert (tmp_path / "confusion-test.png").is_file()
    assert "top-1" in capsys.readouterr().out


def test_predict_prints_topk_labels_for_image_files(digits_model, tmp_path, capsys):
    from vitkit.data import load_dataset

    test = load_dataset("digits", "test")
    paths = []
    for index in range(3):
        path = tmp_path / f"digit{index}.png"
        Image.fromarray(test.images[index, 0].numpy()).save(path)
        paths.append(str(path))
    model = vitkit.load(digits_model / "model")
    predictions = predict(model, paths, top_k=3)
    logits = model(torch.stack([
        (test.images[i].float() / 255 - 0.5) / 0.5 for i in range(3)]))  # the Google normalisation
    for prediction, row in zip(predictions, logits.softmax(1)):
        top = row.topk(3)
        assert prediction.labels == [str(i) for i in top.indices.tolist()]
        np.testing.assert_allclose(prediction.probabilities, top.values.tolist(), rtol=1e-5)
    assert main(["predict", str(digits_model / "model"), *paths, "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith(paths[0]) and lines[0].count("%") == 2


def test_eval_refuses_a_dataset_with_other_classes(digits_model, tmp_path, capsys):
    np.savez(tmp_path / "three.npz", x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.arange(4) % 3,
             x_test=np.zeros((3, 8, 8), np.uint8), y_test=np.arange(3))
    assert main(["eval", str(digits_model / "model"), "--dataset", f"npz:{tmp_path / 'three.npz'}"]) == 2
    assert "predicts 10 classes but" in capsys.readouterr().err
