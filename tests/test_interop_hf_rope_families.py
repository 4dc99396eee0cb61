"""transformers' vision models of 2025 (DINOv3, AIMv2, SigLIP 2), made by transformers' own classes with every
weight randomised and saved with save_pretrained, load with transformers' outputs (all tokens and the pooled
vector); vitkit writes DINOv3 and AIMv2 directories that transformers loads strictly, with the same outputs."""

import json

import pytest
import torch
from interop_helpers import randomised
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints import convert, export

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, patch_size=8)
NATIVE, OTHER = (2, 3, 32, 32), (1, 3, 48, 40)  # the native size, and a non-square grid


def pooled(model, x):
    return model.forward_head(model.forward_features(x), pre_logits=True)


def assert_outputs(model, peer, x, **inputs):
    """vitkit's tokens and pooled vector on images ``x`` against transformers' on ``inputs`` (``x`` itself by
    default)."""
    with torch.no_grad():
        theirs = peer(**(inputs or dict(pixel_values=x)))
        torch.testing.assert_close(model.forward_features(x), theirs.last_hidden_state, atol=1e-5, rtol=0)
        if theirs.pooler_output is not None:
            torch.testing.assert_close(pooled(model, x), theirs.pooler_output, atol=1e-5, rtol=0)


def dinov3(**kwargs):
    return randomised(transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**SMALL, image_size=32, **kwargs)))


def aimv2(**kwargs):
    return randomised(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**SMALL, image_size=32,
                                                                                   **kwargs)))


DINOV3_VARIANTS = {  # what transformers' config sets -> what vitkit's config must then say
    "defaults": ({}, dict(qkv_bias=True, k_bias=False, reg_tokens=0, mlp="gelu", layer_scale=1.0)),
    "registers-swiglu": (dict(num_register_tokens=4, use_gated_mlp=True, hidden_act="silu", layerscale_value=0.1,
                              rope_theta=50.0, layer_norm_eps=1e-6),
                         dict(reg_tokens=4, mlp="swiglu", layer_scale=0.1, rope_theta=50.0, ln_eps=1e-6)),
    "key-bias": (dict(key_bias=True, hidden_act="gelu_pytorch_tanh"), dict(k_bias=True, gelu="tanh")),
    "some-biases": (dict(query_bias=False, mlp_bias=False), dict(qkv_bias=True, k_bias=False, proj_bias=True)),
    "no-biases": (dict(query_bias=False, value_bias=False, proj_bias=False, mlp_bias=False),
                  dict(qkv_bias=False, proj_bias=False)),
}


@pytest.mark.parametrize("variant", list(DINOV3_VARIANTS))
def test_dinov3_gives_transformers_tokens_and_pooled_class_token(tmp_path, variant):
    """At the native size and at a non-square one: transformers turns the patches by a table of that grid."""
    settings, expected = DINOV3_VARIANTS[variant]
    peer = dinov3(**settings)
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert (model.config.rope, model.config.rope_grid, model.config.rope_half, model.config.pool) == (
        "axial", "centered", True, "token")
    for field, value in expected.items():
        assert getattr(model.config, field) == value, field
    for shape in (NATIVE, OTHER):
        assert_outputs(model, peer, torch.randn(shape))


AIMV2_VARIANTS = {"head": {}, "no-head": dict(use_head=False), "qkv-bias": dict(qkv_bias=True),
                  "mlp-bias": dict(mlp_bias=True, rms_norm_eps=1e-6), "all-biases": dict(qkv_bias=True, mlp_bias=True)}


@pytest.mark.parametrize("variant", list(AIMV2_VARIANTS))
def test_aimv2_gives_transformers_tokens_and_pooled_vector(tmp_path, variant):
    """At the native size: transformers' AIMv2 (learned table) computes no other."""
    peer = aimv2(**AIMV2_VARIANTS[variant])
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert (model.config.norm, model.config.patch_norm, model.config.mlp) == ("rms", True, "swiglu")
    assert model.config.pool == ("gap" if variant == "no-head" else "map")
    assert_outputs(model, peer, torch.randn(NATIVE))


SIGLIP2 = dict(SMALL, num_patches=16)  # a 4 x 4 table: the native grid of 32 x 32 images


