"""The families on the ViT skeleton (DeiT, DeiT-III, DINOv2 with registers, CLIP, SigLIP, QK-norm, SwiGLU),
saved by timm's and transformers' own models with every distinctive weight randomised, load with their
logits or pooled features."""

from functools import partial

import pytest
import torch
from interop_helpers import randomised
from safetensors.torch import save_file

import vitkit

timm = pytest.importorskip("timm")

# dynamic_img_size: timm resamples its position table for other sizes, to be matched too.
BASE = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2, num_classes=10,
            dynamic_img_size=True)


def timm_family(family):
    """A small timm model of ``family`` with its distinctive settings, and the overrides a bare state
    dict of it needs (the numerics the weights cannot show)."""
    from timm.layers import SwiGLUPacked
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    kinds = {
        "deit": (VisionTransformer, {}, {}),
        "deit-distilled": (VisionTransformerDistilled, {}, {}),
        "deit3": (VisionTransformer, dict(no_embed_class=True, init_values=1e-6), {}),
        "dinov2": (VisionTransformer, dict(init_values=1e-5), {}),
        "dinov2-reg4": (VisionTransformer, dict(init_values=1e-5, reg_tokens=4, no_embed_class=True), {}),
        "clip": (VisionTransformer, dict(pre_norm=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-5)),
                 dict(ln_eps=1e-5)),
        "clip-quickgelu": (VisionTransformer, dict(pre_norm=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-5),
                                                   act_layer="quick_gelu"), dict(ln_eps=1e-5, gelu="quick")),
        "siglip": (VisionTransformer, dict(class_token=False, global_pool="map", act_layer="gelu_tanh"),
                   dict(gelu="tanh")),
        "qk-norm": (VisionTransformer, dict(qk_norm=True), {}),
        "swiglu": (VisionTransformer, dict(mlp_layer=SwiGLUPacked, act_layer=torch.nn.SiLU, mlp_ratio=4,
                                           init_values=1e-5), {}),
    }
    cls, kwargs, overrides = kinds[family]
    return randomised(cls(**{**BASE, **kwargs})), {"num_heads": 4, **overrides}


FAMILIES = ["deit", "deit-distilled", "deit3", "dinov2", "dinov2-reg4", "clip", "clip-quickgelu", "siglip",
            "qk-norm", "swiglu"]


@pytest.mark.parametrize("family", FAMILIES)
def test_timm_families_give_timms_logits(tmp_path, family):
    peer, overrides = timm_family(family)
    path = tmp_path / "peer.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, path)
    model = vitkit.load(path, **overrides)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in peer.parameters())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(model.forward_head(model.forward_features(x), pre_logits=True),
                                   peer.forward_head(peer.forward_features(x), pre_logits=True), atol=1e-5, rtol=0)
        x = torch.randn(1, 3, 48, 40)  # another grid: the position table resampled as timm does
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)


def test_writers_refuse_what_their_format_cannot_hold(tmp_path):
    """Google's npz and HF's ViT have no LayerScale or registers: refused, naming the fields; a position
    table without prefix rows is written with zero rows there, which is exactly equivalent."""
    from vitkit.checkpoints import export
    from vitkit.checkpoints.google import write_npz
    from vitkit.checkpoints.hf import write_hf

    config = dict(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=3)
    dinov2 = vitkit.create_model(vitkit.ViTConfig(**config, layer_scale=1e-5, reg_tokens=4, no_embed_class=True))
    for write in (write_npz, write_hf):
        with pytest.raises(vitkit.CheckpointError, match="has no reg_tokens=4, layer_scale=1e-05"):
            write(dinov2, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(vitkit.CheckpointError, match="HF's dinov2 model cannot hold qk_norm=True, a head"):
        export(vitkit.create_model(vitkit.ViTConfig(**config, layer_scale=1.0, qk_norm=True)), tmp_path / "out", "hf")
    deit3 = randomised(vitkit.create_model(vitkit.ViTConfig(**config, no_embed_class=True)))
    x = torch.randn(2, 3, 16, 16)
    for write, name in ((write_npz, "m.npz"), (write_hf, "hf")):
        again = vitkit.load(write(deit3, tmp_path / name), gelu="exact")  # npz files do not record it
        assert again.config.pos_embed == "learned"
        with torch.no_grad():
            torch.testing.assert_close(again(x), deit3(x), atol=1e-5, rtol=0)


HF_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                patch_size=8)
TEXT_SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


