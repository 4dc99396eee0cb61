"""NVIDIA's C-RADIO from timm (``vit_*_patch16_radio_v3/v4`` and ``naflexvit_*_patch16_radio_v3/v4`` hub
directories) and transformers (``RadioModel``), made by the peers' own code with random weights: [class] then the
other class tokens and registers, the cropped position table (resized to a square of the grid's longer side, then
cropped; corners aligned in timm's v3-B and v3-H, not in transformers), no final norm, CLIP's statistics (inside
transformers' model); the peers' summary, spatial features and tokens at the native size, at another and as NaFlex
or packed batches; what writers cannot hold refused by name."""

import json

import pytest
import torch
from interop_helpers import assert_timms_outputs, randomised

import vitkit
from vitkit.cli import main
from vitkit.models.naflex import patch_batch
from vitkit.normalization import NORMALIZATION

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
OTHER = (16, 48)  # 16x48 pixels: a 2 x 6 grid of 8-pixel patches


@pytest.mark.parametrize("architecture,corners", [("vit_base_patch16_radio_v3", True),
                                                  ("vit_large_patch16_radio_v3", False),
                                                  ("vit_huge_patch16_radio_v4", False)])
def test_timm_radio_gives_timms_outputs_at_its_size_and_as_timm_loads_it_at_another(tmp_path, architecture, corners):
    """At another size timm's vit_*_radio resize the table of the model's grid as they load their weights (bilinear,
    no antialias, corners as the checkpoint's code): compared with timm's model built at that size from the file."""
    from timm.models._hub import save_for_hf

    peer = randomised(timm.create_model(architecture, **SMALL, num_classes=5), std=0.1)
    save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    c = model.config
    assert (c.pos_interp, c.pos_interp_antialias, c.pos_interp_align_corners) == ("bilinear", False, corners)
    assert (c.final_norm, c.reg_tokens, c.provenance.normalization) == (False, 7 if "v3" in architecture else 9, "clip")
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in peer.parameters())
    resized = timm.create_model(architecture, **{**SMALL, "img_size": OTHER}, num_classes=5, pretrained=True,
                                pretrained_cfg_overlay=dict(file=str(tmp_path / "hub" / "model.safetensors"),
                                                            num_classes=5))  # its head kept
    for theirs, size in ((peer, (32, 32)), (resized.eval(), OTHER)):
        assert assert_timms_outputs(model, theirs, torch.randn(2, 3, *size)).abs().max() > 0.1


def test_timm_radio_is_written_back_for_timms_own_definition(tmp_path):
    """timm's vit_*_radio state dict back from vitkit: timm's model of that definition loads it strictly."""
    from safetensors.torch import load_file
    from timm.models._hub import save_for_hf

    from vitkit.checkpoints import export

    peer = randomised(timm.create_model("vit_large_patch16_radio_v3", **SMALL, num_classes=5), std=0.1)
    save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=True)
    written = export(vitkit.load(tmp_path / "hub"), tmp_path / "back.safetensors", "timm")
    fresh = timm.create_model("vit_large_patch16_radio_v3", **SMALL, num_classes=5)
    fresh.load_state_dict(load_file(written), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(x), peer(x), atol=0, rtol=0)


NAFLEX = dict(SMALL, pos_embed_grid_size=(12, 12))  # a table of its own grid (C-RADIO's is 128 x 128)


@pytest.mark.parametrize("architecture,corners", [("naflexvit_base_patch16_radio_v3", True),
                                                  ("naflexvit_so400m_patch16_radio_v4", False),
                                                  ("naflexvit_base_patch16_par_gap", False)])
def test_timm_naflexvit_radio_crops_its_table_as_timm_does(tmp_path, architecture, corners):
    """timm's NaFlexViT of C-RADIO (and the aspect-preserving par_gap): a 12 x 12 table resized to a square of the
    grid's longer side and cropped, at the native size, at another and on a padded batch of two aspect ratios."""
    from timm.models._hub import save_for_hf

    mlp = dict(mlp_ratio=4) if "so400m" in architecture else {}
    peer = randomised(timm.create_model(architecture, **NAFLEX, num_classes=5, **mlp), std=0.1)
    save_for_hf(peer, str(tmp_path / "hub"))
    model = vitkit.load(tmp_path / "hub")
    c = model.config
    assert (c.pos_interp_crop, c.pos_grid, c.image_size, c.pos_interp_align_corners) == (True, (12, 12), (32, 32),
                                                                                         corners)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in peer.parameters())
    for size in ((32, 32), OTHER, (96, 96)):  # 96 px: the table's own grid, taken as it is
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            features = peer.forward_features(x)
            torch.testing.assert_close(model.forward_features(x), features, atol=1e-5, rtol=0)
            torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)
    batch = patch_batch([torch.randn(3, 16, 48), torch.randn(3, 32, 24)], patch_size=8, max_patches=16)
    with torch.no_grad():
        theirs = peer.forward_features(batch.patches, batch.coords, batch.mask)["patches"]
        ours = model.forward_features(batch)
        valid = torch.cat([batch.mask.new_ones(2, model.num_prefix_tokens), batch.mask], dim=1)
        torch.testing.assert_close(ours[valid], theirs[valid], atol=1e-5, rtol=0)  # padding's rows are nobody's
        torch.testing.assert_close(model.forward_head(ours, pre_logits=True, mask=batch.mask),
                                   peer.forward_head(theirs, pre_logits=True, patch_valid=batch.mask), atol=1e-5,
                                   rtol=0)
        inputs = {"patches": batch.patches, "patch_coord": batch.coords, "patch_valid": batch.mask}
        torch.testing.assert_close(model(batch), peer(inputs), atol=1e-5, rtol=0)


