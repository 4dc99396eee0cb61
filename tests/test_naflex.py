"""NaFlex batches: images of different aspect ratios in one padded batch give, image by image, what each gives
alone at its own size; the patch budget follows SigLIP 2's processor; bad batches are refused in one line."""

import pytest
import torch

import vitkit
from vitkit.models.naflex import PatchBatch, naflex_batch, patchify, size_for_patch_budget

FAMILIES = {
    "siglip2": dict(class_token=False, pool="map", pos_interp="bilinear", pos_interp_antialias=True),
    "dinov3": dict(reg_tokens=4, pos_embed="none", rope="axial", rope_grid="centered", rope_theta=100.0,
                   rope_half=True, layer_scale=1e-5, pool="gap"),
    "eva02": dict(rope="axial", rope_ref_grid=4, fc_norm=True, pool="gap", k_bias=False, mlp="swiglu"),
    "rope-mixed": dict(rope="mixed", pos_embed="none", rope_xy=True, reg_tokens=1),
    "pe": dict(rope="axial", rope_offset=1.0, rope_xy=True, pre_norm=True, pool="map", pool_heads=2, pool_prefix=True),
    "naflexvit": dict(class_token=False, reg_tokens=4, layer_scale=1e-5, pool="gap", fc_norm=True, pool_prefix=True),
}


def tiny(family):
    config = vitkit.ViTConfig(image_size=32, patch_size=8, dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5,
                              **FAMILIES[family])
    model = vitkit.VisionTransformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_padded_batch_of_two_aspect_ratios_gives_each_image_alone(family):
    model = tiny(family)
    images = [torch.randn(3, 37, 61), torch.randn(3, 50, 21)]
    batch = naflex_batch(images, patch_size=8, max_patches=20)
    assert batch.grids.tolist() == [[4, 5], [6, 3]]  # 20 and 18 patches of 8 px within a budget of 20
    assert batch.mask.sum(1).tolist() == [20, 18]
    with torch.no_grad():
        logits, features = model(batch), model.forward_features(batch)
        for index, image in enumerate(images):
            rows, cols = batch.grids[index].tolist()
            alone = torch.nn.functional.interpolate(image[None], size=(rows * 8, cols * 8), mode="bilinear",
                                                    antialias=True)
            torch.testing.assert_close(logits[index], model(alone)[0], atol=1e-5, rtol=0)
            valid = model.num_prefix_tokens + rows * cols
            torch.testing.assert_close(features[index, :valid], model.forward_features(alone)[0], atol=1e-5, rtol=0)


def test_patches_in_any_order_are_placed_by_their_coordinates():
    """Shuffling the real patches (with their coordinates) leaves the pooled output unchanged."""
    model = tiny("dinov3")
    batch = naflex_batch([torch.randn(3, 24, 40)], patch_size=8, max_patches=16)
    order = torch.randperm(16)
    shuffled = PatchBatch(batch.patches[:, order], batch.coords[:, order], batch.mask[:, order], batch.grids)
    with torch.no_grad():
        torch.testing.assert_close(model(shuffled), model(batch), atol=1e-5, rtol=0)


@pytest.mark.parametrize("height,width,budget", [(37, 61, 20), (480, 640, 256), (1000, 10, 64), (8, 8, 1),
                                                 (224, 224, 196), (300, 1000, 1024)])
def test_patch_budget_is_siglip2s(height, width, budget):
    from transformers.models.siglip2.image_processing_siglip2 import get_image_size_for_max_num_patches

    assert size_for_patch_budget(height, width, 16, budget) == get_image_size_for_max_num_patches(
        height, width, 16, budget)


def test_patchify_is_siglip2s_order():
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    image = torch.randn(3, 32, 48)
    torch.testing.assert_close(patchify(image, 16), convert_image_to_patches(image, 16), atol=0, rtol=0)


def test_bad_batches_are_refused_in_one_line():
    model = tiny("dinov3")
    batch = naflex_batch([torch.randn(3, 24, 40)], patch_size=8, max_patches=16)
    outside = PatchBatch(batch.patches, batch.coords.clone(), batch.mask, batch.grids)
    outside.coords[0, 2] = torch.tensor([7, 0])
    with pytest.raises(vitkit.InputError, match=r"NaFlex patch 2 of image 0 at \(row, column\) \(7, 0\) lies outside "
                                                r"its grid \(3, 5\)"):
        model(outside)
    empty = PatchBatch(batch.patches, batch.coords, torch.zeros_like(batch.mask), batch.grids)
    with pytest.raises(vitkit.InputError, match="NaFlex mask of image 0 is empty"):
        model(empty)
    with pytest.raises(vitkit.InputError, match=r"max_patches=0; expected an int >= 1"):
        naflex_batch([torch.randn(3, 24, 40)], patch_size=8, max_patches=0)
    wrong = PatchBatch(batch.patches[..., :-1], batch.coords, batch.mask, batch.grids)
    with pytest.raises(vitkit.InputError, match=r"expected floating-point \(batch, patches, 192\)"):
        model(wrong)
    with pytest.raises(vitkit.InputError, match="forward_intermediates takes"):
        model.forward_intermediates(batch)


