"""Reports a person can read: one rollout readout rule, the model's pooling, in `vitkit analyze` and in the API;
each analysed image named with its label and the model's prediction; `predict` on folders and globs, and as
JSON; confusion matrices whose labels do not run together at 10 or 100 classes."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.analysis import (attention_maps, attention_rollout, probe_attention, readout_weights, rollout,
                             rollout_matrix)
from vitkit.cli import main
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models import Provenance

BASE = dict(image_size=(16, 24), patch_size=8, dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3)
CLASSES = ("cat", "dog", "owl")


def model_of(**overrides):
    torch.manual_seed(0)
    model = vitkit.create_model(vitkit.ViTConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():  # random, not zero, pool probe and head: a readout that ignored them would show
        for name, parameter in model.named_parameters():
            if "probe" in name or "head" in name:
                parameter.normal_(0, 1)
    return model


@torch.no_grad()
def by_hand(model, images):
    """The rollout read as the model's head reads, from the attention and the head's own computation: the
    [class] row, the mean of the patch rows, or the probe's attention (recovered as the softmax over the keys
    its own linear layers give) times the rolled-out attention."""
    seen = model.forward_intermediates(images, attention=True)
    joint = rollout_matrix(torch.stack(seen.attentions)).double()
    prefix = model.config.num_prefix_tokens
    if model.config.pool == "token":
        row = joint[:, 0]
    elif model.config.pool == "gap":
        row = joint[:, prefix:].mean(1)
    else:
        pool, heads = model.attn_pool, model.attn_pool.num_heads
        tokens = seen.features[:, prefix:]
        q = pool.q(pool.probe).reshape(heads, -1)
        k = pool.kv(tokens)[..., :model.config.dim].reshape(len(tokens), tokens.shape[1], heads, -1)
        probs = torch.stack([(k[:, :, h] @ q[h]) / q.shape[1] ** 0.5 for h in range(heads)], 1).softmax(-1)
        row = (probs.mean(1).double()[:, :, None] * joint[:, prefix:]).sum(1)
    maps = row[:, prefix:].reshape(len(images), *seen.grid).float()
    return maps / maps.amax(dim=(1, 2), keepdim=True)


POOLS = [dict(pool="token"), dict(pool="gap"), dict(pool="map"), dict(pool="map", class_token=False),
         dict(pool="gap", reg_tokens=2)]


@pytest.mark.parametrize("overrides", POOLS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_rollout_reads_out_where_the_head_reads_in_the_api_and_the_cli(overrides, tmp_path):
    model = model_of(**overrides)
    model.save(tmp_path / "ckpt")
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    assert main(["analyze", str(tmp_path / "ckpt"), "--images", str(tmp_path / "a.png"), "--out",
                 str(tmp_path / "out"), "--overlays", "0", "--filters", "2"]) == 0
    pixels = torch.from_numpy(np.array(Image.open(tmp_path / "a.png"))).permute(2, 0, 1)
    images = checkpoint_transform(model.config)(pixels)[None]
    expected = by_hand(model, images)
    torch.testing.assert_close(rollout(model, images), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "rollout.npy"), expected.numpy(), atol=1e-5)
    if model.config.pool != "map":  # the model decides the readout of its attention alone
        torch.testing.assert_close(attention_rollout(attention_maps(model, images), (2, 3), readout=model),
                                   expected, atol=1e-5, rtol=0)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rollout"]["readout"] == {"token": "token", "gap": "mean", "map": "probe"}[model.config.pool]


def test_probe_attention_is_what_the_pool_averages_with():
    """With no MLP after it (AIMv2's pool), the pool's output is its projection of the values weighted by the
    probe's attention: the probabilities reproduce it."""
    model = model_of(pool="map", pool_mlp_dim=0, class_token=False)
    features = torch.randn(2, 6, 32)
    probs = probe_attention(model, features)
    assert probs.shape == (2, 2, 6)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2))
    pool = model.attn_pool
    values = pool.kv(features)[..., 32:].reshape(2, 6, 2, 16)
    mixed = torch.einsum("bht,bthd->bhd", probs, values).reshape(2, 32)
    torch.testing.assert_close(pool.proj(mixed), pool(features), atol=1e-5, rtol=0)
    weights = readout_weights(model, features)
    torch.testing.assert_close(weights, probs.mean(1))


def test_readout_names_that_the_model_cannot_give_are_refused():
    with pytest.raises(vitkit.ConfigError, match=r"readout='probe' reads the attention pool's probe, but the model "
                                                 r"pools by pool='gap'; use readout='mean'"):
        readout_weights(model_of(pool="gap"), torch.zeros(1, 7, 32), "probe")
    with pytest.raises(vitkit.ConfigError, match=r"pass readout=readout_weights\(model, features\)"):
        attention_rollout(torch.rand(2, 1, 2, 7, 7).softmax(-1), (2, 3), readout=model_of(pool="map"))