def siglip2_inputs(height, width):
    """Images of one size as uint8, vitkit's input (normalised to [-1, 1]) and what transformers' own SigLIP 2
    processor makes of them (patches, spatial shapes, attention mask), allowed exactly that image's patches."""
    images = torch.randint(0, 256, (2, 3, height, width), dtype=torch.uint8)
    grid = (height // 8, width // 8)
    processor = transformers.Siglip2ImageProcessor(patch_size=8, max_num_patches=grid[0] * grid[1])
    inputs = processor(images=list(images), return_tensors="pt")
    assert inputs["spatial_shapes"].tolist() == [list(grid)] * 2 and inputs["pixel_attention_mask"].all()
    return (images.float() / 255 - 0.5) / 0.5, dict(inputs)


@pytest.mark.parametrize("size", [(32, 32), (48, 48), (24, 24), (48, 40)])
def test_siglip2_gives_transformers_outputs_on_its_processors_patches(tmp_path, size):
    """The table resampled up, down (where antialias counts) and to a non-square grid, as transformers does per
    image; transformers is fed the patches its processor cuts (flattened by row, column, channel)."""
    peer = randomised(transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(**SIGLIP2)))
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load(tmp_path / "hf")
    assert (model.config.image_size, model.config.pos_interp, model.config.pos_interp_antialias) == (
        (32, 32), "bilinear", True)
    x, inputs = siglip2_inputs(*size)
    assert_outputs(model, peer, x, **inputs)


def test_a_whole_siglip2_model_gives_its_image_features(tmp_path):
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    peer = randomised(transformers.Siglip2Model(transformers.Siglip2Config(vision_config=SIGLIP2, text_config=text)))
    peer.save_pretrained(tmp_path / "hf")
    with pytest.warns(UserWarning, match="a whole SIGLIP2 model; its image tower is read and its text tower"):
        model = vitkit.load(tmp_path / "hf")
    x, inputs = siglip2_inputs(48, 40)
    with torch.no_grad():
        torch.testing.assert_close(pooled(model, x), peer.get_image_features(**inputs).pooler_output,
                                   atol=1e-5, rtol=0)


def reloaded_by_transformers(cls, directory):
    """transformers' model of a directory vitkit wrote, loaded strictly: no weight missing, left over or of
    another shape."""
    model, info = cls.from_pretrained(directory, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    return model.eval()


@pytest.mark.parametrize("cls, peer, shapes", [
    ("DINOv3ViTModel", lambda: dinov3(num_register_tokens=2, use_gated_mlp=True, hidden_act="silu"), (NATIVE, OTHER)),
    ("DINOv3ViTModel", lambda: dinov3(key_bias=True, mlp_bias=False), (NATIVE, OTHER)),
    ("Aimv2VisionModel", aimv2, (NATIVE,)),
    ("Aimv2VisionModel", lambda: aimv2(use_head=False, qkv_bias=True), (NATIVE,)),
])
def test_hf_round_trips_through_transformers(tmp_path, cls, peer, shapes):
    """transformers -> vitkit -> `vitkit convert --to hf` -> transformers: the outputs of the first model."""
    peer = peer()
    peer.save_pretrained(tmp_path / "in")
    convert(tmp_path / "in", tmp_path / "out", "hf")
    again = reloaded_by_transformers(getattr(transformers, cls), tmp_path / "out")
    with torch.no_grad():
        for shape in shapes:
            x = torch.randn(shape)
            theirs, ours = peer(pixel_values=x), again(pixel_values=x)
            torch.testing.assert_close(ours.last_hidden_state, theirs.last_hidden_state, atol=1e-5, rtol=0)
            if theirs.pooler_output is not None:
                torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=1e-5, rtol=0)


