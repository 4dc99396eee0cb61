"""open_clip hub folders whose image tower is a timm model (``vision_cfg.timm_model_name``: SigLIP, SigLIP 2, PE-core)
and whose text is tokenized by an HF tokenizer (``text_cfg.hf_tokenizer_name``: SigLIP, SigLIP 2, MetaCLIP 2),
built and saved by open_clip's own code (``save_for_hf``, the writer of ``push_to_hf_hub``); token ids, image and text
embeddings and the CLI's probabilities against open_clip's."""

import json
import shutil

import pytest
import torch

import vitkit
from interop_helpers import randomised
from vitkit.data.images import read_image
from vitkit.evaluate.predict import image_transform

from test_zeroshot import CAPTIONS, assert_close, check_cli, cli_error, cli_json, gemma_tokenizer, image_files, \
    peer_probabilities

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")
pytest.importorskip("timm")
spm = pytest.importorskip("sentencepiece")

TINY_TEXT = dict(width=32, heads=2, layers=2)
SIGLIP_TEXT = dict(TINY_TEXT, no_causal_mask=True, proj_bias=True, pool_type="last", norm_kwargs={"eps": 1e-6},
                   tokenizer_kwargs={"clean": "canonicalize"})


def t5_tokenizer(folder):
    """A T5 unigram tokenizer (what SigLIP's open_clip folders hold) over pieces SentencePiece learns here."""
    folder.mkdir(parents=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(["a photo of a cat", "a photo of a dog", "the quick brown fox jumps over the lazy dog",
                                 "a bird on a tree", "an image of a car on the road"] * 20))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "tiny"), vocab_size=32, pad_id=0,
                                   eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    pieces = spm.SentencePieceProcessor(model_file=str(folder / "tiny.model"))
    vocab = [(pieces.id_to_piece(i), pieces.get_score(i)) for i in range(pieces.get_piece_size())]
    tokenizer = transformers.T5Tokenizer(vocab=vocab, extra_ids=0, unk_token="<unk>", pad_token="<pad>",
                                         eos_token="</s>")
    tokenizer.save_pretrained(folder / "tokenizer")
    return folder / "tokenizer", len(tokenizer)


def saved(peer, config, folder, tokenizer_folder=None, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)):
    """``peer`` as open_clip's push_to_hf_hub writes it (config, safetensors, the tokenizer's files)."""
    from open_clip.push_to_hf_hub import save_config_for_hf, save_for_hf
    from open_clip.tokenizer import HFTokenizer

    peer.visual.image_mean, peer.visual.image_std = mean, std
    if tokenizer_folder is None:
        folder.mkdir(parents=True)
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, folder / "open_clip_model.safetensors")
        save_config_for_hf(peer, folder / "open_clip_config.json", model_config=config)
    else:
        save_for_hf(peer, HFTokenizer(str(tokenizer_folder), context_length=config["text_cfg"]["context_length"]),
                    config, folder, safe_serialization=True)
    return folder


def built(config):
    torch.manual_seed(0)
    kind = open_clip.CustomTextCLIP if config.get("custom_text") else open_clip.CLIP
    return kind(**{key: value for key, value in config.items() if key != "custom_text"}).eval()


