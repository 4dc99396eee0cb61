"""Gemma 4's vision encoder (issue 37), made tiny by timm's and transformers' own code with every weight, clamp bound
and standardisation buffer random, saved as they save it, and read by vitkit: the patch tokens (forward_features,
transformers' last block) within 1e-4, the soft tokens, pooled outputs and logits too, at the native size, at a
non-square one and as NaFlex batches; timm's parameter counts of each named definition; timm written back; what is
not read refused in one line."""

import json

import pytest
import torch
from interop_helpers import assert_runs_as_pytorch, exported_runtimes, randomised
from safetensors.torch import save_file

import vitkit
from vitkit.errors import CheckpointError, FormatError, InputError
from vitkit.models.naflex import patch_batch, patchify

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-4, rtol=0)  # the tolerance for Gemma 4: two right float32 computations differ by 2e-5
SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, head_dim=16, intermediate_size=48,
             position_embedding_size=16, pooling_kernel_size=2)
SIZES = ((32, 32), (16, 48))  # the native size and a non-square one, both in whole 2 x 2 cells of 8 px patches


def randomise_buffers(model):
    """Finite clamp bounds that bite (a unit-normal input is cut at about +-1) and a random standardisation."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith(("input_min", "output_min")):
                buffer.fill_(-0.8 - torch.rand(()).item())
            elif name.endswith(("input_max", "output_max")):
                buffer.fill_(0.8 + torch.rand(()).item())
            elif name.endswith(("std_bias", "std_scale")):
                buffer.normal_(1.0 if name.endswith("scale") else 0.0, 0.3)
    return model


def timm_peer(architecture, **kwargs):
    torch.manual_seed(0)
    return randomise_buffers(randomised(timm.create_model(architecture, **{**SMALL, **kwargs}), std=0.3))


def hf_config(**kwargs):
    base = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2, head_dim=16, patch_size=8, position_embedding_size=16, pooling_kernel_size=2)
    return transformers.Gemma4VisionConfig(**{**base, **kwargs})


def hf_peer(**kwargs):
    torch.manual_seed(0)
    return randomise_buffers(randomised(transformers.Gemma4VisionModel(hf_config(**kwargs)), std=0.3))


def naflex():
    """Two images of their own sizes (whole 2 x 2 cells of patches) padded to 16 patches each."""
    torch.manual_seed(2)
    return patch_batch([torch.rand(3, 32, 16), torch.rand(3, 16, 48)], 8, 16)


def timm_inputs(batch):
    return dict(patches=batch.patches, patch_coord=batch.coords, patch_valid=batch.mask)


def hf_run(peer, batch):
    """transformers' patch tokens after the last block and its soft tokens (padding stripped) of a PatchBatch:
    its processor's (ph, pw, C) patches, (x, y) positions, -1 for padding."""
    positions = torch.where(batch.mask[..., None], batch.coords.flip(-1), -1)
    seen = []  # its encoder's output: the hidden states it returns end with the soft tokens in its place
    hook = peer.encoder.register_forward_hook(lambda module, args, out: seen.append(out.last_hidden_state))
    with torch.no_grad():
        soft = peer(pixel_values=batch.patches, pixel_position_ids=positions).last_hidden_state
    hook.remove()
    return seen[0], soft