def test_siglip2_round_trips_through_transformers_with_its_processor(tmp_path):
    """A table resampled as SigLIP 2 does is written as SigLIP 2 (not as SigLIP, which resamples bicubically), with
    a processor that cuts the patches transformers' own cuts."""
    peer = randomised(transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(**SIGLIP2)))
    peer.save_pretrained(tmp_path / "in")
    convert(tmp_path / "in", tmp_path / "out", "hf")
    again = reloaded_by_transformers(transformers.Siglip2VisionModel, tmp_path / "out")
    x, inputs = siglip2_inputs(48, 40)
    with torch.no_grad():
        torch.testing.assert_close(again(**inputs).pooler_output, peer(**inputs).pooler_output, atol=1e-5, rtol=0)
    images = list(torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8))
    written = transformers.AutoImageProcessor.from_pretrained(tmp_path / "out")(images=images, return_tensors="pt")
    reference = transformers.Siglip2ImageProcessor(patch_size=8, max_num_patches=16)(images=images,
                                                                                        return_tensors="pt")
    torch.testing.assert_close(written["pixel_values"], reference["pixel_values"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("architecture, cls, overrides", [
    ("vit_small_plus_patch16_dinov3", "DINOv3ViTModel", dict(pool="token")),  # HF pools [class]; timm averages
    ("vit_small_patch16_dinov3_qkvb", "DINOv3ViTModel", dict(pool="token")),
    ("aimv2_large_patch14_224", "Aimv2VisionModel", {}),
])
def test_timm_models_written_for_transformers_give_timms_features(tmp_path, architecture, cls, overrides):
    """timm -> vitkit -> transformers: the writer against a model it did not read from transformers."""
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    peer = randomised(timm.create_model(architecture, img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                        num_classes=0, dynamic_img_size=True), std=0.1)
    save_for_hf(peer, str(tmp_path / "timm"))
    export(vitkit.load(tmp_path / "timm", **overrides), tmp_path / "hf", "hf")
    again = reloaded_by_transformers(getattr(transformers, cls), tmp_path / "hf")
    with torch.no_grad():
        for shape in (NATIVE, OTHER) if cls == "DINOv3ViTModel" else (NATIVE,):
            x = torch.randn(shape)
            torch.testing.assert_close(again(pixel_values=x).last_hidden_state, peer.forward_features(x),
                                       atol=1e-5, rtol=0)


ROPE_VIT = dict(image_size=32, patch_size=8, dim=64, depth=1, num_heads=4, mlp_dim=128, num_classes=0)
DINOV3_LIKE = dict(rope="axial", rope_grid="centered", rope_half=True, rope_theta=100.0, pos_embed="none")
AIMV2_LIKE = dict(norm="rms", patch_norm=True, mlp="swiglu", class_token=False)


@pytest.mark.parametrize("cls, config", [
    ("DINOv3ViTModel", dict(DINOV3_LIKE, reg_tokens=1, mlp="swiglu", patch_bias=False, gelu="quick")),
    ("DINOv3ViTModel", dict(DINOV3_LIKE, qkv_bias=False, proj_bias=False, layer_scale=None, image_size=(32, 40))),
    ("Aimv2VisionModel", dict(AIMV2_LIKE, pool="map", pool_mlp_dim=0, k_bias=False, proj_bias=False,
                              patch_bias=False)),
    ("Aimv2VisionModel", dict(AIMV2_LIKE, pool="map", pool_mlp_dim=0, qkv_bias=False, pool_heads=4)),
])
def test_vitkit_models_written_for_transformers_give_vitkits_outputs(tmp_path, cls, config):
    """What HF has and vitkit's config leaves out is written as zero biases and unit LayerScale; an attention pool
    without an MLP is AIMv2's head, its query projection folded into the query."""
    model = randomised(vitkit.create_model(vitkit.ViTConfig(**{**ROPE_VIT, "depth": 2, **config})))
    if model.attn_pool is not None and not model.config.qkv_bias:
        torch.nn.init.zeros_(model.attn_pool.kv.bias)
    export(model, tmp_path / "hf", "hf")
    peer = reloaded_by_transformers(getattr(transformers, cls), tmp_path / "hf")
    for shape in (NATIVE, OTHER) if cls == "DINOv3ViTModel" else (NATIVE,):
        assert_outputs(model, peer, torch.randn(shape))


@pytest.mark.parametrize("config, expected", [
    (dict(rope="axial", rope_ref_grid=16, num_classes=3),  # EVA's rotary grid, an absolute table and a head
     "HF's DINOv3ViTModel cannot hold a head, rope_grid='index', rope_half=False, rope_ref_grid=16, "
     "pos_embed='learned'"),
    (dict(rope="axial", rope_grid="centered", rope_half=True, pos_embed="none", pool="gap", qk_norm=True),
     "HF's DINOv3ViTModel cannot hold qk_norm=True, pool='gap'"),
    (dict(norm="rms", patch_norm=True, mlp="swiglu"), "HF's Aimv2VisionModel cannot hold a [class] token"),
    (dict(norm="rms", patch_norm=True, mlp="swiglu", class_token=False, pool="map"),
     "HF's Aimv2VisionModel cannot hold an attention pool with an MLP (pool_mlp_dim=None; AIMv2's head has none)"),
    (dict(norm="rms", class_token=False, pool="gap", image_size=(32, 40)),
     "HF's Aimv2VisionModel cannot hold patch_norm=False, mlp='gelu', non-square images"),
])
def test_writers_refuse_what_the_format_cannot_hold_naming_it(tmp_path, config, expected):
    model = vitkit.create_model(vitkit.ViTConfig(**{**ROPE_VIT, **config}))
    with pytest.raises(vitkit.CheckpointError) as error:
        export(model, tmp_path / "out", "hf")
    assert str(error.value) == (f"cannot write {tmp_path / 'out'}: {expected}; write it as 'native' (vitkit's own "
                                f"format holds every model) or, to run it elsewhere, as 'onnx'")
    assert not (tmp_path / "out").exists()


def test_hf_model_types_vitkit_does_not_read_are_named(tmp_path):
    config = transformers.DINOv3ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])
    transformers.DINOv3ConvNextModel(config).save_pretrained(tmp_path / "convnext")
    with pytest.raises(vitkit.CheckpointError) as error:
        vitkit.load(tmp_path / "convnext")
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'convnext' / 'config.json'}: model_type='dinov3_convnext' "
                              f"(DINOv3ConvNextModel) is not a model vitkit reads; it reads HF's vit, deit, ")
    assert "dinov3_vit, aimv2_vision_model" in message and "siglip2" in message and "\n" not in message