@pytest.mark.parametrize("architecture", ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_map",
                                          "naflexvit_base_patch16_siglip", "naflexvit_so150m2_patch16_reg1_map"])
@pytest.mark.parametrize("saved", ["hub", "bare"])
def test_timm_naflexvit_gives_timms_outputs_on_a_padded_batch(tmp_path, architecture, saved):
    """timm's NaFlexViT, saved as timm saves it, on images and on one padded batch of two aspect ratios."""
    timm = pytest.importorskip("timm")
    from interop_helpers import randomised
    from safetensors.torch import save_file
    from timm.models._hub import save_for_hf

    theirs = randomised(timm.create_model(architecture, img_size=32, patch_size=8, embed_dim=64, depth=2,
                                          num_heads=4, num_classes=5), std=0.1)
    if saved == "hub":
        save_for_hf(theirs, str(tmp_path / "hub"))
        model = vitkit.load(tmp_path / "hub")
    else:  # a bare state dict does not say its pooling or activation: told as overrides
        save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "w.safetensors")
        # SigLIP 2's layout (no prefix, no LayerScale) tells its settings; the others' pooling is told
        told = {"gap": dict(pool="gap", fc_norm=True), "map": dict(pool="map")}.get(architecture.split("_")[-1], {})
        model = vitkit.load(tmp_path / "w.safetensors", num_heads=4, **told)
    batch = naflex_batch([torch.randn(3, 37, 61), torch.randn(3, 50, 21)], patch_size=8, max_patches=20)
    with torch.no_grad():
        x = torch.randn(2, 3, 32, 48)
        torch.testing.assert_close(model(x), theirs(x), atol=1e-5, rtol=0)
        expected = theirs({"patches": batch.patches, "patch_coord": batch.coords, "patch_valid": batch.mask})
        torch.testing.assert_close(model(batch), expected, atol=1e-5, rtol=0)


def test_a_bare_naflexvit_told_its_pool_takes_that_pools_norm(tmp_path):
    """pool='gap', as the refusal of a bare NaFlexViT suggests, reads timm's _gap definition: fc_norm after the
    average, as timm sets it (not the final norm of the _map one)."""
    timm = pytest.importorskip("timm")
    from interop_helpers import randomised

    theirs = randomised(timm.create_model("naflexvit_base_patch16_gap", img_size=32, embed_dim=64, depth=2,
                                          num_heads=4, num_classes=5), std=0.1)
    torch.save(theirs.state_dict(), tmp_path / "w.pth")
    model = vitkit.load(tmp_path / "w.pth", pool="gap", num_heads=4)
    assert model.config.fc_norm
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x), atol=1e-5, rtol=0)