def image_batch(size, count=2):
    torch.manual_seed(3)
    images = torch.rand(count, 3, *size)
    return images, patch_batch(list(images), 8, (size[0] // 8) * (size[1] // 8))


@pytest.mark.parametrize("architecture", ["gemma4_vit_167m_enc", "gemma4_vit_570m_enc"])
def test_timm_encoders_give_timms_patch_and_soft_tokens(tmp_path, architecture):
    from timm.models._hub import save_for_hf

    theirs = timm_peer(architecture)
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "bare.safetensors")
    hub = vitkit.load(tmp_path / "hub")
    bare = vitkit.load(tmp_path / "bare.safetensors", image_size=32, soft_pool=2)  # timm's default is 3
    for model in (hub, bare):
        c = model.config
        assert (c.pool, c.soft_pool, c.clamp_linears, c.soft_standardize) == (
            "soft", 2, architecture == "gemma4_vit_167m_enc", architecture == "gemma4_vit_570m_enc")
        assert c.provenance.normalization == "unit" and c.image_size == (32, 32)
        for size in SIZES:
            images = torch.rand(2, 3, *size)
            with torch.no_grad():
                features = model.forward_features(images)
                torch.testing.assert_close(features, theirs.forward_features(images), **TOL)
                soft = theirs(images)
                torch.testing.assert_close(model(images), soft, **TOL)
                grid = (size[0] // 8, size[1] // 8)
                torch.testing.assert_close(model.forward_head(features, pre_logits=True), soft, **TOL)
                torch.testing.assert_close(model.forward_head(features, pre_logits=True, grid=grid), soft, **TOL)
            assert soft.shape == (2, grid[0] * grid[1] // 4, 32) and features.abs().max() > 0.5
        batch = naflex()
        with torch.no_grad():
            soft = theirs(timm_inputs(batch))
            torch.testing.assert_close(model(batch), soft, **TOL)
            torch.testing.assert_close(model.forward_head(model.forward_features(batch), pre_logits=True), soft, **TOL)
            torch.testing.assert_close(model.forward_features(batch)[batch.mask],
                                       theirs.forward_features(timm_inputs(batch))[batch.mask], **TOL)


def test_timm_classifier_gives_timms_logits_and_pre_logits(tmp_path):
    from timm.models._hub import save_for_hf

    theirs = timm_peer("gemma4_vit_167m", num_classes=5)
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "bare.safetensors")
    for model in (vitkit.load(tmp_path / "hub"), vitkit.load(tmp_path / "bare.safetensors", image_size=32)):
        assert (model.config.pool, model.config.fc_norm, model.config.fc_norm_scale) == ("gap", True, False)
        for size in SIZES:
            images = torch.rand(2, 3, *size)
            with torch.no_grad():
                features = theirs.forward_features(images)
                torch.testing.assert_close(model.forward_features(images), features, **TOL)
                torch.testing.assert_close(model(images), theirs(images), **TOL)
                torch.testing.assert_close(model.forward_head(model.forward_features(images), pre_logits=True),
                                           theirs.forward_head(features, pre_logits=True), **TOL)
        batch = naflex()
        with torch.no_grad():
            torch.testing.assert_close(model(batch), theirs(timm_inputs(batch)), **TOL)


@pytest.mark.parametrize("options", [dict(use_clipped_linears=True), dict(standardize=True)])
def test_transformers_tower_gives_its_patch_and_soft_tokens(tmp_path, options):
    peer = hf_peer(**options)
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert model.config.provenance.format == "hf-gemma4" and model.config.pool == "soft"
    for size in SIZES:
        images, batch = image_batch(size)
        tokens, soft = hf_run(peer, batch)
        with torch.no_grad():
            features = model.forward_features(images)
            torch.testing.assert_close(features, tokens, **TOL)
            grid = (size[0] // 8, size[1] // 8)
            pooled = model.forward_head(features, pre_logits=True, grid=grid)
            torch.testing.assert_close(pooled.flatten(0, 1), soft, **TOL)
            torch.testing.assert_close(model(images), pooled, **TOL)
    batch = naflex()
    tokens, soft = hf_run(peer, batch)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(batch)[batch.mask], tokens[batch.mask], **TOL)
        pooled = model(batch)
    counts = (batch.grids[:, 0] // 2) * (batch.grids[:, 1] // 2)  # each image's own soft tokens come first
    mine = torch.cat([pooled[i, :count] for i, count in enumerate(counts.tolist())])
    torch.testing.assert_close(mine, soft, **TOL)
    assert soft.abs().max() > 0.5


def test_the_vision_tower_of_a_whole_gemma4_model_is_read(tmp_path):
    """A whole Gemma 4 model saved in shards: the tower's tensors are read from the shards that hold them."""
    text = transformers.Gemma4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                         global_head_dim=16, hidden_size_per_layer_input=8,
                                         vocab_size_per_layer_input=64)
    whole = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(
        text_config=text, vision_config=hf_config(use_clipped_linears=True), audio_config=None))
    tower = randomise_buffers(randomised(whole.model.vision_tower, std=0.3))
    whole.save_pretrained(tmp_path / "whole", max_shard_size="20KB")  # shards and an index, as the hub holds it
    assert (tmp_path / "whole" / "model.safetensors.index.json").exists()
    with pytest.warns(UserWarning, match="a whole Gemma 4 model; its vision tower"):
        model = vitkit.load(tmp_path / "whole")
    images, batch = image_batch((16, 48))
    tokens, soft = hf_run(tower, batch)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(images), tokens, **TOL)
        torch.testing.assert_close(model(images).flatten(0, 1), soft, **TOL)