def hf_family(family):
    """A small transformers model of ``family`` with random weights everywhere, and how to read its output:
    (model, inputs -> the peer's logits or pooled features, vitkit model -> the same)."""
    transformers = pytest.importorskip("transformers")
    vitkit_logits = lambda m, x: m(x)  # noqa: E731
    vitkit_pooled = lambda m, x: m.forward_head(m.forward_features(x), pre_logits=True)  # noqa: E731
    resample = dict(interpolate_pos_encoding=True)  # DeiT, CLIP and SigLIP resample positions only when asked
    dinov2 = dict(HF_SMALL, mlp_ratio=2)
    del dinov2["intermediate_size"]
    if family == "deit-teacher":
        peer = transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**HF_SMALL, num_labels=5))
        return peer, lambda x: peer(pixel_values=x, **resample).logits, vitkit_logits
    if family == "deit-model":
        peer = transformers.DeiTModel(transformers.DeiTConfig(**HF_SMALL), add_pooling_layer=False)
        return peer, lambda x: peer(pixel_values=x, **resample).last_hidden_state, lambda m, x: m.forward_features(x)
    if family == "deit-model-pooler":  # the pooler (Linear + tanh on [class]) is vitkit's pre-logits layer
        peer = transformers.DeiTModel(transformers.DeiTConfig(**HF_SMALL))
        return peer, lambda x: peer(pixel_values=x, **resample).pooler_output, vitkit_logits
    if family in ("dinov2", "dinov2-swiglu"):
        peer = transformers.Dinov2Model(transformers.Dinov2Config(**dinov2, use_swiglu_ffn=family.endswith("swiglu")))
        return peer, lambda x: peer(pixel_values=x).pooler_output, vitkit_pooled
    if family == "dinov2-reg":
        peer = transformers.Dinov2WithRegistersModel(transformers.Dinov2WithRegistersConfig(**dinov2,
                                                                                           num_register_tokens=4))
        return peer, lambda x: peer(pixel_values=x).pooler_output, vitkit_pooled
    if family == "clip":
        peer = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**HF_SMALL))
        return peer, lambda x: peer(pixel_values=x, **resample).pooler_output, vitkit_pooled
    if family == "clip-projection":
        peer = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**HF_SMALL, projection_dim=16))
        return peer, lambda x: peer(pixel_values=x, **resample).image_embeds, vitkit_logits
    if family == "clip-whole":
        peer = transformers.CLIPModel(transformers.CLIPConfig(vision_config=HF_SMALL, text_config=TEXT_SMALL,
                                                              projection_dim=16))
        return peer, lambda x: peer.get_image_features(pixel_values=x, **resample).pooler_output, vitkit_logits
    if family == "siglip":
        peer = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**HF_SMALL))
        return peer, lambda x: peer(pixel_values=x, **resample).pooler_output, vitkit_pooled
    if family == "siglip-whole":
        peer = transformers.SiglipModel(transformers.SiglipConfig(vision_config=HF_SMALL, text_config=TEXT_SMALL))
        return peer, lambda x: peer.get_image_features(pixel_values=x, **resample).pooler_output, vitkit_pooled
    raise AssertionError(family)


HF_FAMILIES = ["deit-teacher", "deit-model", "deit-model-pooler", "dinov2", "dinov2-swiglu", "dinov2-reg", "clip",
               "clip-projection", "clip-whole", "siglip", "siglip-whole"]


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_hf_families_give_transformers_outputs(tmp_path, family):
    peer, theirs, ours = hf_family(family)
    randomised(peer)
    peer.save_pretrained(tmp_path / "hf")
    if family.endswith("whole"):
        with pytest.warns(UserWarning, match="its text tower .* is left out"):
            model = vitkit.load(tmp_path / "hf")
    else:
        model = vitkit.load(tmp_path / "hf")
    with torch.no_grad():
        for x in (torch.randn(2, 3, 32, 32), torch.randn(1, 3, 48, 40)):  # native, then resampled positions
            torch.testing.assert_close(ours(model, x), theirs(x), atol=1e-5, rtol=0)


