"""The Qwen VL vision towers (issue 37), made tiny by timm's and transformers' own code with every weight random, saved
as they save them, and read by vitkit: timm's qwen3_vit_* (patch tokens, merger tokens, logits and pre-logits at the
native size, at a non-square one and as NaFlex and packed batches; written back to timm; its parameter counts), and
transformers' Qwen2.5-VL tower on its own image processor's packed patches of two images of different sizes (the
last block's rows and the merger's tokens); bad input refused in one line."""


import pytest
import torch
from interop_helpers import assert_runs_as_pytorch, exported_runtimes, randomised
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.errors import InputError
from vitkit.models.naflex import patch_batch
from vitkit.models.packed import PackedBatch

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=0)
SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, pos_embed_grid_size=6)
SIZES = ((32, 32), (16, 48))  # the native size and a non-square one, both in whole 2 x 2 cells of 8 px patches


def timm_peer(architecture, **kwargs):
    torch.manual_seed(0)
    return randomised(timm.create_model(architecture, **{**SMALL, **kwargs}), std=0.3)


def tokens(nhwc):
    """timm's (B, H, W, D) patch tokens as (B, N, D), row by row."""
    return nhwc.flatten(1, 2)


def naflex():
    """Two images of their own sizes (whole 2 x 2 cells of patches) padded to 16 patches each."""
    torch.manual_seed(2)
    images = [torch.rand(3, 32, 16), torch.rand(3, 16, 48)]
    return images, patch_batch(images, 8, 16)


@pytest.mark.parametrize("pool", ["merge", "avg"])
def test_timm_encoder_gives_timms_patch_and_merger_tokens(tmp_path, pool):
    from timm.models._hub import save_for_hf

    theirs = timm_peer("qwen3_vit_88m_enc", out_features=24, global_pool=pool)
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "bare.safetensors")
    models = [vitkit.load(tmp_path / "hub")] + ([vitkit.load(tmp_path / "bare.safetensors", num_heads=2)] if pool == "merge" else [])
    for model in models:
        c = model.config
        assert (c.pool, c.merge_size, c.merge_dim, c.pos_grid) == (("merge", 2, 24, (6, 6)) if pool == "merge" else
                                                                   ("gap", 0, 0, (6, 6)))
        assert c.provenance.normalization == "google" and c.image_size == ((32, 32) if model is models[0] else
                                                                           (768, 768))
        for size in SIZES:
            images = torch.rand(2, 3, *size)
            with torch.no_grad():
                features = model.forward_features(images)
                torch.testing.assert_close(features, tokens(theirs.forward_features(images)), **TOL)
                out = theirs(images)
                torch.testing.assert_close(model(images), out, **TOL)
                torch.testing.assert_close(model.forward_head(features, pre_logits=True), out, **TOL)
            assert features.abs().max() > 0.5
            assert out.shape == ((2, size[0] * size[1] // 256, 24) if pool == "merge" else (2, 32))
        images, batch = naflex()
        with torch.no_grad():
            mine = model(batch)
            for i, image in enumerate(images):
                out = theirs(image[None])[0]
                torch.testing.assert_close(mine[i, :len(out)] if pool == "merge" else mine[i], out, **TOL)


@pytest.mark.parametrize("architecture", ["qwen3_vit_88m", "qwen3_vit_88m_merge"])
def test_timm_classifier_gives_timms_logits_and_pre_logits(tmp_path, architecture):
    from timm.models._hub import save_for_hf

    theirs = timm_peer(architecture, num_classes=5, out_features=24)
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "bare.safetensors")
    merged = architecture.endswith("_merge")
    models = [vitkit.load(tmp_path / "hub")] + ([vitkit.load(tmp_path / "bare.safetensors", num_heads=2)] if merged else [])
    for model in models:
        assert (model.config.pool, model.config.fc_norm, model.config.fc_norm_scale) == ("gap", True, False)
        for size in SIZES:
            images = torch.rand(2, 3, *size)
            with torch.no_grad():
                features = theirs.forward_features(images)
                if not merged:
                    torch.testing.assert_close(model.forward_features(images), tokens(features), **TOL)
                torch.testing.assert_close(model(images), theirs(images), **TOL)
                torch.testing.assert_close(model.forward_head(model.forward_features(images), pre_logits=True),
                                           theirs.forward_head(features, pre_logits=True), **TOL)
        images, batch = naflex()
        with torch.no_grad():
            torch.testing.assert_close(model(batch), torch.cat([theirs(image[None]) for image in images]), **TOL)


def test_timm_qwen3_is_written_back(tmp_path):
    theirs = timm_peer("qwen3_vit_88m_merge", num_classes=5, out_features=24)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "bare.safetensors")
    model = vitkit.load(tmp_path / "bare.safetensors", num_heads=2)
    for name in ("hub", "state.safetensors"):
        vitkit.checkpoints.timm.write_timm(model, tmp_path / name)
    again = timm.create_model(f"local-dir:{tmp_path / 'hub'}", pretrained=True).eval()
    written = load_file(tmp_path / "state.safetensors")
    assert written.keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        torch.testing.assert_close(written[key], value, atol=0, rtol=0)
    images = torch.rand(2, 3, 16, 48)
    with torch.no_grad():
        torch.testing.assert_close(again(images), theirs(images), atol=0, rtol=0)