def test_a_whole_gemma4_model_without_a_vision_tower_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(model_type="gemma4", vision_config=None)))
    with pytest.raises(CheckpointError, match="a Gemma 4 model without a vision_config"):
        vitkit.load(tmp_path / "m")


def test_a_bare_state_dict_in_transformers_names_is_refused_naming_both_layouts(tmp_path):
    save_file({k: v.contiguous() for k, v in hf_peer().state_dict().items()}, tmp_path / "hf.safetensors")
    with pytest.raises(CheckpointError, match=r"patch layout .* \(C, ph, pw\), .* \(ph, pw, C\)"):
        vitkit.load(tmp_path / "hf.safetensors")


def test_the_patch_layout_follows_the_source():
    """The same weights read as timm's (C, ph, pw) and as HF's (ph, pw, C) kernel: each equals its peer's
    projection of the image's patches flattened its way."""
    from vitkit.checkpoints.gemma4 import _kernel

    weight, image = torch.randn(4, 3 * 8 * 8), torch.rand(3, 8, 8)
    for layout, flat in (("chw", image.reshape(-1)), ("hwc", patchify(image, 8)[0])):
        kernel = _kernel(weight, 3, layout, "w")
        torch.testing.assert_close((kernel * image).sum(dim=(1, 2, 3)), weight @ flat)


@pytest.mark.parametrize("architecture", ["gemma4_vit_167m", "gemma4_vit_167m_enc", "gemma4_vit_570m",
                                          "gemma4_vit_570m_enc"])
def test_parameter_counts_of_timms_definitions(architecture):
    """Each of timm's definitions at its full size, built on the meta device by timm and by vitkit from the config
    its reader makes of timm's name; the encoders are also vitkit's named variants."""
    from vitkit.checkpoints.gemma4 import TIMM_ARCHITECTURES, gemma4_fields
    from vitkit.models import ViTConfig, create_model

    size = architecture.split("_")[2]
    pool = "soft" if architecture.endswith("_enc") else "classifier"
    with torch.device("meta"):
        theirs = timm.create_model(architecture)
        models = [create_model(ViTConfig(**gemma4_fields(dict(TIMM_ARCHITECTURES[size], img_size=768), pool, "t")))]
        if pool == "soft":
            models.append(vitkit.create_model(f"Gemma4-{size.upper()}/16"))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(theirs) > 1.6e8 and all(count(model) == count(theirs) for model in models)
    assert all(model.config == models[0].config.replace(provenance=model.config.provenance) for model in models)


@pytest.mark.parametrize("name", ["Gemma4-167M/16", "Gemma4-570M/16"])
def test_a_small_model_of_each_name_computes_timms_soft_tokens(tmp_path, name):
    """What a count cannot show (rotary layout, norms, clamps, standardisation) is timm's too: a small model of the
    name given a small timm encoder's weights gives its outputs."""
    from timm.models._hub import save_for_hf

    theirs = timm_peer(f"gemma4_vit_{name[7:11].lower()}_enc")
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.create_model(name, image_size=32, patch_size=8, dim=32, depth=2, num_heads=2, mlp_dim=48,
                                pos_axis_cells=16, soft_pool=2).eval()
    model.load_state_dict(vitkit.load(tmp_path / "hub").state_dict())
    images = torch.rand(2, 3, 16, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(images), theirs(images), **TOL)


def test_timm_written_back_loads_in_timm(tmp_path):
    from vitkit.checkpoints.timm import write_timm

    for architecture, options in (("gemma4_vit_167m_enc", {}), ("gemma4_vit_570m", dict(num_classes=3))):
        theirs = timm_peer(architecture, **options)
        save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, tmp_path / "w.safetensors")
        model = vitkit.load(tmp_path / "w.safetensors", image_size=32, soft_pool=2)
        write_timm(model, tmp_path / f"{architecture}")
        back = timm.create_model(f"local-dir:{tmp_path / architecture}", pretrained=True)
        images = torch.rand(2, 3, 16, 48)
        with torch.no_grad():
            torch.testing.assert_close(back.eval()(images), theirs(images), **TOL)


def test_other_writers_refuse_gemma4_in_one_line(tmp_path):
    from vitkit.checkpoints import export

    model = vitkit.load(_saved_enc(tmp_path))
    for to, name in (("hf", "hf"), ("npz", "m.npz")):
        with pytest.raises(FormatError) as error:
            export(model, tmp_path / name, to)
        assert "\n" not in str(error.value) and ("Gemma 4" in str(error.value) or to == "npz")