def test_unsupported_families_are_refused_naming_the_keys(tmp_path):
    """An Eva of no timm definition: whether it turned its queries by rotary embeddings is not in its weights,
    so it is refused rather than read with them left out; BEiT's relative position tables are refused by name."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva

    peer = Eva(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, use_rot_pos_emb=True, num_classes=3)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "eva.safetensors")
    with pytest.raises(vitkit.CheckpointError, match=r"eva.safetensors: a state dict of timm's Eva layout .*whether and how it used rotary"):
        vitkit.load(tmp_path / "eva.safetensors", num_heads=4)
    beit = Beit(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, use_rel_pos_bias=True)
    save_file({k: v.contiguous() for k, v in beit.state_dict().items()}, tmp_path / "beit.safetensors")
    with pytest.raises(vitkit.CheckpointError, match=r"BEiT / relative position bias tables .* give it away: "
                                                     r"blocks.0.attn.relative_position_bias_table"):
        vitkit.load(tmp_path / "beit.safetensors", num_heads=4)


def test_hf_heads_without_a_counterpart_are_refused(tmp_path):
    transformers = pytest.importorskip("transformers")
    dinov2 = dict(HF_SMALL, num_labels=3)
    del dinov2["intermediate_size"]
    transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**dinov2)).save_pretrained(tmp_path / "d")
    with pytest.raises(vitkit.CheckpointError, match="classifier.bias, classifier.weight: this HF head"):
        vitkit.load(tmp_path / "d")


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("quickgelu,layer_scale", [(False, None), (True, 0.1)])
def test_open_clip_image_towers_give_open_clips_embeddings(tmp_path, whole, quickgelu, layer_scale):
    """open_clip's own model (its visual tower, or the whole CLIP as it saves it), read with its image embeddings."""
    open_clip = pytest.importorskip("open_clip")

    vision = dict(image_size=32, layers=2, width=64, patch_size=8, head_width=16, mlp_ratio=2,
                  ls_init_value=layer_scale)
    text = dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1)
    peer = randomised(open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text, quick_gelu=quickgelu))
    state = peer.state_dict() if whole else peer.visual.state_dict()
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "epoch_3.pt")
    overrides = dict(num_heads=4, gelu="quick") if quickgelu else dict(num_heads=4)
    if whole:
        with pytest.warns(UserWarning, match="its text tower .* is left out"):
            model = vitkit.load(tmp_path / "epoch_3.pt", **overrides)
    else:
        model = vitkit.load(tmp_path / "epoch_3.pt", **overrides)
    assert (model.config.pre_norm, model.config.patch_bias, model.config.ln_eps) == (True, False, 1e-5)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer.encode_image(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("architecture,numerics", [
    ("deit_tiny_distilled_patch16_224", ("exact", 1e-6)), ("deit3_small_patch16_224", ("exact", 1e-6)),
    ("vit_small_patch14_reg4_dinov2", ("exact", 1e-6)), ("vit_base_patch16_clip_quickgelu_224", ("quick", 1e-5)),
    ("vit_base_patch32_siglip_256", ("tanh", 1e-6)),
])
def test_timm_hub_directories_of_the_families(tmp_path, architecture, numerics):
    """What ``hf-hub:timm/...`` holds: config.json names the architecture, whose family tells the numerics
    (CLIP's eps 1e-5 and QuickGELU, this SigLIP's tanh GELU) that the weights cannot."""
    from timm.models._hub import save_for_hf

    peer = randomised(timm.create_model(architecture, img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                                        num_classes=5))
    save_for_hf(peer, str(tmp_path / "hub"))
    model = vitkit.load(tmp_path / "hub")
    assert (model.config.gelu, model.config.ln_eps) == numerics
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["deit-distilled", "deit3", "dinov2-reg4", "clip-quickgelu", "siglip", "swiglu"])
def test_timm_writer_gives_timm_its_own_model_back(tmp_path, family):
    """Read a timm state dict, write it back with vitkit's timm writer: timm loads it strictly into a fresh
    model of the same family, which gives the original logits."""
    from safetensors.torch import load_file
    from vitkit.checkpoints import export

    peer, overrides = timm_family(family)
    path = tmp_path / "peer.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, path)
    written = export(vitkit.load(path, **overrides), tmp_path / "out.safetensors", "timm")
    fresh, _ = timm_family(family)
    fresh.load_state_dict(load_file(written), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), peer(x), atol=0, rtol=0)