@pytest.mark.parametrize("name, architecture", [("Qwen3ViT-88M/16", "qwen3_vit_88m_enc"),
                                                ("Qwen3ViT-306M/16", "qwen3_vit_306m_enc"),
                                                ("Qwen3ViT-416M/16", "qwen3_vit_416m_enc")])
def test_named_variants_have_timms_parameter_counts(name, architecture):
    with torch.device("meta"):
        theirs = timm.create_model(architecture, out_features=2048)
        mine = vitkit.create_model(name, merge_dim=2048)
    assert sum(p.numel() for p in mine.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_a_packed_batch_for_a_model_with_a_class_token_is_refused():
    model = vitkit.create_model("ViT-Ti/16", image_size=32, depth=1).eval()
    batch = PackedBatch(torch.rand(4, 768), torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]]), torch.zeros(4).long(),
                        torch.tensor([[2, 2]]))
    with pytest.raises(InputError, match="packed batches need .* no prefix tokens .* this model has 1 prefix tokens"):
        model(batch)


@pytest.mark.parametrize("architecture", ["qwen3_vit_88m_enc", "qwen3_vit_88m_merge"])
def test_onnx_gives_pytorchs_merger_tokens_and_logits_at_any_size(tmp_path, architecture):
    pytest.importorskip("onnxruntime")
    from timm.models._hub import save_for_hf

    from vitkit.checkpoints import export
    from vitkit.checkpoints.onnx import OnnxModel

    save_for_hf(timm_peer(architecture, num_classes=5, out_features=24), str(tmp_path / "hub"),
                safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    assert export(model, tmp_path / "m.onnx", "onnx").max_difference <= 1e-5
    assert_runs_as_pytorch(OnnxModel(tmp_path / "m.onnx"), model, **TOL)


def test_info_names_the_options_and_the_merger(tmp_path, capsys):
    from timm.models._hub import save_for_hf

    from vitkit.cli import main

    save_for_hf(timm_peer("qwen3_vit_88m_enc", out_features=24), str(tmp_path / "hub"), safe_serialization=True)
    assert main(["info", str(tmp_path / "hub")]) == 0
    out = capsys.readouterr().out
    for part in ("qwen3_vit_88m_enc", "merge_size=2", "GELU tanh, LayerNorm eps 1e-06", "normalised 'google'",
                 "pooling 'merge' of the patch merger's 24-wide tokens, one per 2x2 cell"):
        assert part in out, part


def test_the_qwen_variants_come_last():
    from vitkit.models.registry import QWEN_VARIANTS

    assert vitkit.list_models()[-len(QWEN_VARIANTS):] == list(QWEN_VARIANTS)


# ------------------------------------------------------------------------------------------ Qwen2.5-VL (transformers)
def hf_vision_config(**kwargs):
    base = dict(depth=4, hidden_size=32, intermediate_size=40, num_heads=2, patch_size=8, spatial_merge_size=2,
                temporal_patch_size=2, window_size=32, out_hidden_size=24, fullatt_block_indexes=[1, 3])
    return transformers.Qwen2_5_VLVisionConfig(**{**base, **kwargs})


def hf_tower(**kwargs):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    torch.manual_seed(0)
    return randomised(Qwen2_5_VisionTransformerPretrainedModel(hf_vision_config(**kwargs)), std=0.3)


def processed():
    """transformers' own image processor of Qwen2-VL / Qwen2.5-VL (8 px patches) on two images of different sizes:
    the packed patches and their grid_thw (grids of 6 x 10 and 8 x 4 patches: windows of 4 x 4 patches cut)."""
    processor = transformers.Qwen2VLImageProcessor(patch_size=8, merge_size=2, temporal_patch_size=2,
                                                   size={"shortest_edge": 16 * 16, "longest_edge": 64 * 64 * 4})
    torch.manual_seed(4)
    images = [torch.randint(0, 256, (3, 48, 80), dtype=torch.uint8), torch.randint(0, 256, (3, 64, 32),
                                                                                   dtype=torch.uint8)]
    out = processor(images=images, return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 6, 10], [1, 8, 4]]
    return out["pixel_values"], out["image_grid_thw"]