def _saved_enc(tmp_path):
    from timm.models._hub import save_for_hf

    save_for_hf(timm_peer("gemma4_vit_167m_enc"), str(tmp_path / "hub"), safe_serialization=True)
    return tmp_path / "hub"


def test_bad_inputs_are_one_line_errors(tmp_path):
    model = vitkit.load(_saved_enc(tmp_path))
    with pytest.raises(InputError, match=r"multiples of 2 .* got \[1, 3\]"):
        model(torch.rand(1, 3, 8, 24))
    with pytest.raises(InputError, match="at most that many patches a side"):
        model(torch.rand(1, 3, 8 * 18, 16))
    features = model.forward_features(torch.rand(1, 3, 16, 48))
    model.forward_features(torch.rand(1, 3, 32, 32))  # the last features are another size's
    with pytest.raises(InputError, match=r"pass the grid .*forward_head\(features, grid=\(rows, cols\)\)"):
        model.forward_head(features, pre_logits=True)


def test_a_naflex_batch_for_a_family_without_naflex_is_one_line(tmp_path):
    """A hybrid takes no NaFlex batch: the error names what it expected."""
    from vitkit.models import create_model

    hybrid = create_model("R+ViT-Ti/16", image_size=64, depth=1, num_classes=2)
    with pytest.raises(InputError, match="NaFlex batches need a plain patch projection"):
        hybrid(naflex())


@pytest.mark.parametrize("architecture", ["gemma4_vit_167m_enc", "gemma4_vit_167m"])
def test_onnx_and_openvino_give_pytorchs_soft_tokens_and_logits_at_any_size(tmp_path, architecture):
    pytest.importorskip("onnxruntime")
    from timm.models._hub import save_for_hf

    save_for_hf(timm_peer(architecture, num_classes=5), str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    for run in exported_runtimes(model, tmp_path):
        assert_runs_as_pytorch(run, model, **TOL)


def test_attention_maps_are_timms_softmax_and_rollout_reads_the_patches(tmp_path):
    """The explicit softmax the analyses read (logits unscaled, queries and keys normalised and turned) equals
    timm's, caught where its unfused attention applies dropout; rollout maps the mean of the patches (no prefix)."""
    from vitkit.analysis import attention_maps, attention_rollout, output_readout

    theirs = timm_peer("gemma4_vit_570m_enc")
    caught = []
    for block in theirs.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda module, inputs, output: caught.append(output))
    images = torch.rand(1, 3, 16, 48)
    with torch.no_grad():
        theirs(images)
    from timm.models._hub import save_for_hf

    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    maps = attention_maps(model, images)
    torch.testing.assert_close(maps, torch.stack(caught), **TOL)
    assert output_readout(model) == "mean"
    rollout = attention_rollout(maps, (2, 6), readout=output_readout(model))
    assert rollout.shape == (1, 2, 6) and rollout.max() == 1


def test_bench_twin_is_timms_gemma4_with_the_same_outputs(tmp_path):
    """`vitkit bench` times timm's own Gemma 4 beside vitkit's: the twin timm builds from vitkit's writer."""
    from vitkit.benchmark import timm_twin

    model = vitkit.load(_saved_enc(tmp_path))
    twin = timm_twin(model)
    assert type(twin).__name__ == "Gemma4VitEncoder"
    images = torch.rand(2, 3, 16, 48)
    with torch.no_grad():
        torch.testing.assert_close(twin(images), model(images), **TOL)


def saved_per_token_and_block(config):
    """What autograd saves per token and block in training, counted with saved-tensor hooks (two depths apart)."""
    from vitkit.models import create_model

    counts = []
    for depth in (2, 4):
        seen, total = set(), [0]

        def pack(tensor):
            if (tensor.data_ptr(), tensor.numel()) not in seen:
                seen.add((tensor.data_ptr(), tensor.numel()))
                total[0] += tensor.numel()
            return tensor

        torch.manual_seed(0)
        model = create_model(config.replace(depth=depth)).train()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(torch.randn(2, 3, 32, 32)).sum()
        counts.append(total[0])
    return (counts[1] - counts[0]) / 2 / (2 * 16)