@pytest.fixture
def labelled_tree(tmp_path):
    model = model_of()
    model.config = model.config.replace(provenance=Provenance(classes=CLASSES))
    model.save(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    for name in ("photos/cat/one.png", "photos/owl/two.png", "photos/misc/three.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)).save(tmp_path / name)
    return tmp_path


def test_analyze_names_each_image_with_its_label_and_prediction(labelled_tree):
    root = labelled_tree
    assert main(["analyze", str(root / "ckpt"), "--images", str(root / "photos"), "--out", str(root / "out"),
                 "--filters", "2"]) == 0
    model = vitkit.load(root / "ckpt").eval()
    files = [root / "photos" / name for name in ("cat/one.png", "misc/three.png", "owl/two.png")]
    images = torch.stack([checkpoint_transform(model.config)(torch.from_numpy(np.array(Image.open(f))).permute(
        2, 0, 1)) for f in files])
    with torch.no_grad():
        probabilities, top = model(images).softmax(-1).max(-1)
    summary = json.loads((root / "out" / "summary.json").read_text())
    assert summary["inputs"] == [
        {"index": i, "name": str(f), "label": label, "prediction": CLASSES[int(t)], "probability": round(float(p), 4)}
        for i, (f, label, t, p) in enumerate(zip(files, ["cat", None, "owl"], top, probabilities))]
    page = (root / "out" / "index.html").read_text()
    first = summary["inputs"][0]
    assert (f"from the [class] token of image 0 ({files[0]}), label cat, predicted {first['prediction']} "
            f"({100 * first['probability']:.0f}%).") in page
    assert f"<td class=name>{files[1]}</td><td class=name>-</td><td class=name>" in page  # no label: a dash
    assert "image 0/1" not in page and "of image 0." not in page


def test_predict_takes_folders_and_globs(labelled_tree, capsys, monkeypatch):
    monkeypatch.chdir(labelled_tree)
    assert main(["predict", "ckpt", "photos", "--top-k", "1"]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "photos/cat/one.png", "photos/misc/three.png", "photos/owl/two.png"]
    assert main(["predict", "ckpt", "photos/*/t*.png", "--top-k", "1"]) == 0  # a glob the shell left unexpanded
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == [
        "photos/misc/three.png", "photos/owl/two.png"]
    assert main(["predict", "ckpt", "photos/*.gif"]) == 1
    assert capsys.readouterr().err.strip() == "vitkit predict: error: no file matches photos/*.gif"


def test_predict_json_gives_the_probabilities_the_model_computes(labelled_tree, capsys):
    image = labelled_tree / "photos" / "cat" / "one.png"
    assert main(["predict", str(labelled_tree / "ckpt"), str(image), "--json", "--top-k", "2"]) == 0
    records = json.loads(capsys.readouterr().out)
    model = vitkit.load(labelled_tree / "ckpt").eval()
    pixels = torch.from_numpy(np.array(Image.open(image))).permute(2, 0, 1)
    with torch.no_grad():
        top = model(checkpoint_transform(model.config)(pixels)[None]).softmax(-1)[0].topk(2)
    assert records == [{"path": str(image), "image": str(image), "top_k": [
        {"label": CLASSES[i], "probability": pytest.approx(p, abs=1e-6)}
        for i, p in zip(top.indices.tolist(), top.values.tolist())]}]


CIFAR100 = ("apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel "
            "can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur "
            "dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion "
            "lizard lobster man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree "
            "pear pickup_truck pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea "
            "seal shark shrew skunk skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table "
            "tank telephone television tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman "
            "worm").split()


@pytest.mark.parametrize("classes", [["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                      "ship", "truck"], CIFAR100,
                                     ["great white shark, white shark, man-eater, man-eating shark", "tench"]])
def test_confusion_matrix_labels_never_overlap_and_stay_in_the_image(classes, tmp_path):
    from vitkit.evaluate.metrics import confusion_figure, confusion_plot

    confusion = torch.randint(0, 9, (len(classes), len(classes)), generator=torch.Generator().manual_seed(0))
    figure = confusion_plot(confusion, classes, "test")
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    axes = figure.axes[0]
    for labels in (axes.get_xticklabels(), axes.get_yticklabels()):
        boxes = [label.get_window_extent(renderer) for label in labels]
        assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), "neighbouring tick labels overlap"
        assert all(box.height >= 6 for box in boxes)  # 6 pt or more: readable
    pixels = np.asarray(Image.open(confusion_figure(confusion, classes, tmp_path / "c.png", "test")).convert("L"))
    border = np.concatenate([pixels[:5].ravel(), pixels[-5:].ravel(), pixels[:, :5].ravel(), pixels[:, -5:].ravel()])
    assert border.min() == 255  # a blank margin all round: no label or title runs off the image