# The kernel summed over its two frames (rounded once to float32) gives the Conv3d's patch embeddings within float32's
# rounding, 1e-6 of their size (values of 20 with these random weights): in float64 the whole tower is within 1e-5 of
# transformers' (7e-7), in float32 within 2e-6 of each value.
TOL_OF = {torch.float64: TOL, torch.float32: dict(atol=1e-5, rtol=2e-6)}


def hf_run(peer, pixels, grid):
    """transformers' last block's rows, put back in the patches' order (it returns them in its windows' order), and
    its merger's tokens."""
    from transformers.vision_utils import get_vision_window_index

    with torch.no_grad():
        out = peer(hidden_states=pixels, grid_thw=grid)
    windows, _ = get_vision_window_index(grid, 2, peer.config.window_size, peer.config.patch_size)
    rows = out.last_hidden_state.reshape(-1, 4, out.last_hidden_state.shape[-1])[windows.argsort()].flatten(0, 1)
    return rows, out.pooler_output


def test_transformers_tower_gives_its_rows_and_merger_tokens_on_its_processors_patches(tmp_path):
    from vitkit.checkpoints.qwen import packed_batch_from_hf

    peer = hf_tower()
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    c = model.config
    assert (c.attn_window, c.global_blocks, c.merge_size, c.merge_dim, c.norm, c.mlp, c.patch_bias) == (
        4, (1, 3), 2, 24, "rms", "swiglu", False)
    assert c.provenance.format == "hf-qwen2_5_vl" and c.provenance.normalization == "clip"
    pixels, grid = processed()
    batch = packed_batch_from_hf(pixels, grid)
    for dtype in (torch.float64, torch.float32):
        rows, merged = hf_run(peer.to(dtype), pixels.to(dtype), grid)
        with torch.no_grad():
            features = model.to(dtype).forward_features(batch.to("cpu", dtype))
            torch.testing.assert_close(features, rows, **TOL_OF[dtype])
            torch.testing.assert_close(model.forward_head(features, pre_logits=True), merged, **TOL_OF[dtype])
            torch.testing.assert_close(model.forward_head(features, pre_logits=True, grid=batch), merged,
                                       **TOL_OF[dtype])
            torch.testing.assert_close(model(batch.to("cpu", dtype)), merged, **TOL_OF[dtype])
        assert features.shape == (6 * 10 + 8 * 4, 32) and merged.shape == (23, 24) and rows.abs().max() > 5


def test_transformers_tower_on_image_tensors_gives_its_outputs(tmp_path):
    """An image tensor and a NaFlex batch of the processor's images give the same rows and tokens, each in its own
    order: the grid's rows for a tensor, cells row by row for the merger."""
    from vitkit.checkpoints.qwen import packed_batch_from_hf

    peer = hf_tower()
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    pixels, grid = processed()
    rows, merged = hf_run(peer, pixels, grid)
    packed = packed_batch_from_hf(pixels, grid)
    first = packed.images == 0
    image = torch.zeros(1, 3, 48, 80)  # the first image put back together from its patches, (ph, pw, C) each
    for (row, col), patch in zip(packed.coords[first].tolist(), packed.patches[first]):
        image[0, :, row * 8:row * 8 + 8, col * 8:col * 8 + 8] = patch.reshape(8, 8, 3).permute(2, 0, 1)
    order = packed.coords[first, 0] * 10 + packed.coords[first, 1]
    with torch.no_grad():
        features = model.forward_features(image)
        torch.testing.assert_close(features[0, order], rows[first], **TOL_OF[torch.float32])
        torch.testing.assert_close(model(image)[0], merged[:15], **TOL_OF[torch.float32])
        naflex = model(patch_batch([image[0], torch.zeros(3, 16, 16)], 8, 60))
        torch.testing.assert_close(naflex[0], merged[:15], **TOL_OF[torch.float32])


