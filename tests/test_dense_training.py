"""Dense tasks through the commands people run: ``vitkit finetune --objective segmentation|depth`` trains a head on
a frozen backbone (``--peft linear``) to a high mIoU on a task a linear probe can learn, ``vitkit eval`` measures
the saved model to the same numbers, and mismatched data and objectives are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.evaluate.segmentation import miou
from vitkit.models import ViTConfig, VisionTransformer

COLOURS = {1: (230, 30, 30), 2: (30, 230, 30), 3: (30, 30, 230)}  # class -> colour; 0 = black background


def colour_boxes(root, splits=(("train", 48), ("val", 12)), seed=0):
    """``maskfolder:`` canvases of 32-40 px with boxes of three colours on black, each pixel labelled by its
    colour; a box's soft 1 px rim is ignored (255)."""
    rng = np.random.default_rng(seed)
    root.mkdir()
    (root / "classes.txt").write_text("background\nred\ngreen\nblue\n")
    for split, count in splits:
        (root / split / "images").mkdir(parents=True)
        (root / split / "masks").mkdir(parents=True)
        for number in range(count):
            height, width = (int(rng.integers(32, 41)) for _ in range(2))
            image = np.zeros((height, width, 3), np.uint8)
            mask = np.zeros((height, width), np.uint8)
            for _ in range(3):
                label = int(rng.integers(1, 4))
                top, left = int(rng.integers(0, height - 12)), int(rng.integers(0, width - 12))
                bottom, right = top + int(rng.integers(10, 20)), left + int(rng.integers(10, 20))
                image[top:bottom, left:right] = COLOURS[label]
                mask[top:bottom, left:right] = 255
                mask[top + 1:bottom - 1, left + 1:right - 1] = label
            Image.fromarray(image).save(root / split / "images" / f"{number:03d}.png")
            Image.fromarray(mask).save(root / split / "masks" / f"{number:03d}.png")
    return root


def backbone(path):
    torch.manual_seed(0)
    VisionTransformer(ViTConfig(image_size=32, patch_size=4, dim=32, depth=2, num_heads=2, mlp_dim=64,
                                num_classes=5)).save(path)
    return path