def test_eval_with_max_patches_runs_each_image_at_its_own_aspect_ratio(tmp_path):
    """Images already sized in whole patches within the budget are not resized: `vitkit eval --max-patches`
    then scores each image as the model does alone at its size (images of 16x24, 24x8 and 8x8 px)."""
    import json

    import numpy as np
    from PIL import Image

    from vitkit.cli import main

    model = tiny("dinov3")
    model.reset_head(2)
    with torch.no_grad():
        model.head.weight.normal_()
    model.save(tmp_path / "model")
    rng = np.random.default_rng(0)
    expected = []
    for index, (height, width) in enumerate([(16, 24), (24, 8), (8, 8), (16, 16), (8, 24)]):
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        label = index % 2
        (tmp_path / "data" / "test" / f"c{label}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "train" / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(tmp_path / "data" / "test" / f"c{label}" / f"{index}.png")
        image = (torch.from_numpy(pixels).permute(2, 0, 1).float() / 255 - 0.5) / 0.5  # Google's statistics
        with torch.no_grad():
            expected.append(int(model(image[None]).argmax()) == label)
    assert main(["eval", str(tmp_path / "model"), "--dataset", f"imagefolder:{tmp_path / 'data'}", "--max-patches",
                 "6", "--batch-size", "3", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval-test.json").read_text())
    assert report["images"] == 5
    assert report["top1"] == pytest.approx(sum(expected) / 5)


def test_predict_and_analyze_with_max_patches_keep_each_aspect_ratio(tmp_path):
    """`predict --max-patches` gives each image's dense features on the grid of SigLIP 2's budget for its size, equal
    to the model's on the image resized there; `analyze --max-patches` rolls each image out on its own grid."""
    import json

    import numpy as np
    from PIL import Image

    from vitkit.cli import main

    model = tiny("dinov3")
    model.save(tmp_path / "model")
    paths = []
    for index, (height, width) in enumerate([(37, 61), (50, 21)]):
        paths.append(tmp_path / f"{index}.png")
        Image.fromarray(np.random.default_rng(index).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
            paths[-1])
    assert main(["predict", str(tmp_path / "model"), *map(str, paths), "--max-patches", "20",
                 "--features", str(tmp_path / "f.npz")]) == 0
    saved = np.load(tmp_path / "f.npz")
    dense = [saved[key] for key in sorted(saved.files) if "embedding" not in key and saved[key].ndim == 3]
    assert [d.shape[1:] for d in dense] == [(4, 5), (6, 3)]  # 20 and 18 patches: SigLIP 2's sizes for the budget
    for path, features in zip(paths, dense):
        pixels = torch.from_numpy(np.array(Image.open(path))).permute(2, 0, 1).float()
        rows, cols = features.shape[1:]
        resized = torch.nn.functional.interpolate(pixels[None], size=(rows * 8, cols * 8), mode="bilinear",
                                                  antialias=True)
        with torch.no_grad():
            tokens = model.forward_features((resized / 255 - 0.5) / 0.5)
        expected = tokens[0, model.num_prefix_tokens:].T.reshape(-1, rows, cols)
        assert np.abs(features - expected.numpy()).max() < 0.05  # uint8 rounding of the resized pixels aside
    assert main(["analyze", str(tmp_path / "model"), "--images", *map(str, paths), "--max-patches", "20",
                 "--out", str(tmp_path / "analysis")]) == 0
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    assert summary["image_size"] == [[32, 40], [48, 24]]
    assert [np.load(tmp_path / "analysis" / f"rollout_00{i}.npy").shape for i in (0, 1)] == [(4, 5), (6, 3)]


def test_naflexvit_variants_vitkit_does_not_compute_are_refused(tmp_path):
    """Sampling the table at each patch (grid_sample) and factorised tables are refused by name."""
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    theirs = timm.create_model("naflexvit_base_patch16_map", img_size=32, patch_size=8, embed_dim=64, depth=1,
                               num_heads=4, pos_embed_use_grid_sample=True)
    save_for_hf(theirs, str(tmp_path / "hub"), model_args=dict(pos_embed_use_grid_sample=True))
    with pytest.raises(vitkit.CheckpointError, match="a NaFlexViT with pos_embed_use_grid_sample=True"):
        vitkit.load(tmp_path / "hub")
    save_for_hf(theirs, str(tmp_path / "par"))
    import json
    config = json.loads((tmp_path / "par" / "config.json").read_text())
    (tmp_path / "par" / "config.json").write_text(json.dumps({**config, "architecture": "naflexvit_base_patch16_parfac_gap"}))
    with pytest.raises(vitkit.CheckpointError, match="not factorised tables"):
        vitkit.load(tmp_path / "par")


@pytest.mark.parametrize("pos_embed", ["sincos-2d", "learned"])
def test_position_and_rotary_tables_follow_the_inputs_device(pos_embed):
    """Tables made without parameters are moved to the patches' device (the meta device stands in for a GPU)."""
    config = vitkit.ViTConfig(image_size=32, patch_size=8, dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3,
                              pos_embed=pos_embed, rope="axial")
    model = vitkit.VisionTransformer(config).to("meta")
    assert model(torch.randn(2, 3, 48, 40, device="meta")).device.type == "meta"  # another grid: computed tables


def test_eval_with_max_patches_refuses_streamed_shards_in_one_line(tmp_path, capsys):
    from data_helpers import numbered_shards

    from vitkit.cli import main

    numbered_shards(tmp_path / "shards", "test", [4])
    numbered_shards(tmp_path / "shards", "train", [4])
    model = tiny("dinov3")
    model.reset_head(4)
    model.save(tmp_path / "model")
    assert main(["eval", str(tmp_path / "model"), "--dataset", f"webdataset:{tmp_path / 'shards'}",
                 "--max-patches", "6", "--out", str(tmp_path / "eval")]) == 2
    assert "--max-patches reads datasets with indexed images" in capsys.readouterr().err