def test_the_vision_tower_of_a_whole_qwen2_5_vl_model_is_read(tmp_path):
    """A whole Qwen2.5-VL model saved in shards: the tower's tensors alone are read."""
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                            mrope_section=[2, 3, 3]))
    whole = transformers.Qwen2_5_VLForConditionalGeneration(transformers.Qwen2_5_VLConfig(
        text_config=text, vision_config=hf_vision_config().to_dict()))
    tower = randomised(whole.model.visual, std=0.3)
    whole.save_pretrained(tmp_path / "whole", max_shard_size="20KB")
    assert (tmp_path / "whole" / "model.safetensors.index.json").exists()
    with pytest.warns(UserWarning, match=r"a whole Qwen2.5-VL model; its vision tower \((model\.)?visual\.\*\) is read"):
        model = vitkit.load(tmp_path / "whole")
    pixels, grid = processed()
    from vitkit.checkpoints.qwen import packed_batch_from_hf

    with torch.no_grad():
        torch.testing.assert_close(model(packed_batch_from_hf(pixels, grid)), hf_run(tower, pixels, grid)[1],
                                   **TOL_OF[torch.float32])


def test_a_grid_thw_that_does_not_match_the_patches_is_refused():
    from vitkit.checkpoints.qwen import packed_batch_from_hf

    pixels, grid = processed()
    with pytest.raises(InputError, match=r"^grid_thw \[\[1, 6, 10\], \[1, 8, 6\]\] holds 108 patches; pixel_values "
                                         r"has 92 rows, expected one per patch$"):
        packed_batch_from_hf(pixels, torch.tensor([[1, 6, 10], [1, 8, 6]]))
    with pytest.raises(InputError, match=r"expected \(1, rows, columns\) of still images"):
        packed_batch_from_hf(pixels, torch.tensor([[2, 6, 5], [1, 8, 4]]))
    video = pixels.clone().reshape(92, 3, 2, 64)
    video[:, :, 1] += 1
    with pytest.raises(InputError, match="frames differ: a video"):
        packed_batch_from_hf(video.reshape(92, -1), grid)


def test_a_packed_batch_whose_grids_miss_its_patches_is_refused(tmp_path):
    from vitkit.checkpoints.qwen import packed_batch_from_hf

    hf_tower().save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    batch = packed_batch_from_hf(*processed())
    batch.grids[1] = torch.tensor([8, 6])
    with pytest.raises(InputError, match=r"^packed image 1 has 32 patches for its grid \(8, 6\); expected 48, one per "
                                         r"cell$"):
        model(batch)