def dinov3_directory(directory, config=None, drop=None):
    """A DINOv3 directory as transformers saves it, then with ``config`` fields changed and the weight ``drop``
    left out."""
    dinov3().save_pretrained(directory)
    fields = {**json.loads((directory / "config.json").read_text()), **(config or {})}
    (directory / "config.json").write_text(json.dumps(fields))
    weights = directory / "model.safetensors"
    save_file({key: value for key, value in load_file(weights).items() if key != drop}, weights)
    return directory


@pytest.mark.parametrize("config, expected", [
    (dict(num_attention_heads=5), "num_attention_heads=5 with hidden_size=64; expected a head count that divides "
                                  "hidden_size into heads of a width divisible by 4 (DINOv3's rotary embedding "
                                  "turns pairs of channels on two axes)"),
    (dict(num_attention_heads=32), "num_attention_heads=32 with hidden_size=64; expected a head count that "
                                   "divides hidden_size into heads of a width divisible by 4"),
    (dict(use_gated_mlp=True), "hidden_act='gelu' with use_gated_mlp=True; expected ['silu', 'swish']"),
    (dict(num_register_tokens=-1), "num_register_tokens=-1; expected an integer >= 0"),
    (dict(key_bias="no"), "key_bias='no'; expected true or false"),
])
def test_bad_dinov3_configs_are_one_line_errors(tmp_path, config, expected):
    directory = dinov3_directory(tmp_path / "hf", config)
    with pytest.raises(vitkit.CheckpointError) as error:
        vitkit.load(directory)
    assert str(error.value).startswith(f"{directory / 'config.json'}: {expected}")
    assert "\n" not in str(error.value)


def test_a_missing_weight_is_named_by_the_strict_load(tmp_path):
    directory = dinov3_directory(tmp_path / "hf", drop="layer.1.norm2.weight")
    with pytest.raises(vitkit.CheckpointError, match=r"does not fit the model it describes: missing keys \(1\): "
                                                     r"blocks.1.norm2.weight$"):
        vitkit.load(directory)


def test_aimv2_native_resolution_models_are_refused(tmp_path):
    aimv2(is_native=True).save_pretrained(tmp_path / "hf")
    with pytest.raises(vitkit.CheckpointError, match=r"config.json: is_native=true; AIMv2's native-resolution model"):
        vitkit.load(tmp_path / "hf")


def test_preprocessing_is_read_from_the_processor_beside_the_weights(tmp_path):
    """transformers' DINOv3 processor: ImageNet statistics, the whole image resized."""
    directory = dinov3_directory(tmp_path / "hf")
    transformers.DINOv3ViTImageProcessorFast().save_pretrained(directory)
    provenance = vitkit.load(directory).config.provenance
    assert (provenance.format, provenance.normalization, provenance.crop_pct) == ("hf-dinov3", "imagenet", 1.0)