HF = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2.0, patch_size=8, max_img_size=96,
          image_size=32, num_cls_tokens=3, num_registers=2, summary_idxs=[0, 2])


def hf_radio(tmp_path, **kwargs):
    peer = randomised(transformers.RadioModel(transformers.RadioConfig(**{**HF, **kwargs})), std=0.1)
    with torch.no_grad():  # the conditioner's statistics are CLIP's, as C-RADIO's are
        peer.input_conditioner.norm_mean.copy_(torch.tensor(NORMALIZATION["clip"][0]).view(3, 1, 1))
        peer.input_conditioner.norm_std.copy_(torch.tensor(NORMALIZATION["clip"][1]).view(3, 1, 1))
        peer.summary_idxs.copy_(torch.tensor(kwargs.get("summary_idxs", HF["summary_idxs"])))
    peer.save_pretrained(tmp_path / "hf")
    return peer


def normalised(x):
    """What vitkit's model takes: the [0, 1] pixels normalised by CLIP's statistics (C-RADIO's conditioner)."""
    mean, std = (torch.tensor(values).view(-1, 1, 1) for values in NORMALIZATION["clip"])
    return (x - mean) / std


@pytest.mark.parametrize("variant", [{}, dict(use_swiglu_ffn=True, hidden_act="gelu_pytorch_tanh"),
                                     dict(num_cls_tokens=1, num_registers=0, summary_idxs=[0])])
def test_transformers_radio_gives_its_summary_features_and_tokens(tmp_path, variant):
    peer = hf_radio(tmp_path, **variant)
    model = vitkit.load(tmp_path / "hf")
    c = model.config
    assert (c.pos_interp_crop, c.pos_grid, c.image_size, c.pos_interp_align_corners) == (True, (12, 12), (32, 32),
                                                                                         False)
    assert c.summary_tokens == (None if variant.get("summary_idxs") == [0] else (0, 2))
    assert (c.final_norm, c.patch_bias, c.provenance.normalization) == (False, False, "clip")
    prefix = model.num_prefix_tokens
    for size in ((32, 32), OTHER, (96, 96), (104, 8)):  # 104 px: past the table, resized up
        x = torch.rand(2, 3, *size)
        with torch.no_grad():
            theirs = peer(pixel_values=x)
            tokens = model.forward_features(normalised(x))
            torch.testing.assert_close(tokens, theirs.last_hidden_state, atol=1e-5, rtol=0)
            torch.testing.assert_close(tokens[:, prefix:], theirs.features, atol=1e-5, rtol=0)
            torch.testing.assert_close(model(normalised(x)), theirs.summary, atol=1e-5, rtol=0)
            torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), theirs.summary, atol=1e-5, rtol=0)
        assert theirs.summary.abs().max() > 0.1


def test_transformers_packed_images_are_vitkits_naflex_batches(tmp_path):
    """RadioModel's packed patches with image_grid_hw: each image attends to itself; the same images as a NaFlex
    batch (patches flattened channels last, padded, masked) give its summaries and its patch features in order."""
    peer = hf_radio(tmp_path)
    model = vitkit.load(tmp_path / "hf")
    images = [torch.rand(3, 16, 48), torch.rand(3, 32, 24)]
    packed = torch.cat([image.reshape(3, h // 8, 8, w // 8, 8).permute(1, 3, 0, 2, 4).reshape(-1, 3 * 64)
                        for image, (h, w) in ((image, image.shape[1:]) for image in images)])
    grids = torch.tensor([[2, 6], [4, 3]])
    batch = patch_batch([normalised(image) for image in images], patch_size=8, max_patches=14)
    with torch.no_grad():
        theirs = peer(pixel_values=packed, image_grid_hw=grids)
        tokens = model.forward_features(batch)
        torch.testing.assert_close(model(batch), theirs.summary, atol=1e-5, rtol=0)
        ours = tokens[:, model.num_prefix_tokens:][batch.mask]
        torch.testing.assert_close(ours, theirs.features, atol=1e-5, rtol=0)


def test_radio_summary_and_table_travel_through_vitkits_format_and_writers_refuse_them(tmp_path):
    """vitkit's own format keeps them; timm's NaFlexViT of C-RADIO pools [class] alone, HF's ViT and Google's npz
    have no cropped table: refused by name."""
    from vitkit.checkpoints import export

    hf_radio(tmp_path)
    model = vitkit.load(tmp_path / "hf")
    again = vitkit.load(model.save(tmp_path / "native"))
    x = normalised(torch.rand(1, 3, 16, 48))
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), atol=0, rtol=0)
    assert json.loads((tmp_path / "native" / "config.json").read_text())["summary_tokens"] == [0, 2]
    for fmt, name, words in (("timm", "timm-out", r"naflexvit_\*_radio cannot hold summary_tokens=\(0, 2\)"),
                             ("hf", "hf-out", "pos_interp_crop=True"), ("npz", "m.npz", "pos_interp_crop=True")):
        with pytest.raises(vitkit.CheckpointError, match=words):
            export(model, tmp_path / name, fmt)