def test_linear_probe_learns_a_segmentation_and_eval_measures_it_again(tmp_path, capsys):
    data = colour_boxes(tmp_path / "boxes")
    run_dir = tmp_path / "run"
    code = main(["finetune", str(backbone(tmp_path / "backbone")), "--objective", "segmentation", "--head", "linear",
                 "--peft", "linear", "--dataset", f"maskfolder:{data}", "--image-size", "32", "--steps", "150",
                 "--batch-size", "16", "--optimizer", "adamw", "--lr", "0.02", "--weight-decay", "0",
                 "--warmup-steps", "10", "--run-dir", str(run_dir)])
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test/split"] == "val" and summary["test/images"] == 12
    assert summary["test/mIoU"] > 0.75, summary  # colours a linear probe of patch features tells apart
    assert summary["params/trained"] < 0.1 * summary["params/total"]  # the backbone stayed frozen
    model = vitkit.load(run_dir / "model").eval()
    assert model.config.dense_head == "linear" and model.config.provenance.classes == ("background", "red", "green",
                                                                                        "blue")
    frozen = vitkit.load(tmp_path / "backbone")  # the backbone's weights are the checkpoint's
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, frozen.blocks[0].attn.qkv.weight)

    capsys.readouterr()
    assert main(["eval", str(run_dir / "model"), "--dataset", f"maskfolder:{data}", "--split", "val", "--out",
                 str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "eval" / "eval-val.json").read_text())
    assert report["mIoU"] == pytest.approx(summary["test/mIoU"])
    assert set(report["IoU"]) == {"background", "red", "green", "blue"} and "mIoU" in printed
    # the same number from the model run by hand: each image stretched to 32 px, its logits resized to its mask
    preds, masks = [], []
    for name in sorted((data / "val" / "images").iterdir()):
        pixels = torch.from_numpy(np.array(Image.open(name))).permute(2, 0, 1).float() / 255
        mask = torch.from_numpy(np.array(Image.open(data / "val" / "masks" / name.name))).long()
        stretched = torch.nn.functional.interpolate(pixels[None], size=(32, 32), mode="bilinear", antialias=True,
                                                    align_corners=False)
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in model.config.input_statistics)
        with torch.no_grad():
            logits = model((stretched - mean) / std)
        logits = torch.nn.functional.interpolate(logits, size=mask.shape, mode="bilinear", align_corners=False)
        preds.append(logits[0].argmax(0))
        masks.append(mask)
    assert miou(preds, masks, 4)["mIoU"] == pytest.approx(report["mIoU"], abs=0.01)  # uint8 rounding of the resize

    # predict writes each image's classes as an indexed PNG (read back by maskfolder:) and an overlay
    images = sorted((data / "val" / "images").iterdir())[:3]
    capsys.readouterr()
    assert main(["predict", str(run_dir / "model"), *map(str, images), "--out", str(tmp_path / "pred"),
                 "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    for record, image, expected in zip(records, images, preds):
        written = np.array(Image.open(record["mask"]))
        assert Image.open(record["mask"]).mode == "P" and written.shape == expected.shape
        assert (written == expected.numpy()).mean() > 0.98  # the same argmax, up to the resize's rounding
        assert Image.open(record["overlay"]).size == Image.open(image).size
        assert sum(entry["share"] for entry in record["classes"]) == pytest.approx(1.0)


def test_depth_head_trains_and_evaluates(tmp_path):
    root = tmp_path / "depth"
    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("val", 4)):
        (root / split / "images").mkdir(parents=True)
        (root / split / "depth").mkdir(parents=True)
        for number in range(count):
            near = rng.uniform(1, 3)
            depth = np.full((32, 32), 6000, np.uint16)
            depth[8:24, 8:24] = int(near * 1000)
            image = np.where(depth == 6000, 20, 255 - int(near * 60)).astype(np.uint8)
            Image.fromarray(np.stack([image] * 3, -1)).save(root / split / "images" / f"{number}.png")
            Image.fromarray(depth).save(root / split / "depth" / f"{number}.png")
    run_dir = tmp_path / "run"
    assert main(["finetune", str(backbone(tmp_path / "backbone")), "--objective", "depth", "--head", "dpt",
                 "--dataset", f"depthfolder:{root}", "--image-size", "32", "--steps", "6", "--batch-size", "8",
                 "--optimizer", "adamw", "--lr", "0.001", "--run-dir", str(run_dir), "--depth-bins", "32"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    recipe = json.loads((run_dir / "recipe.json").read_text())
    assert recipe["objective"]["max_depth"] == 10.0  # a depth folder has no cap: the bins end at 10 m
    model = vitkit.load(run_dir / "model")
    assert (model.config.dense_head, model.config.dense_output, model.config.num_classes) == ("dpt", "depth", 32)
    assert 0 < summary["test/abs_rel"] < 10 and 0 <= summary["test/a1"] <= 1
    assert main(["eval", str(run_dir / "model"), "--dataset", f"depthfolder:{root}", "--split", "val", "--out",
                 str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval-val.json").read_text())
    assert report["abs_rel"] == pytest.approx(summary["test/abs_rel"]) and report["images"] == 4


def test_objectives_and_data_that_do_not_match_are_refused(tmp_path, capsys):
    data = colour_boxes(tmp_path / "boxes", splits=(("train", 4), ("val", 2)))
    checkpoint = str(backbone(tmp_path / "backbone"))
    assert main(["finetune", checkpoint, "--dataset", f"maskfolder:{data}", "--steps", "1", "--batch-size", "2",
                 "--run-dir", str(tmp_path / "a")]) == 2
    assert "is a segmentation dataset: pass --objective segmentation" in capsys.readouterr().err
    assert main(["finetune", checkpoint, "--objective", "depth", "--dataset", f"maskfolder:{data}", "--steps", "1",
                 "--batch-size", "2", "--run-dir", str(tmp_path / "b")]) == 2
    assert "--objective depth needs a depth dataset" in capsys.readouterr().err
    assert main(["finetune", checkpoint, "--head", "dpt", "--dataset", f"maskfolder:{data}", "--steps", "1",
                 "--run-dir", str(tmp_path / "c")]) == 2
    assert "objective.dense_head: expected null unless objective.kind is segmentation or depth" \
        in capsys.readouterr().err
    assert main(["eval", checkpoint, "--dataset", f"maskfolder:{data}", "--split", "val"]) == 2
    assert "has a classifier and maskfolder" in capsys.readouterr().err


def test_a_training_split_of_one_image_trains(tmp_path):
    data = colour_boxes(tmp_path / "boxes", splits=(("train", 1), ("val", 1)))
    assert main(["finetune", str(backbone(tmp_path / "backbone")), "--objective", "segmentation", "--peft", "linear",
                 "--dataset", f"maskfolder:{data}", "--steps", "3", "--batch-size", "1",
                 "--run-dir", str(tmp_path / "run")]) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["test/images"] == 1


def test_a_bad_mask_stops_the_run_naming_it_before_anything_is_saved(tmp_path, capsys):
    data = colour_boxes(tmp_path / "boxes", splits=(("train", 4), ("val", 2)))
    bad = data / "train" / "masks" / "002.png"
    Image.fromarray(np.zeros((7, 9), np.uint8)).save(bad)
    code = main(["finetune", str(backbone(tmp_path / "backbone")), "--objective", "segmentation", "--dataset",
                 f"maskfolder:{data}", "--steps", "4", "--batch-size", "2", "--run-dir", str(tmp_path / "run")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and str(bad) in error[-1] and "Traceback" not in "\n".join(error)
    assert not (tmp_path / "run" / "model").exists()


def test_cached_features_are_the_backbones_and_are_computed_once(tmp_path, caplog):
    from vitkit.train.feature_cache import CachedFeatures
    from vitkit.train.objectives import Segmentation

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(image_size=32, patch_size=8, dim=32, depth=4, num_heads=2, mlp_dim=64,
                                        num_classes=5, dense_head="linear-ms", class_token=True))
    images, masks = torch.randn(6, 3, 32, 32), torch.randint(0, 5, (6, 32, 32))
    cache = CachedFeatures(model, limit_bytes=10**9)
    for first in (True, False):
        for (ours, state), (theirs, their_state) in zip(cache(images), model.dense_features(images)):
            torch.testing.assert_close(ours, theirs)
            torch.testing.assert_close(state, their_state)
        assert (cache.hits, cache.misses) == ((0, 6) if first else (6, 6))
    order = torch.tensor([5, 0, 3, 1, 2, 4])
    torch.testing.assert_close(cache(images[order])[0][0], model.dense_features(images[order])[0][0])
    plain, cached = Segmentation(255), Segmentation(255, cache)
    loss, _ = plain(model, (images, masks))
    loss.backward()
    expected = model.dense_head.decoder.conv.weight.grad.clone()
    model.zero_grad()
    loss_cached, _ = cached(model, (images, masks))
    loss_cached.backward()
    torch.testing.assert_close(loss_cached, loss)
    torch.testing.assert_close(model.dense_head.decoder.conv.weight.grad, expected)
    nothing_kept = CachedFeatures(model, limit_bytes=0)
    torch.testing.assert_close(nothing_kept(images)[0][0], model.dense_features(images)[0][0])
    assert not nothing_kept.entries

    data = colour_boxes(tmp_path / "boxes", splits=(("train", 8), ("val", 2)))
    with caplog.at_level("INFO"):
        assert main(["finetune", str(backbone(tmp_path / "backbone")), "--objective", "segmentation", "--peft",
                     "linear", "--transform", "eval", "--dataset", f"maskfolder:{data}", "--steps", "6",
                     "--batch-size", "4", "--image-size", "32", "--run-dir", str(tmp_path / "run")]) == 0
    assert "each image's features computed once and kept" in caplog.text


@pytest.mark.parametrize("parallel, head", [("ddp", "linear-ms"), ("fsdp", "dpt")])
def test_a_dense_head_trains_under_torchrun(parallel, head, tmp_path):
    """Two gloo ranks fine-tune backbone and head (DDP with the synchronised BatchNorm, FSDP2 with DPT), rank 0
    alone writes the model and the metrics."""
    from launch import VITKIT_TORCHRUN, launch

    data = colour_boxes(tmp_path / "boxes", splits=(("train", 8), ("val", 2)))
    stdout = launch(VITKIT_TORCHRUN, "finetune", backbone(tmp_path / "backbone"), "--objective", "segmentation",
                    "--head", head, "--dataset", f"maskfolder:{data}", "--steps", "3", "--batch-size", "4",
                    "--image-size", "32", "--threads", "1", "--parallel", parallel, "--run-dir", tmp_path / "run")
    assert stdout.count("mIoU:") == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test/images"] == 2 and 0 <= summary["test/mIoU"] <= 1
    assert vitkit.load(tmp_path / "run" / "model").config.dense_head == head


def test_a_set_without_validation_holds_one_out_and_dense_models_stay_out_of_image_commands(tmp_path, capsys):
    from vitkit.data import load_dataset, split_names

    data = colour_boxes(tmp_path / "boxes", splits=(("train", 10),))
    spec = f"maskfolder:{data}"
    assert "val" in split_names(spec)
    held, kept = load_dataset(spec, "val"), load_dataset(spec, "train")
    assert len(held) == 1 and len(kept) == 9  # the default 10% held out, and no longer trained on
    assert held.path(0) not in {kept.path(i) for i in range(len(kept))}

    dense = VisionTransformer(ViTConfig(image_size=32, patch_size=8, dim=32, depth=2, num_heads=2, mlp_dim=64,
                                        num_classes=4, dense_head="linear"))
    dense.save(tmp_path / "dense")
    assert main(["fewshot", str(tmp_path / "dense"), "--dataset", "digits", "--shots", "1"]) == 2
    assert "a linear head predicts per pixel; vitkit fewshot takes a model that classifies" in capsys.readouterr().err
    with pytest.raises(vitkit.errors.ConfigError, match="has a linear dense head, not a classifier"):
        dense.reset_head(10)
    assert main(["train", "--objective", "segmentation", "--dataset", spec, "--steps", "1",
                 "--run-dir", str(tmp_path / "scratch")]) == 2
    assert "--objective segmentation puts a head on a backbone" in capsys.readouterr().err


def test_dense_images_are_read_as_stored_whatever_their_exif_orientation(tmp_path):
    from vitkit.data import load_dataset

    data = colour_boxes(tmp_path / "boxes", splits=(("train", 1),))
    image = data / "train" / "images" / "000.png"
    pixels = np.array(Image.open(image))
    exif = Image.Exif()
    exif[0x0112] = 3  # rotated 180 degrees for display
    Image.fromarray(pixels).save(image, exif=exif)
    read, _ = load_dataset(f"maskfolder:{data}", "all")[0]
    assert np.array_equal(read.permute(1, 2, 0).numpy(), pixels)  # the pixels the mask was drawn on


def test_a_dense_run_stopped_half_way_resumes_to_the_uninterrupted_weights(tmp_path):
    """Random crops are drawn per (seed, epoch, image) and the head's BatchNorm statistics are saved with the
    weights, so a run continued from its middle checkpoint ends where the uninterrupted one does."""
    import shutil

    from safetensors.torch import load_file

    data = colour_boxes(tmp_path / "boxes", splits=(("train", 8), ("val", 2)))
    args = ["finetune", str(backbone(tmp_path / "backbone")), "--objective", "segmentation", "--head", "linear-ms",
            "--dataset", f"maskfolder:{data}", "--steps", "6", "--batch-size", "4", "--image-size", "32",
            "--checkpoint-every", "3"]
    assert main([*args, "--run-dir", str(tmp_path / "straight")]) == 0
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step-00000006")
    shutil.rmtree(tmp_path / "resumed" / "model")
    assert main([*args, "--run-dir", str(tmp_path / "resumed"), "--resume"]) == 0
    straight = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model" / "model.safetensors")
    assert "dense_head.decoder.bn.running_mean" in straight
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)


def test_unreadable_targets_and_a_file_for_an_output_folder_are_one_line(tmp_path, capsys):
    data = colour_boxes(tmp_path / "boxes", splits=(("train", 2),))
    mask = data / "train" / "masks" / "000.png"
    mask.write_bytes(mask.read_bytes()[:40])  # truncated
    with pytest.raises(vitkit.errors.DatasetError, match=rf"^{mask}: not a readable mask"):
        from vitkit.data import load_dataset

        load_dataset(f"maskfolder:{data}", "all")[0]
    dense = VisionTransformer(ViTConfig(image_size=32, patch_size=8, dim=32, depth=2, num_heads=2, mlp_dim=64,
                                        num_classes=4, dense_head="linear"))
    dense.save(tmp_path / "dense")
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    code = main(["predict", str(tmp_path / "dense"), str(data / "train" / "images" / "001.png"), "--out", str(taken)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and str(taken) in err[0] and taken.read_text() == "not a folder"


def test_eval_averages_test_time_views_and_a_classifier_refuses_them(tmp_path, capsys):
    """`eval --scales 1 1.5 --flip` reports the views it averaged, and its mIoU is the one computed from
    ``dense_outputs`` over the same images; a classifier refuses the flags in one line."""
    from vitkit.data import load_dataset
    from vitkit.data.transforms import dense_transform
    from vitkit.evaluate.dense import dense_outputs

    data = colour_boxes(tmp_path / "boxes", splits=(("train", 2), ("val", 4)))
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(image_size=32, patch_size=4, dim=32, depth=2, num_heads=2, mlp_dim=64,
                                        num_classes=4, dense_head="linear"))
    model.config = model.config.replace(provenance=model.config.provenance.replace(
        classes=("background", "red", "green", "blue")))
    model.save(tmp_path / "model")
    assert main(["eval", str(tmp_path / "model"), "--dataset", f"maskfolder:{data}", "--split", "val", "--scales",
                 "1", "1.5", "--flip", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval-val.json").read_text())
    assert report["scales"] == [1.0, 1.5] and report["flip"] is True
    model = vitkit.load(tmp_path / "model").eval()
    transform = dense_transform("segmentation", False, (32, 32), 3, model.config.provenance.normalization)
    preds, masks = [], []
    for image, mask in load_dataset(f"maskfolder:{data}", "val"):
        image, mask = transform.per_image(image, mask)
        with torch.no_grad():
            (output,) = dense_outputs(model, transform.per_batch(image)[None], [mask.shape], "segmentation",
                                      torch.device("cpu"), torch.float32, (1.0, 1.5), True)
        preds.append(output.argmax(0))
        masks.append(mask.as_subclass(torch.Tensor))
    assert miou(preds, masks, 4)["mIoU"] == pytest.approx(report["mIoU"], abs=1e-9)

    capsys.readouterr()
    assert main(["eval", str(backbone(tmp_path / "classifier")), "--dataset", "digits", "--flip"]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "is a classifier: --scales and --flip" in error, error


def test_the_memory_check_counts_the_dense_head(tmp_path, capsys):
    """A run whose backbone fits but whose head's outputs at the image's size (kept for the loss) do not is refused
    before the first step, the head named in the estimate."""
    from vitkit.memory import available_memory, estimate

    data = colour_boxes(tmp_path / "boxes", splits=(("train", 4), ("val", 2)))
    torch.manual_seed(0)
    VisionTransformer(ViTConfig(image_size=64, patch_size=32, dim=32, depth=1, num_heads=2, mlp_dim=64,
                                num_classes=5)).save(tmp_path / "backbone")
    config = vitkit.load(tmp_path / "backbone").config.replace(image_size=(512, 512))
    head = config.replace(dense_head="linear", num_classes=4)
    one, two = (estimate(config, batch, training=True).total for batch in (1, 2))
    one_headed, two_headed = (estimate(head, batch, training=True).total for batch in (1, 2))
    limit = available_memory().bytes
    # the batch whose estimate, half-way between the backbone's and the headed one's, is this machine's limit
    batch = round((limit - one) / ((two - one) + (two_headed - one_headed - two + one) / 2)) + 1
    assert estimate(config, batch, training=True).total < limit < estimate(head, batch, training=True).total
    code = main(["finetune", str(tmp_path / "backbone"), "--objective", "segmentation", "--head", "linear",
                 "--dataset", f"maskfolder:{data}", "--image-size", "512", "--batch-size", str(batch), "--steps",
                 "1", "--run-dir", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert code != 0 and "dense head" in error, error
    assert not (tmp_path / "run" / "model").exists()