def perturbed(model, std=0.02):
    """Every weight moved off its init (a big tower keeps its activations in range, unlike ``randomised``)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)
    return model


@pytest.fixture(scope="module")
def siglip(tmp_path_factory):
    """open_clip's ViT-B-16-SigLIP image tower (timm's vit_base_patch16_siglip_224, attention pooled) with a tiny
    SigLIP text tower and a T5 tokenizer, the text canonicalised."""
    root = tmp_path_factory.mktemp("siglip")
    tokenizer, vocab = t5_tokenizer(root / "t5")
    config = dict(embed_dim=768, init_logit_bias=-10, custom_text=True,
                  vision_cfg=dict(image_size=224, timm_model_name="vit_base_patch16_siglip_224",
                                  timm_model_pretrained=False, timm_pool="map", timm_proj="none"),
                  text_cfg=dict(SIGLIP_TEXT, context_length=16, vocab_size=vocab,
                                hf_tokenizer_name="timm/ViT-B-16-SigLIP"))
    peer = perturbed(built(config))
    folder = saved(peer, config, root / "hub", tokenizer)
    return peer, open_clip.get_tokenizer(f"local-dir:{folder}"), folder


@pytest.fixture(scope="module")
def siglip2(tmp_path_factory):
    """SigLIP 2's shape in open_clip: a timm tower with the tanh GELU (vit_base_patch32_siglip_256), a text tower
    with ``act_kwargs.approximate='tanh'`` and a Gemma tokenizer, which does not lower-case (the cleaning does)."""
    root = tmp_path_factory.mktemp("siglip2")
    gemma, vocab = gemma_tokenizer()
    gemma.save_pretrained(root / "gemma")
    config = dict(embed_dim=768, init_logit_bias=-10, custom_text=True,
                  vision_cfg=dict(image_size=256, timm_model_name="vit_base_patch32_siglip_256",
                                  timm_model_pretrained=False, timm_pool="map", timm_proj="none"),
                  text_cfg=dict(SIGLIP_TEXT, context_length=24, vocab_size=len(vocab),
                                hf_tokenizer_name="timm/ViT-B-32-SigLIP2-256", act_kwargs={"approximate": "tanh"}))
    peer = perturbed(built(config))
    folder = saved(peer, config, root / "hub", root / "gemma")
    return peer, open_clip.get_tokenizer(f"local-dir:{folder}"), folder


def check_towers(peer, tokenizer, folder, size):
    model = vitkit.load_clip(folder)
    ids = tokenizer(CAPTIONS)
    assert torch.equal(model.tokenize(CAPTIONS), ids)
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert_close(model.encode_text(CAPTIONS), peer.encode_text(ids))
        assert_close(model.encode_image(images), peer.encode_image(images))
    assert model.logit_scale.item() == peer.logit_scale.item()
    assert (model.logit_bias is None) == (getattr(peer, "logit_bias", None) is None)
    if model.logit_bias is not None:
        assert model.logit_bias.item() == peer.logit_bias.item()
    return model


def test_siglip_timm_tower_and_t5_tokenizer_are_open_clips(siglip):
    model = check_towers(*siglip, 224)
    assert model.visual.config.provenance.format == "open_clip" and model.visual.config.pool == "map"
    assert model.text.config.causal is False and model.text.config.pool == "last"


def test_siglip2_tanh_towers_and_gemma_tokenizer_are_open_clips(siglip2):
    model = check_towers(*siglip2, 256)
    assert (model.visual.config.gelu, model.text.config.gelu) == ("tanh", "tanh")
    assert torch.equal(model.tokenize(["A CAT!"]), model.tokenize(["a cat"]))  # canonicalised before Gemma's BPE
    assert model.tokenize(["a cat"])[0, 0] == 0  # padded on the left, as transformers' Gemma tokenizer pads


def test_pe_core_as_open_clip_defines_it(tmp_path):
    """PE-Core-T-16-384 exactly as open_clip's own config builds it (timm's PE tower, its trunk's head as the
    projection; a CLIP text tower of context 32 tokenized by open_clip's BPE)."""
    config = open_clip.get_model_config("PE-Core-T-16-384")
    peer = perturbed(built(config))
    folder = saved(peer, config, tmp_path / "hub", mean=open_clip.OPENAI_DATASET_MEAN,
                   std=open_clip.OPENAI_DATASET_STD)
    model = check_towers(peer, open_clip.get_tokenizer(f"local-dir:{folder}"), folder, 384)
    assert model.text.config.context_length == 32 and model.visual.config.provenance.normalization == "clip"


def test_metaclip2_shape_clip_tower_with_an_hf_tokenizer_pooling_its_end_token(tmp_path):
    """MetaCLIP 2's open_clip configs: CLIP's own ViT, a text tower pooled at the first end token (``eos_id``) of
    an HF tokenizer (here T5's, whose end token is 1)."""
    tokenizer, vocab = t5_tokenizer(tmp_path / "t5")
    config = dict(embed_dim=16, quick_gelu=True,
                  vision_cfg=dict(image_size=32, layers=2, width=64, patch_size=8, head_width=16),
                  text_cfg=dict(TINY_TEXT, context_length=16, vocab_size=vocab, pool_type="eos", eos_id=1,
                                hf_tokenizer_name="facebook/xlm-v-base", tokenizer_kwargs={"clean": "canonicalize"}))
    peer = randomised(built(config))
    folder = saved(peer, config, tmp_path / "hub", tokenizer)
    model = check_towers(peer, open_clip.get_tokenizer(f"local-dir:{folder}"), folder, 32)
    assert model.text.config.pool == "eos" and model.text.config.eos_token_id == 1


def test_an_open_clip_siglip_saved_with_transformers_sentencepiece_tokenizer(tmp_path):
    """An open_clip SigLIP whose tokenizer is transformers' SiglipTokenizer (a lone spiece.model, no tokenizer.json):
    open_clip's cleaning, then SigLIP's canonicalisation, end token and padding."""
    t5_tokenizer(tmp_path / "t5")
    transformers.SiglipTokenizer(str(tmp_path / "t5" / "tiny.model")).save_pretrained(tmp_path / "spm")
    config = dict(embed_dim=192, init_logit_bias=-10, custom_text=True,  # the trunk's width: no projection
                  vision_cfg=dict(image_size=224, timm_model_name="vit_tiny_patch16_224", timm_pool="map",
                                  timm_proj="none"),
                  text_cfg=dict(SIGLIP_TEXT, context_length=16, vocab_size=32, hf_tokenizer_name="timm/ViT-B-16-SigLIP"))
    peer = perturbed(built(config))
    folder = saved(peer, config, tmp_path / "hub", tmp_path / "spm")
    assert (folder / "spiece.model").is_file() and not (folder / "tokenizer.json").exists()
    check_towers(peer, open_clip.get_tokenizer(f"local-dir:{folder}"), folder, 224)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(settings, tokenizer_class="AlbertTokenizer")))
    with pytest.raises(vitkit.CheckpointError, match="tokenizer_class='AlbertTokenizer' with no tokenizer.json"):
        vitkit.load_clip(folder)