def test_qwen2_5_vl_onnx_and_openvino_give_pytorchs_merger_tokens_at_any_size_and_timm_refuses_it(tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.checkpoints import export
    from vitkit.errors import FormatError

    hf_tower().save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf", image_size=64)
    for run in exported_runtimes(model, tmp_path):
        for size in ((64, 64), (48, 80), (96, 32)):  # windows of 4 x 4 patches whole and cut
            images = torch.rand(2, 3, *size)
            with torch.no_grad():
                expected = model(images)
            torch.testing.assert_close(run(images), expected, atol=2e-5, rtol=2e-6)
    with pytest.raises(FormatError, match=r"^cannot write .*: timm's Qwen ViT is Qwen3's .* it cannot hold this "
                                          r"tower's window attention, RMSNorm, mlp='swiglu', pos_embed='none'; write it as 'native'"):
        export(model, tmp_path / "timm", "timm")


def test_timm_qwen3_takes_a_packed_batch_of_images_of_their_own_sizes(tmp_path):
    """Packed images (any order of their patches) give timm's patch tokens and merger tokens of each image."""
    from timm.models._hub import save_for_hf

    theirs = timm_peer("qwen3_vit_88m_enc", out_features=24)
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    images, batch = naflex()
    real = batch.mask
    packed = PackedBatch(batch.patches[real], batch.coords[real], real.nonzero()[:, 0], batch.grids)
    shuffled = torch.randperm(len(packed.images))
    packed = PackedBatch(*(part[shuffled] for part in (packed.patches, packed.coords, packed.images)), packed.grids)
    with torch.no_grad():
        rows, merged = model.forward_features(packed), model(packed)
        for i, image in enumerate(images):
            grid = image.shape[1] // 8, image.shape[2] // 8
            mine = packed.images == i
            order = packed.coords[mine, 0] * grid[1] + packed.coords[mine, 1]
            torch.testing.assert_close(rows[mine], tokens(theirs.forward_features(image[None]))[0, order], **TOL)
        torch.testing.assert_close(merged, torch.cat([theirs(image[None])[0] for image in images]), **TOL)


def test_a_packed_batch_is_pooled_by_a_merger_alone():
    """A model without prefix tokens takes a packed batch's rows, but pools them only through a patch merger."""
    model = vitkit.create_model("AIMv2-L/14", image_size=28, depth=1, dim=32, num_heads=2, mlp_dim=40).eval()
    batch = PackedBatch(torch.rand(4, 588), torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]]), torch.zeros(4).long(),
                        torch.tensor([[2, 2]]))
    with torch.no_grad():
        assert model.forward_features(batch).shape == (4, 32)
        with pytest.raises(InputError, match=r"^pool='gap' of features of shape \(4, 32\), a packed batch's rows: a "
                                             r"packed batch is pooled by a patch merger .* alone"):
            model(batch)
        with pytest.raises(InputError, match="^forward_intermediates takes .* run a packed batch's images"):
            model.forward_intermediates(batch)


# ------------------------------------------------------------------------------------------ Qwen3-VL (transformers)
def test_transformers_qwen3_vl_tower_gives_its_rows_and_merger_tokens(tmp_path):
    """Qwen3-VL's tower (timm's Qwen3 ViT with a Conv3d with bias and DeepStack mergers) on its processor's packed
    patches of two images: the last block's rows (in the patches' order) and the last merger's tokens."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    from vitkit.checkpoints.qwen import packed_batch_from_hf

    config = transformers.Qwen3VLVisionConfig(depth=3, hidden_size=32, intermediate_size=48, num_heads=2,
                                              patch_size=8, out_hidden_size=24, num_position_embeddings=36,
                                              deepstack_visual_indexes=[1])
    torch.manual_seed(0)
    peer = randomised(Qwen3VLVisionModel(config), std=0.3)
    peer.save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning, match=r"Qwen3-VL's 1 DeepStack mergers .* are left out"):
        model = vitkit.load(tmp_path / "hf")
    c = model.config
    assert (c.pos_grid, c.gelu, c.merge_dim, c.patch_bias, c.provenance.format) == ((6, 6), "tanh", 24, True,
                                                                                    "hf-qwen3_vl")
    pixels, grid = processed()
    batch = packed_batch_from_hf(pixels, grid)
    for dtype in (torch.float64, torch.float32):
        with torch.no_grad():
            out = peer.to(dtype)(hidden_states=pixels.to(dtype), grid_thw=grid)
            features = model.to(dtype).forward_features(batch.to("cpu", dtype))
            torch.testing.assert_close(features, out.last_hidden_state, **TOL_OF[dtype])
            torch.testing.assert_close(model.forward_head(features, pre_logits=True), out.pooler_output,
                                       **TOL_OF[dtype])
        assert out.last_hidden_state.abs().max() > 5


def test_the_analyses_read_the_windows_and_the_merger(tmp_path):
    """The explicit softmax the analyses read gives the fused pass's tokens; a windowed block attends within its 4 x 4
    window alone, a global block across the image; rollout reads the merger's output as the mean of the patches."""
    from vitkit.analysis.attention import output_readout, rollout

    hf_tower().save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    images = torch.rand(1, 3, 32, 48)  # 4 x 6 patches: a whole window and a cut one side by side
    with torch.no_grad():
        seen = model.forward_intermediates(images, attention=True)
        torch.testing.assert_close(seen.features, model.forward_features(images), **TOL)
        heat = rollout(model, images)
    rows, cols = torch.meshgrid(torch.arange(4), torch.arange(6), indexing="ij")
    window = (cols.flatten() // 4)[:, None] == (cols.flatten() // 4)[None, :]
    assert (seen.attentions[0][0, :, ~window] == 0).all() and (seen.attentions[0][0, :, window] > 0).all()
    assert (seen.attentions[1][0] > 0).all()  # block 1 is global
    assert output_readout(model) == "mean" and heat.shape == (1, 4, 6) and torch.isfinite(heat).all()


def test_bench_twin_is_timms_qwen3_and_qwen2_5_vl_has_none(tmp_path):
    """`vitkit bench` compares a Qwen3 ViT with timm's own model of the same weights; Qwen2.5-VL's tower, which no
    timm architecture holds, is refused by name."""
    from timm.models._hub import save_for_hf

    from vitkit.benchmark import timm_twin

    theirs = timm_peer("qwen3_vit_88m_enc", out_features=24)
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    twin = timm_twin(model)
    images = torch.rand(2, 3, 16, 48)
    with torch.no_grad():
        assert type(twin).__name__ == "Qwen3VitEncoder"
        torch.testing.assert_close(twin(images), theirs(images), atol=0, rtol=0)
    hf_tower().save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="timm's Qwen ViT is Qwen3's"):
        timm_twin(vitkit.load(tmp_path / "hf"))