def test_timm_writer_refuses_what_timm_cannot_hold(tmp_path):
    from vitkit.checkpoints import export

    model = vitkit.create_model(vitkit.ViTConfig(image_size=16, patch_size=8, dim=16, depth=1, num_heads=2, mlp_dim=32,
                                                 num_classes=3, pos_embed="relative", representation_size=8))
    with pytest.raises(vitkit.CheckpointError, match="has no pos_embed='relative' .*, pre-logits layer"):
        export(model, tmp_path / "out.safetensors", "timm")
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("name,peer_class,output", [
    ("DeiT-S/16-distilled", "DeiTForImageClassificationWithTeacher", "logits"),
    ("DeiT-S/16-distilled", "DeiTModel", "pooler_output"),
    ("DINOv2-S/14", "Dinov2Model", "pooler_output"),
    ("DINOv2-S/14-reg4", "Dinov2WithRegistersModel", "pooler_output"),
    ("DeiT3-S/16", "Dinov2Model", "pooler_output"),  # LayerScale and no [class] position: DINOv2's format holds it
    ("CLIP-B/16", "CLIPVisionModel", "pooler_output"),
    ("SigLIP-B/16", "SiglipVisionModel", "pooler_output"),
])
def test_hf_writer_gives_transformers_the_family_model(tmp_path, name, peer_class, output):
    """vitkit's export to HF, read by transformers' own class for the family: same pooled features or logits."""
    transformers = pytest.importorskip("transformers")
    from vitkit.checkpoints import export

    classes = 5 if peer_class.endswith("WithTeacher") else 0
    pooler = dict(representation_size=64) if peer_class == "DeiTModel" else {}  # HF's pooler on [class]
    model = randomised(vitkit.create_model(name, image_size=32, patch_size=8, dim=64, depth=2, num_heads=4,
                                           mlp_dim=128, num_classes=classes, **pooler))
    export(model, tmp_path / "hf", "hf")
    peer, info = getattr(transformers, peer_class).from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = model(x) if output == "logits" or pooler else model.forward_head(model.forward_features(x), True)
        torch.testing.assert_close(getattr(peer.eval()(pixel_values=x), output), ours, atol=1e-5, rtol=0)
    again = vitkit.load(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), atol=1e-5, rtol=0)


def test_open_clip_hub_directories_tell_heads_activation_and_statistics(tmp_path):
    """What open_clip's push_to_hf_hub writes (its own config writer; the weights as save_for_hf saves them)."""
    open_clip = pytest.importorskip("open_clip")
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
    from open_clip.push_to_hf_hub import save_config_for_hf

    config = dict(embed_dim=16, quick_gelu=True,
                  vision_cfg=dict(image_size=32, layers=2, width=64, patch_size=8, head_width=16, mlp_ratio=2),
                  text_cfg=dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1))
    peer = randomised(open_clip.CLIP(**config))
    peer.visual.image_mean, peer.visual.image_std = OPENAI_DATASET_MEAN, OPENAI_DATASET_STD  # as create_model sets
    (tmp_path / "hub").mkdir()
    weights = {k: v.contiguous() for k, v in peer.state_dict().items()}
    save_file(weights, tmp_path / "hub" / "open_clip_model.safetensors")
    save_config_for_hf(peer, tmp_path / "hub" / "open_clip_config.json", model_config=config)
    with pytest.warns(UserWarning, match="text tower"):
        model = vitkit.load(tmp_path / "hub")
    assert (model.config.num_heads, model.config.gelu, model.config.provenance.normalization) == (4, "quick", "clip")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer.encode_image(x), atol=1e-5, rtol=0)
    config["vision_cfg"]["attentional_pool"] = True
    save_config_for_hf(peer, tmp_path / "hub" / "open_clip_config.json", model_config=config)
    with pytest.raises(vitkit.CheckpointError, match="vision_cfg.attentional_pool=True: not the CLIP ViT tower"):
        vitkit.load(tmp_path / "hub")


@pytest.mark.parametrize("size", [16, 24])
def test_register_tables_of_tiny_grids_are_told_apart(tmp_path, size):
    """A 3x3 table is also 5 prefix rows + 2x2, and a 2x2 one is shorter than the prefix: timm's register models
    have no prefix rows, which the reader assumes (``no_embed_class=False`` overrides it)."""
    peer, overrides = timm_family("dinov2-reg4")
    peer = randomised(type(peer)(**{**BASE, "img_size": size, "init_values": 1e-5, "reg_tokens": 4,
                                    "no_embed_class": True}))
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "reg.safetensors")
    model = vitkit.load(tmp_path / "reg.safetensors", **overrides)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)