def test_a_linear_projection_after_timm_pooling(tmp_path):
    """``timm_proj='linear'`` (open_clip's own projection, bias-free by default) after the trunk's average pool."""
    config = dict(embed_dim=24, vision_cfg=dict(image_size=224, timm_model_name="vit_tiny_patch16_224",
                                                timm_pool="avg", timm_proj="linear"),
                  text_cfg=dict(TINY_TEXT, context_length=12, vocab_size=49408))
    peer = perturbed(built(config))
    folder = saved(peer, config, tmp_path / "hub")
    model = check_towers(peer, open_clip.get_tokenizer(f"local-dir:{folder}"), folder, 224)
    assert model.visual.config.pool == "gap" and model.visual.config.num_classes == 24
    from safetensors.torch import load_file, save_file
    weights = load_file(folder / "open_clip_model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("visual.head.")},
              folder / "open_clip_model.safetensors")
    with pytest.raises(vitkit.CheckpointError, match="no visual.head.proj.weight; .* timm_proj='linear'"):
        vitkit.load(folder)


def test_cli_probabilities_of_an_open_clip_siglip(siglip, tmp_path, capsys):
    """--multi-label: SigLIP's per-class sigmoid of exp(scale) * cosine + bias; images as predict prepares them."""
    peer, tokenizer, folder = siglip
    paths, classes = image_files(tmp_path), ["cat", "dog", "bird"]
    records = cli_json(capsys, folder, "--images", *paths, "--classes", *classes, "--templates", "a photo of a {}",
                       "--top-k", 2, "--multi-label")
    model = vitkit.load_clip(folder)
    images = torch.stack([image_transform(model.visual, read_image(p), "crop", False)(read_image(p)) for p in paths])
    with torch.no_grad():
        expected = peer_probabilities(peer, tokenizer, peer.encode_image, images, classes, ["a photo of a {}"],
                                      peer.logit_scale, peer.logit_bias)
    check_cli(records, paths, classes, expected)


# ------------------------------------------------------------------------------------------------ bad input
def edited(folder, tmp_path, change):
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "open_clip_config.json").read_text())
    change(config["model_cfg"])
    (copy / "open_clip_config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("change,message", [
    (lambda c: c["vision_cfg"].update(timm_pool="abs_attn"), r"timm_pool='abs_attn', timm_proj='none': vitkit reads"),
    (lambda c: c["vision_cfg"].update(timm_proj="mlp"), r"timm_proj='mlp'"),
    (lambda c: c["vision_cfg"].update(timm_model_name=7), r"vision_cfg.timm_model_name=7; expected a non-empty"),
    (lambda c: c["text_cfg"].update(tokenizer_mode="clips"), r"text_cfg.tokenizer_mode='clips'"),
    (lambda c: c["text_cfg"]["tokenizer_kwargs"].update(clean="shout"), r"tokenizer_kwargs.clean='shout'"),
    (lambda c: c["text_cfg"].update(act_kwargs={"approximate": "cubic"}), r"text_cfg.act_kwargs="),
])
def test_towers_vitkit_does_not_compute_are_refused_by_field(siglip, tmp_path, change, message):
    with pytest.raises(vitkit.CheckpointError, match=message):
        vitkit.load_clip(edited(siglip[2], tmp_path, change))


def test_a_missing_hf_tokenizer_names_its_repo_and_tokenizer_dir_mends_it(siglip, tmp_path, capsys):
    peer, tokenizer, folder = siglip
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(vitkit.CheckpointError, match=r"no tokenizer.json; .*timm/ViT-B-16-SigLIP"):
        vitkit.load_clip(bare)
    code, err = cli_error(capsys, bare, "--images", *image_files(tmp_path, 1), "--classes", "cat", "--templates",
                          "simple")
    assert code == 2 and "--tokenizer DIR" in err and "timm/ViT-B-16-SigLIP" in err
    assert torch.equal(vitkit.load_clip(bare, tokenizer=folder).tokenize(CAPTIONS), tokenizer(CAPTIONS))


def test_a_timm_tower_without_its_trunk_is_one_error(siglip, tmp_path):
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "copy"
    shutil.copytree(siglip[2], copy)
    weights = load_file(copy / "open_clip_model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("visual.")}, copy / "open_clip_model.safetensors")
    with pytest.raises(vitkit.CheckpointError, match=r"no visual.trunk.\* weights; .* 'vit_base_patch16_siglip_224'"):
        vitkit.load(copy)


def test_a_squashing_preprocess_is_said_with_the_flag_that_matches_it(siglip, tmp_path):
    """open_clip's SigLIP configs stretch whole images (``resize_mode: squash``) where vitkit's default crops: one
    warning naming the field and ``--resize stretch``."""
    copy = tmp_path / "squash"
    shutil.copytree(siglip[2], copy)
    config = json.loads((copy / "open_clip_config.json").read_text())
    config["preprocess_cfg"]["resize_mode"] = "squash"
    (copy / "open_clip_config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"preprocess_cfg.resize_mode='squash'; .* --resize stretch"):
        vitkit.load(copy)