def test_lora_merges_exactly_on_the_qwen2_5_vl_tower(tmp_path):
    """LoRA on the windowed tower merges into the weights with the adapted merger tokens, on a packed batch too."""
    pytest.importorskip("peft")
    from vitkit.checkpoints.adapters import AdapterSpec, adapt, merged
    from vitkit.checkpoints.qwen import packed_batch_from_hf

    hf_tower().save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    adapt(model, AdapterSpec("lora", lora_rank=2))
    batch = packed_batch_from_hf(*processed())
    with torch.no_grad():
        before = vitkit.load(tmp_path / "hf")(batch)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.3)  # a trained update, not LoRA's zero start
        adapted = model.eval()(batch)
        assert (adapted - before).abs().max() > 0.1
        torch.testing.assert_close(merged(model)(batch), adapted, **TOL_OF[torch.float32])


def test_timm_qwen3_without_pooling_or_merger_is_refused_in_one_line(tmp_path):
    from timm.models._hub import save_for_hf

    from vitkit.errors import CheckpointError

    theirs = timm_peer("qwen3_vit_88m_enc", global_pool="")
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    with pytest.raises(CheckpointError, match=r"a Qwen3 ViT with global_pool='' \(no pooling; the patch tokens are "
                                              r"forward_features\), which vitkit does not compute$"):
        vitkit.load(tmp_path / "hub")
    encoder = timm_peer("qwen3_vit_88m_enc", global_pool="avg")
    save_file({f"encoder.{k}": v.contiguous() for k, v in encoder.state_dict().items()}, tmp_path / "enc.safetensors")
    model = vitkit.load(tmp_path / "enc.safetensors", num_heads=2)  # timm's classifier without a head: its pooling
    assert (model.config.pool, model.config.fc_norm, model.config.merge_size) == ("gap", True, 0)
    odd = timm_peer("qwen3_vit_88m_enc", out_features=24, embed_dim=48, num_heads=3)
    save_file({k: v.contiguous() for k, v in odd.state_dict().items()}, tmp_path / "odd.safetensors")
    with pytest.raises(CheckpointError, match="none of timm's sizes .* pass num_heads=...$"):
        vitkit.load(tmp_path / "odd.safetensors")


def test_a_bare_qwen3_encoder_pooling_the_mean_is_told_from_a_plain_vit_or_refused(tmp_path):
    from vitkit.errors import CheckpointError

    theirs = timm_peer("qwen3_vit_88m_enc", global_pool="avg")
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "enc.safetensors")
    with pytest.raises(CheckpointError, match=r"as both timm's plain ViT and its Qwen3 ViT encoder pooling the mean .* "
                                              r"pass rope='none' to read a plain ViT$"):
        vitkit.load(tmp_path / "enc.safetensors")
    plain = vitkit.load(tmp_path / "enc.safetensors", rope="none", num_heads=2, pool="gap", final_norm=False)
    assert plain.config.rope == "none"