def test_memory_estimate_counts_gemma4s_options():
    """What each of Gemma 4's options adds to the training estimate is within 10% of what autograd saves for it
    (the branch norms, the value norm, the clamped layers' inputs and outputs); its GeGLU counts as SwiGLU does."""
    from vitkit.memory import saved_per_token
    from vitkit.models import ViTConfig

    base = ViTConfig(image_size=32, patch_size=8, dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=0,
                     class_token=False, pool="gap", norm="rms")
    measured, estimated = saved_per_token_and_block(base), saved_per_token(base, 16)
    for option in (dict(sandwich_norm=True), dict(v_norm=True), dict(clamp_linears=True)):
        config = base.replace(**option)
        added = saved_per_token_and_block(config) - measured
        assert abs(saved_per_token(config, 16) - estimated - added) <= 0.1 * added, option
    assert saved_per_token(base.replace(mlp="geglu"), 16) == saved_per_token(base.replace(mlp="swiglu"), 16)


@pytest.mark.parametrize("architecture", ["gemma4_vit_570m_enc", "gemma4_vit_167m"])
def test_onnx_naflex_graphs_give_pytorchs_outputs_at_any_patch_count(tmp_path, architecture):
    pytest.importorskip("onnxruntime")
    from timm.models._hub import save_for_hf

    from vitkit.checkpoints import export
    from vitkit.checkpoints.onnx import OnnxModel

    save_for_hf(timm_peer(architecture, num_classes=5), str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    assert export(model, tmp_path / "m.onnx", "onnx", naflex=True).max_difference <= 1e-4
    run = OnnxModel(tmp_path / "m.onnx")
    for batch in (naflex(), patch_batch([torch.rand(3, 48, 16)], 8, 20)):
        with torch.no_grad():
            expected = model(batch)
        assert expected.abs().max() > 0.5
        torch.testing.assert_close(run(batch), expected, **TOL)


def test_transformers_tower_written_for_timm_gives_transformers_soft_tokens(tmp_path):
    """The layout trap end to end: HF's (ph, pw, C) kernel read, written in timm's (C, ph, pw), and timm's own
    encoder built from it gives transformers' soft tokens of the same images."""
    from vitkit.checkpoints import export

    peer = hf_peer(standardize=True)
    peer.save_pretrained(tmp_path / "hf")
    export(vitkit.load(tmp_path / "hf"), tmp_path / "timm", "timm")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    images, batch = image_batch((16, 48))
    with torch.no_grad():
        torch.testing.assert_close(theirs(images).flatten(0, 1), hf_run(peer, batch)[1], **TOL)


def test_info_names_the_options_and_the_soft_pool(tmp_path, capsys):
    from vitkit.cli import main

    assert main(["info", str(_saved_enc(tmp_path))]) == 0
    out = capsys.readouterr().out
    for part in ("gemma4_vit_167m_enc", "sandwich_norm=True", "clamp_linears=True", "RMSNorm eps 1e-06",
                 "normalised 'unit'", "pooling 'soft'"):
        assert part in out, part


def test_lora_merges_exactly_and_clamped_layers_refuse_it(tmp_path):
    """LoRA on the unclamped tower (570M) merges into the weights with the adapted outputs; on the clamped one
    (167M) it is refused: the update would act outside the clamps before merging and inside them after."""
    pytest.importorskip("peft")
    from timm.models._hub import save_for_hf

    from vitkit.checkpoints.adapters import AdapterSpec, adapt, merged
    from vitkit.errors import ConfigError

    save_for_hf(timm_peer("gemma4_vit_570m_enc"), str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub")
    adapt(model, AdapterSpec("lora", lora_rank=2))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.3)  # a trained update, not LoRA's zero start
        images = torch.rand(2, 3, 16, 48)
        adapted = model.eval()(images)
        torch.testing.assert_close(merged(model)(images), adapted, **TOL)
    with pytest.raises(ConfigError, match="clamped dense layers"):
        adapt(vitkit.load(_saved_enc(tmp_path / "clamped")), AdapterSpec("lora"))


def test_an_encoder_pooling_the_mean_is_read_and_one_without_pooling_refused(tmp_path):
    from timm.models._hub import save_for_hf

    theirs = timm_peer("gemma4_vit_167m_enc", global_pool="avg")
    save_for_hf(theirs, str(tmp_path / "avg"), safe_serialization=True)
    model = vitkit.load(tmp_path / "avg")
    assert (model.config.pool, model.config.final_norm) == ("gap", False)
    images = torch.rand(2, 3, 16, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(images), theirs(images), **TOL)
    save_for_hf(timm_peer("gemma4_vit_167m_enc", global_pool=""), str(tmp_path / "none"), safe_serialization=True)
    with pytest.raises(CheckpointError, match=r"global_pool='' \(no pooling; the patch tokens are forward_features\)"):
        vitkit.load(tmp_path / "none")


def test_transformers_processor_output_runs_as_a_patch_batch(tmp_path):
    """What Gemma 4's own image processor makes of two images of other aspect ratios (patches in [0, 1], (x, y)
    positions, -1 padding), as a PatchBatch: transformers' soft tokens, each image's own first."""
    import numpy as np
    from PIL import Image

    from vitkit.checkpoints.gemma4 import patch_batch_from_hf

    peer = hf_peer(position_embedding_size=32, use_clipped_linears=True)
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    processor = transformers.Gemma4ImageProcessor(patch_size=8, pooling_kernel_size=2, max_soft_tokens=70)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)) for shape in ((40, 70, 3), (90, 30, 3))]
    inputs = processor(images=images, return_tensors="pt")
    with torch.no_grad():
        soft = peer(pixel_values=inputs["pixel_values"],
                    pixel_position_ids=inputs["image_position_ids"]).last_hidden_state
        pooled = model(patch_batch_from_hf(inputs["pixel_values"], inputs["image_position_ids"]))
    counts = inputs["num_soft_tokens_per_image"].tolist()
    assert sum(counts) == soft.shape[0] and soft.abs().max() > 0.5
    torch.testing.assert_close(torch.cat([pooled[i, :count] for i, count in enumerate(counts)]), soft, **TOL)


