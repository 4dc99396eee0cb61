"""Dense heads (``models.dense``): what each head reads and computes, checked against the same computation written
out from ``forward_intermediates``; the depth bins and the training losses against their closed forms; the joint
transforms keeping a mask on its pixels."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torchvision import tv_tensors

from vitkit.data.transforms import dense_transform
from vitkit.errors import ConfigError, InputError
from vitkit.models import ViTConfig, VisionTransformer
from vitkit.models.dense import dense_layers, depth_from_bins, resized
from vitkit.train.objectives import DepthRegression, Segmentation

SMALL = dict(image_size=32, patch_size=8, dim=32, depth=5, num_heads=4, mlp_dim=64)


def trained_bn(model: VisionTransformer) -> None:
    """Running statistics and affine weights away from their defaults, so that evaluation-mode BatchNorm matters."""
    bn = model.dense_head.decoder.bn
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)


@pytest.mark.parametrize("head, blocks", [("linear", [4]), ("linear-ms", [1, 2, 3, 4])])
@pytest.mark.parametrize("options", [dict(), dict(reg_tokens=2, rope="axial", pos_embed="none", layer_scale=0.1),
                                     dict(class_token=False, pool="gap"), dict(dense_output="depth")])
def test_linear_heads_equal_the_probe_written_out(head, blocks, options):
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**SMALL, **options, num_classes=6, dense_head=head)).eval()
    depth = options.get("dense_output") == "depth"
    trained_bn(model)
    assert dense_layers(model.config) == blocks
    images = torch.randn(2, 3, 32, 48)
    seen = model.forward_intermediates(images)
    prefix = model.config.num_prefix_tokens
    maps = []
    for index in blocks:
        tokens = model.norm(seen.blocks[index])
        patches = tokens[:, prefix:].reshape(2, 4, 6, 32).permute(0, 3, 1, 2)
        maps.append(patches)
        if depth:  # DINOv2's depth probe joins the [class] token's state; its segmentation probe does not
            maps.append(tokens[:, 0, :, None, None].expand(-1, -1, 4, 6))
    bn, conv = model.dense_head.decoder.bn, model.dense_head.decoder.conv
    features = torch.cat(maps, dim=1)
    normed = (features - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
    normed = normed * bn.weight[:, None, None] + bn.bias[:, None, None]
    expected = torch.einsum("bchw,kc->bkhw", normed, conv.weight[:, :, 0, 0]) + conv.bias[:, None, None]
    if depth:
        expected = depth_from_bins(expected, 1e-3, 10.0)
    torch.testing.assert_close(model(images), expected, rtol=1e-5, atol=1e-5)


def test_dpt_scales_follow_the_patch_size():
    from vitkit.models.dense import dpt_scales

    assert dpt_scales(16) == dpt_scales(14) == [4, 2, 1, 0.5]  # DPT's and DINOv2's
    assert dpt_scales(8) == [2, 1, 0.5, 0.25] and dpt_scales(32) == [8, 4, 2, 1]
    model = VisionTransformer(ViTConfig(**{**SMALL, "patch_size": 4}, num_classes=3, dense_head="dpt")).eval()
    assert model(torch.randn(1, 3, 32, 48)).shape == (1, 3, 32, 48)  # about the input's size for any patch


def test_dpt_reads_four_blocks_and_outputs_at_the_inputs_size():
    model = VisionTransformer(ViTConfig(**{**SMALL, "depth": 12}, num_classes=3, dense_head="dpt")).eval()
    assert dense_layers(model.config) == [2, 5, 8, 11]
    assert dense_layers(model.config.replace(depth=2)) == [0, 0, 1, 1]  # fewer blocks than four: some twice
    out = model(torch.randn(1, 3, 32, 48))
    assert out.shape == (1, 3, 32, 48)  # a 4x6 grid of 8 px patches: maps at 8, 4, 2 and 1 px, then two doublings
    # the decoder sees nothing else than the blocks it reads: a change after block 11's output changes nothing
    # (there is none), one to block 2's input changes the output
    with torch.no_grad():
        model.blocks[1].mlp.fc2.bias.add_(1.0)
    assert not torch.allclose(model(torch.randn(1, 3, 32, 48)), out)


def test_depth_from_bins_is_the_weighted_mean_of_evenly_spaced_bins():
    weights = torch.zeros(1, 5, 1, 1)  # equal weights after ReLU + 0.1: the mean of the bins
    assert depth_from_bins(weights, 1.0, 9.0).item() == pytest.approx(5.0)
    weights = torch.tensor([3.0, -1.0, 0.0, 0.0, 0.9]).view(1, 5, 1, 1)  # (3.1, 0.1, 0.1, 0.1, 1.0) / 4.4
    expected = (3.1 * 1 + 0.1 * 3 + 0.1 * 5 + 0.1 * 7 + 1.0 * 9) / 4.4
    assert depth_from_bins(weights, 1.0, 9.0).item() == pytest.approx(expected)
    model = VisionTransformer(ViTConfig(**SMALL, num_classes=16, dense_head="linear", dense_output="depth",
                                        depth_min=0.5, depth_max=4.0)).eval()
    depth = model(torch.randn(2, 3, 32, 32))
    assert depth.shape == (2, 1, 4, 4) and depth.min() >= 0.5 and depth.max() <= 4.0


def test_make_dense_keeps_the_backbone_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**SMALL, num_classes=10, pool="map", fc_norm=True)).eval()
    images = torch.randn(2, 3, 32, 32)
    before = model.forward_intermediates(images).blocks
    model.make_dense("linear-ms", 7)
    assert not model.dense_head.training  # the new head follows the model's mode
    assert model.config.dense_head == "linear-ms" and model.config.num_classes == 7
    assert model.attn_pool is None and model.config.provenance.classes is None
    after = model.forward_intermediates(images).blocks
    for old, new in zip(before, after):
        torch.testing.assert_close(old, new)
    model.save(tmp_path / "dense")
    import vitkit

    loaded = vitkit.load(tmp_path / "dense").eval()
    torch.testing.assert_close(loaded(images), model(images))
    assert {name.split(".")[0] for name, _ in loaded.named_parameters()} >= {"dense_head", "blocks"}
    assert not any(name.startswith(("attn_pool", "head.", "fc_norm")) for name, _ in loaded.named_parameters())


def test_dense_config_rules_and_naflex_refusal():
    with pytest.raises(ConfigError, match="dense_output: expected 'classes' unless a dense_head is set"):
        ViTConfig(**SMALL, dense_output="depth")
    with pytest.raises(ConfigError, match="representation_size: expected null with a dense_head"):
        ViTConfig(**SMALL, dense_head="linear", representation_size=16)
    with pytest.raises(ConfigError, match="depth_max: expected more than depth_min"):
        ViTConfig(**SMALL, dense_head="linear", dense_output="depth", depth_min=2.0, depth_max=1.0)
    from vitkit.models.naflex import naflex_batch

    model = VisionTransformer(ViTConfig(**SMALL, num_classes=3, dense_head="linear"))
    with pytest.raises(InputError, match="a dense head takes \\(B, C, H, W\\) images, not a NaFlex batch"):
        model(naflex_batch([torch.randn(3, 32, 32)], 8, 16))


def test_segmentation_loss_is_cross_entropy_at_the_masks_size():
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**SMALL, num_classes=4, dense_head="linear"))
    images = torch.randn(2, 3, 32, 32)
    masks = torch.randint(0, 4, (2, 32, 32))
    masks[0, :5] = 255
    loss, metrics = Segmentation(255)(model, (images, masks))
    logits = F.interpolate(model(images), size=(32, 32), mode="bilinear", align_corners=False)
    torch.testing.assert_close(loss, F.cross_entropy(logits, masks, ignore_index=255))
    counted = masks != 255
    assert metrics["pixel_accuracy"].item() == pytest.approx(
        ((logits.argmax(1) == masks) & counted).sum().item() / counted.sum().item())


def test_depth_loss_is_the_scale_invariant_log_loss():
    model = VisionTransformer(ViTConfig(**SMALL, num_classes=8, dense_head="linear", dense_output="depth"))
    images = torch.randn(1, 3, 32, 32)
    depth = torch.rand(1, 32, 32) * 12
    depth[0, 0] = 0  # no depth
    loss, _ = DepthRegression(max_depth=10.0)(model, (images, depth))
    predicted = resized(model(images), (32, 32))[:, 0]
    valid = (depth > 0) & (depth <= 10)
    g = [math.log(p + 1e-3) - math.log(t + 1e-3) for p, t in zip(predicted[valid].tolist(), depth[valid].tolist())]
    mean = sum(g) / len(g)
    variance = sum((x - mean) ** 2 for x in g) / (len(g) - 1)
    assert loss.item() == pytest.approx(math.sqrt(variance + 0.15 * mean ** 2), rel=1e-4)


def halves(height: int, width: int) -> tuple[torch.Tensor, tv_tensors.Mask]:
    """A picture bright on the left (class 1) and dark grey on the right (class 2)."""
    image = torch.full((3, height, width), 60, dtype=torch.uint8)
    image[:, :, : width // 2] = 220
    mask = torch.full((height, width), 2, dtype=torch.int64)
    mask[:, : width // 2] = 1
    return image, tv_tensors.Mask(mask)


@pytest.mark.parametrize("task", ["segmentation", "depth"])
def test_training_transform_moves_the_target_with_its_pixels(task):
    preset = dense_transform(task, True, (32, 32), 3)
    torch.manual_seed(0)
    for _ in range(20):
        image, mask = halves(int(torch.randint(20, 80, ())), int(torch.randint(20, 80, ())))
        if task == "depth":
            mask = tv_tensors.Mask(mask.float() * 1.5)
        seen, target = preset.per_image(image, mask)
        assert seen.shape == (3, 32, 32) and target.shape == (32, 32) and seen.dtype == torch.uint8
        bright, dark = (1, 2) if task == "segmentation" else (1.5, 3.0)
        padding = 255 if task == "segmentation" else 0
        grey = seen[0].float()[:, 1:-1]
        inner = target[:, 1:-1]
        inner = torch.where((inner == target[:, :-2]) & (inner == target[:, 2:]), inner, -1)  # away from the edge
        for value, side in ((bright, grey > 140), (dark, grey < 140)):
            assert side[inner == value].all()
        assert (seen[0][target == padding] == 0).all()  # padded pixels are black and their target says so
        assert set(target.unique().tolist()) <= {bright, dark, padding}


def test_evaluation_transform_leaves_the_target_at_its_size():
    preset = dense_transform("segmentation", False, (32, 48), 1)
    image, mask = halves(50, 70)
    seen, target = preset.per_image(image, mask)
    assert seen.shape == (1, 32, 48) and target is mask
    ready, target = preset(image, mask)  # the whole preset on one pair: normalised floats, the target as it was
    torch.testing.assert_close(ready, preset.per_batch(seen[None])[0])
    assert ready.dtype == torch.float32 and target is mask
    with pytest.raises(TypeError, match="with its dense target"):
        preset(image)


@pytest.mark.parametrize("head, output", [("linear-ms", "classes"), ("dpt", "depth")])
def test_dense_models_export_to_onnx_at_any_size_and_not_to_the_plain_formats(tmp_path, head, output):
    from vitkit.checkpoints.convert import export
    from vitkit.checkpoints.runnable import load_inference
    from vitkit.errors import FormatError

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**SMALL, num_classes=6, dense_head=head, dense_output=output)).eval()
    export(model, tmp_path / "dense.onnx", "onnx")
    graph, _, _ = load_inference(str(tmp_path / "dense.onnx"), {}, "cpu", "fp32")
    images = torch.randn(2, 3, 40, 56)  # not the size it was traced at, an odd grid
    torch.testing.assert_close(graph(images), model(images), rtol=1e-4, atol=1e-4)
    with pytest.raises(FormatError, match="has no place for a dense head"):
        export(model, tmp_path / "timm.safetensors", "timm")


def test_serve_refuses_a_dense_model_in_one_line(tmp_path):
    from vitkit.serve.classifier import Classifier

    VisionTransformer(ViTConfig(**SMALL, num_classes=3, dense_head="linear")).save(tmp_path / "dense")
    with pytest.raises(ConfigError, match="a linear head predicts per pixel; vitkit serve takes a model that classifies"):
        Classifier(str(tmp_path / "dense"))


@pytest.mark.parametrize("task", ["segmentation", "depth"])
def test_test_time_views_average_the_rescaled_and_mirrored_outputs(task):
    """``dense_outputs`` with scales 1 and 1.5 and a mirror: each view run at its size (rounded to the patch),
    mirrored back, resized to the target, averaged as class probabilities (segmentation) or as depth."""
    from vitkit.evaluate.dense import dense_outputs

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**SMALL, num_classes=5, dense_head="linear",
                                        dense_output="depth" if task == "depth" else "classes")).eval()
    trained_bn(model)
    batch, sizes = torch.randn(2, 3, 32, 32), [torch.Size((21, 37)), torch.Size((40, 30))]
    with torch.no_grad():
        ours = dense_outputs(model, batch, sizes, task, torch.device("cpu"), torch.float32, (1.0, 1.5), flip=True)
        for index, size in enumerate(sizes):
            views = []
            for side in (32, 48):  # 1.5 x 32 = 48, a multiple of the 8 px patch
                image = F.interpolate(batch[index:index + 1], size=(side, side), mode="bilinear",
                                      align_corners=False) if side != 32 else batch[index:index + 1]
                for mirrored in (False, True):
                    output = model(image.flip(-1) if mirrored else image)
                    output = output.flip(-1) if mirrored else output
                    output = F.interpolate(output, size=size, mode="bilinear", align_corners=False)[0]
                    views.append(output.softmax(0) if task == "segmentation" else output)
            torch.testing.assert_close(ours[index], torch.stack(views).mean(0), atol=1e-5, rtol=1e-5)
        single = dense_outputs(model, batch, sizes, task, torch.device("cpu"), torch.float32)
        torch.testing.assert_close(single[0], F.interpolate(model(batch[:1]), size=sizes[0], mode="bilinear",
                                                            align_corners=False)[0])


def test_info_names_the_dense_head_and_what_it_outputs(tmp_path, capsys):
    from vitkit.cli import main

    VisionTransformer(ViTConfig(**SMALL, num_classes=16, dense_head="linear-ms", dense_output="depth",
                                depth_max=80)).save(tmp_path / "depth")
    VisionTransformer(ViTConfig(**SMALL, num_classes=3, dense_head="dpt")).save(tmp_path / "dpt")
    outputs = []
    for name in ("depth", "dpt"):
        assert main(["info", str(tmp_path / name)]) == 0
        outputs.append(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("output")))
    assert outputs[0].split(None, 1)[1] == ("depth per pixel from 16 bins, 0.001-80 m, head 'linear-ms' on "
                                           "blocks 2, 3, 4, 5")
    assert outputs[1].split(None, 1)[1] == "3 classes per pixel, head 'dpt' on blocks 1, 2, 4, 5"


def _synced_rank(rank: int, folder: str) -> None:
    """One of two gloo ranks: its half of the batch through SyncedBatchNorm, its outputs and gradients saved."""
    import torch.distributed as dist

    from vitkit.models.dense import SyncedBatchNorm

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        batch, weights = torch.randn(6, 5, 3, 4) * 3 + 1, torch.randn(6, 5, 3, 4)
        norm = SyncedBatchNorm(5)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        mine = batch[3 * rank:3 * rank + 3].clone().requires_grad_()
        output = norm(mine)
        (output * weights[3 * rank:3 * rank + 3]).sum().backward()
        torch.save({"output": output.detach(), "input_grad": mine.grad, "weight_grad": norm.weight.grad,
                    "bias_grad": norm.bias.grad, "running_mean": norm.running_mean,
                    "running_var": norm.running_var}, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_synced_batch_norm_over_two_ranks_is_batch_norm_over_their_images(tmp_path):
    """Two gloo ranks holding three images each: outputs, input gradients, the sum of the ranks' weight gradients
    and the running statistics equal torch's BatchNorm over the six images in one process."""
    import torch.multiprocessing as mp

    mp.spawn(_synced_rank, args=(str(tmp_path),), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    torch.manual_seed(0)
    batch, weights = torch.randn(6, 5, 3, 4) * 3 + 1, torch.randn(6, 5, 3, 4)
    norm = torch.nn.BatchNorm2d(5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    batch.requires_grad_()
    output = norm(batch)
    (output * weights).sum().backward()
    torch.testing.assert_close(torch.cat([rank["output"] for rank in ranks]), output.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([rank["input_grad"] for rank in ranks]), batch.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ranks[0]["weight_grad"] + ranks[1]["weight_grad"], norm.weight.grad, atol=1e-4,
                               rtol=1e-5)
    torch.testing.assert_close(ranks[0]["bias_grad"] + ranks[1]["bias_grad"], norm.bias.grad, atol=1e-4, rtol=1e-5)
    for rank in ranks:
        torch.testing.assert_close(rank["running_mean"], norm.running_mean)
        torch.testing.assert_close(rank["running_var"], norm.running_var)