def test_radio_resized_for_good_is_the_model_at_that_size(tmp_path):
    """load(..., image_size=) resamples the table once (cropped as C-RADIO crops): the same outputs there."""
    hf_radio(tmp_path)
    model, resized = vitkit.load(tmp_path / "hf"), vitkit.load(tmp_path / "hf", image_size=OTHER)
    assert (resized.config.pos_grid, resized.config.image_size) == (None, OTHER)
    x = normalised(torch.rand(2, 3, *OTHER))
    with torch.no_grad():
        torch.testing.assert_close(resized(x), model(x), atol=1e-6, rtol=0)


def test_info_describes_radio(tmp_path, capsys):
    hf_radio(tmp_path)
    assert main(["info", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "pos_interp_crop=True" in out and "summary_tokens=(0, 2)" in out and "input        3x32x32" in out


def test_radio_configs_that_do_not_fit_are_one_line_errors(tmp_path):
    hf_radio(tmp_path)
    with pytest.raises(vitkit.CheckpointError, match="a C-RADIO state dict in NVIDIA's layout, whose class tokens"):
        vitkit.load(tmp_path / "hf" / "model.safetensors")  # the weights without the config that tells them
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "num_registers": 3}))
    with pytest.raises(vitkit.CheckpointError, match=r"cls_token.token of shape \(5, 64\); expected num_cls_tokens "
                                                     r"\+ num_registers = 6 rows"):
        vitkit.load(tmp_path / "hf")
    with pytest.raises(vitkit.ConfigError, match="summary_tokens: expected null, or indices of the 3 prefix tokens"):
        vitkit.ViTConfig(reg_tokens=2, summary_tokens=(0, 3))


def test_position_analysis_reads_the_table_as_the_model_uses_it_at_its_size(tmp_path):
    """The table of C-RADIO's own 12 x 12 grid, as the model resamples and crops it at its native 4 x 4 grid:
    transformers' own interpolation there."""
    from vitkit.analysis.embeddings import position_table

    peer = hf_radio(tmp_path)
    table, grid = position_table(vitkit.load(tmp_path / "hf"))
    assert grid == (4, 4)
    with torch.no_grad():
        theirs = peer.embeddings._interpolate_position_embedding((4, 4), torch.float32)[0]
    torch.testing.assert_close(table, theirs, atol=1e-6, rtol=0)



@pytest.mark.parametrize("source", ["timm", "transformers"])
def test_radio_is_written_back_as_timms_naflexvit_radio(tmp_path, source):
    """A hub directory that timm's own local-dir loader builds (naflexvit_*_radio with its model_args) and fills
    strictly: the same outputs on images and NaFlex batches, read back by vitkit alike."""
    from timm.models._hub import save_for_hf

    from vitkit.checkpoints import export

    if source == "timm":
        peer = randomised(timm.create_model("naflexvit_base_patch16_radio_v3", **NAFLEX), std=0.1)
        save_for_hf(peer, str(tmp_path / "in"))
        model = vitkit.load(tmp_path / "in")
    else:  # one summary token, [class]: what timm's pool reads
        hf_radio(tmp_path, summary_idxs=[0], hidden_act="gelu_pytorch_tanh")
        model = vitkit.load(tmp_path / "hf")
    export(model, tmp_path / "out", "timm")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    again = vitkit.load(tmp_path / "out")
    batch = patch_batch([torch.randn(3, 16, 48), torch.randn(3, 32, 24)], patch_size=8, max_patches=16)
    inputs = {"patches": batch.patches, "patch_coord": batch.coords, "patch_valid": batch.mask}
    with torch.no_grad():
        for x in (torch.randn(2, 3, 32, 32), torch.randn(2, 3, *OTHER)):
            torch.testing.assert_close(theirs(x), model(x), atol=1e-5, rtol=0)
            torch.testing.assert_close(again(x), model(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(theirs(inputs), model(batch), atol=1e-5, rtol=0)