def test_a_head_goes_on_the_patches_mean_not_on_soft_tokens(tmp_path):
    """A soft-token encoder refuses a new head, naming pool='gap'; loaded with it (the standardisation buffers then
    left out), its patch tokens are timm's and a head of the asked width reads their mean."""
    from timm.models._hub import save_for_hf

    from vitkit.errors import ConfigError

    theirs = timm_peer("gemma4_vit_570m_enc")
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    with pytest.raises(ConfigError, match="load it with pool='gap'"):
        vitkit.load(tmp_path / "hub", num_classes=3)
    model = vitkit.load(tmp_path / "hub", pool="gap", num_classes=3)
    images = torch.rand(2, 3, 16, 48)
    with torch.no_grad():
        features = model.forward_features(images)
        torch.testing.assert_close(features, theirs.forward_features(images), **TOL)
        torch.testing.assert_close(model.forward_head(features, pre_logits=True), features.mean(dim=1), **TOL)
    assert model(images).shape == (2, 3)


@pytest.mark.parametrize("change, expected", [
    (dict(num_key_value_heads=1), r"grouped-query attention \(num_kv_heads=1\)"),
    (dict(hidden_activation="silu"), r"hidden_activation='silu'.*gelu_pytorch_tanh"),
    (dict(rope_parameters=dict(rope_type="default", rope_theta=100.0)), "axial rope"),
    (dict(head_dim=8), r"heads of 8 x 2 that are not the width 32"),
    (dict(num_hidden_layers=0), r"num_hidden_layers=0; expected an integer >= 1"),
])
def test_bad_transformers_configs_are_one_line_errors(tmp_path, change, expected):
    hf_peer().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(CheckpointError, match=expected) as error:
        vitkit.load(tmp_path / "hf")
    assert "\n" not in str(error.value)


def test_position_and_rotary_tables_the_analyses_read_are_timms(tmp_path):
    """The per-axis table summed at each patch and the rotary [cos; sin] of each patch, on a non-square grid, equal
    what timm's own embedder and rotary module compute for those patches ((x, y) positions)."""
    from timm.models._hub import save_for_hf

    from vitkit.analysis.embeddings import position_table, rope_phases

    theirs = timm_peer("gemma4_vit_167m_enc")
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    model = vitkit.load(tmp_path / "hub", image_size=(16, 48))
    rows, cols = torch.meshgrid(torch.arange(2), torch.arange(6), indexing="ij")
    positions = torch.stack([cols.flatten(), rows.flatten()], dim=-1)[None]  # timm's internal (x, y)
    with torch.no_grad():
        table, grid = position_table(model)
        torch.testing.assert_close(table, theirs.patch_embed._position_embeddings(positions, None)[0])
        cos, sin = theirs.rotary_emb(torch.zeros(1), positions)
    assert grid == (2, 6)
    torch.testing.assert_close(rope_phases(model), torch.cat([cos[0], sin[0]], dim=-1))
