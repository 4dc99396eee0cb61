"""Text towers of image-text checkpoints and zero-shot classification, against the peers that define them: tiny
CLIPModel and Siglip2Model built and saved by transformers with their tokenizer files, and a CLIP saved as an
open_clip hub folder; token ids, text and image embeddings, and the CLI's probabilities are the peers'."""

import json
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

import vitkit
from interop_helpers import randomised
from vitkit.cli import main
from vitkit.evaluate.predict import image_transform
from vitkit.data.images import read_image

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")

CAPTIONS = ["a photo of a cat", "A DOG, Running!", "  cat   dog  ", "a photo of a cat dog " * 8]  # the last: too long
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def clip_tokenizer():
    """CLIP's byte-level BPE over a vocabulary of bytes and a few merges, by transformers' own class."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(alphabet + [c + "</w>" for c in alphabet])}
    merges = [("a", "t</w>"), ("c", "at</w>"), ("d", "o"), ("do", "g</w>"), ("p", "h"), ("ph", "o")]
    for first, second in merges:
        vocab[first + second] = len(vocab)
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return transformers.CLIPTokenizer(vocab=vocab, merges=merges), vocab


def gemma_tokenizer():
    """A Gemma BPE (what SigLIP 2's hub folders hold: it does not lower-case), upper and lower case apart."""
    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"])}
    for char in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ▁,.!":
        vocab[char] = len(vocab)
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    merges = [("c", "a"), ("ca", "t"), ("▁", "ca"), ("d", "o")]
    for first, second in merges:
        vocab[first + second] = len(vocab)
    return transformers.GemmaTokenizer(vocab=vocab, merges=merges), vocab


@pytest.fixture(scope="module", params=["eos", "legacy-eos-2"])
def hf_clip(request, tmp_path_factory):
    """A CLIPModel with its tokenizer; ``legacy-eos-2``: a config from before HF's fix, pooled at the largest id."""
    tokenizer, vocab = clip_tokenizer()
    eos = vocab["<|endoftext|>"] if request.param == "eos" else 2
    text = dict(TEXT, vocab_size=len(vocab), max_position_embeddings=16, bos_token_id=vocab["<|startoftext|>"],
                eos_token_id=eos, pad_token_id=vocab["<|endoftext|>"])
    config = transformers.CLIPConfig(text_config=text, vision_config=dict(VISION, image_size=32, patch_size=8),
                                     projection_dim=24)
    torch.manual_seed(0)
    peer = randomised(transformers.CLIPModel(config))
    folder = tmp_path_factory.mktemp("clip") / "hf"
    peer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return peer, transformers.AutoTokenizer.from_pretrained(folder), folder


@pytest.fixture(scope="module")
def hf_siglip2(tmp_path_factory):
    """A Siglip2Model with a Gemma tokenizer.json, context 64 (what Siglip2Processor pads and cuts to)."""
    tokenizer, vocab = gemma_tokenizer()
    config = transformers.Siglip2Config(text_config=dict(TEXT, vocab_size=len(vocab), max_position_embeddings=64),
                                        vision_config=dict(VISION, num_patches=16, patch_size=8))
    torch.manual_seed(0)
    peer = randomised(transformers.Siglip2Model(config))
    folder = tmp_path_factory.mktemp("siglip2") / "hf"
    peer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor = transformers.Siglip2Processor(image_processor=transformers.Siglip2ImageProcessor(),
                                              tokenizer=transformers.AutoTokenizer.from_pretrained(folder))
    return peer, processor, folder


@pytest.fixture(scope="module")
def hf_siglip(tmp_path_factory):
    """A SiglipModel with a SentencePiece model trained here (what SigLIP's hub folders hold: spiece.model)."""
    spm = pytest.importorskip("sentencepiece")
    folder = tmp_path_factory.mktemp("siglip") / "hf"
    folder.mkdir()
    corpus = folder.parent / "corpus.txt"
    corpus.write_text("\n".join(["a photo of a cat", "a photo of a dog", "the quick brown fox jumps over the lazy dog",
                                  "a bird on a tree", "an image of a car on the road"] * 20))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder.parent / "tiny"), vocab_size=32,
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    tokenizer = transformers.SiglipTokenizer(str(folder.parent / "tiny.model"))
    config = transformers.SiglipConfig(text_config=dict(TEXT, vocab_size=32, max_position_embeddings=16),
                                       vision_config=dict(VISION, image_size=32, patch_size=8))
    torch.manual_seed(0)
    peer = randomised(transformers.SiglipModel(config))
    peer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return peer, transformers.AutoTokenizer.from_pretrained(folder), folder


@pytest.fixture(scope="module")
def open_clip_hub(tmp_path_factory):
    """A CLIP as open_clip's push_to_hf_hub writes it: open_clip_config.json + open_clip_model.safetensors; the
    vocabulary is the full CLIP BPE's, which open_clip's tokenizer emits."""
    from open_clip.push_to_hf_hub import save_config_for_hf

    config = dict(embed_dim=16, quick_gelu=True,
                  vision_cfg=dict(image_size=32, layers=2, width=64, patch_size=8, head_width=16, mlp_ratio=2),
                  text_cfg=dict(context_length=12, vocab_size=49408, width=32, heads=2, layers=2))
    torch.manual_seed(0)
    peer = randomised(open_clip.CLIP(**config))
    peer.visual.image_mean, peer.visual.image_std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    folder = tmp_path_factory.mktemp("open_clip") / "hub"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, folder / "open_clip_model.safetensors")
    save_config_for_hf(peer, folder / "open_clip_config.json", model_config=config)
    return peer, open_clip.get_tokenizer(f"local-dir:{folder}"), folder


def assert_close(ours, theirs):
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_hf_clip_text_tower_gives_transformers_embeddings(hf_clip):
    peer, tokenizer, folder = hf_clip
    model = vitkit.load_clip(folder)
    theirs = tokenizer(CAPTIONS, padding=True, truncation=True, max_length=16, return_tensors="pt")
    assert torch.equal(model.tokenize(CAPTIONS), theirs.input_ids)
    assert (model.text.config.context_length, model.text.config.gelu, model.logit_bias) == (16, "quick", None)
    with torch.no_grad():
        assert_close(model.encode_text(CAPTIONS), peer.get_text_features(**theirs).pooler_output)
        images = torch.randn(2, 3, 32, 32)
        assert_close(model.encode_image(images), peer.get_image_features(pixel_values=images).pooler_output)
    assert model.logit_scale.item() == peer.logit_scale.item()


def test_the_long_caption_is_cut_as_the_peer_cuts_and_said_once(hf_clip, caplog):
    peer, tokenizer, folder = hf_clip
    model = vitkit.load_clip(folder)
    with caplog.at_level("WARNING", logger="vitkit"):
        ids = model.tokenize(CAPTIONS)
        model.tokenize(CAPTIONS)
    assert ids.shape == (4, 16) and ids[3, -1] == tokenizer.eos_token_id  # the end-of-text token kept
    assert len([r for r in caplog.records if "truncated" in r.getMessage()]) == 1


def test_metaclip2_text_tower_pools_its_first_end_token(tmp_path):
    """MetaCLIP 2 (XLM-V's Unigram tokenizer, </s> = 2): pooled at the first end token even with id 2, where CLIP's
    configs of eos_token_id 2 pool the largest id."""
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("<mask>", 0.0)]
    for piece in ["▁a", "▁photo", "▁of", "▁cat", "▁dog", "▁", *"actdoghprunixyAD", ",", "!"]:
        vocab.append((piece, -float(len(vocab))))
    tokenizer = transformers.XLMRobertaTokenizer(vocab=vocab)
    text = dict(TEXT, vocab_size=len(vocab), max_position_embeddings=16, eos_token_id=2, bos_token_id=0,
                pad_token_id=1)
    peer = randomised(transformers.MetaClip2Model(transformers.MetaClip2Config(
        text_config=text, vision_config=dict(VISION, image_size=32, patch_size=8), projection_dim=24)))
    peer.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    model = vitkit.load_clip(tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(CAPTIONS, padding=True, truncation=True,
                                                                          max_length=16, return_tensors="pt")
    assert torch.equal(model.tokenize(CAPTIONS), theirs.input_ids) and model.text.config.pool == "eos"
    with torch.no_grad():
        assert_close(model.encode_text(CAPTIONS), peer.get_text_features(**theirs).pooler_output)
        images = torch.randn(2, 3, 32, 32)
        assert_close(model.encode_image(images), peer.get_image_features(pixel_values=images).pooler_output)


def test_siglip2_text_tower_lower_cases_and_pads_as_its_processor(hf_siglip2):
    """transformers' Siglip2Tokenizer lower-cases before the Gemma tokenizer.json (which does not): 'A DOG' has the
    ids of 'a dog'; every text is padded to the 64 positions and the last one pooled, with no attention mask."""
    peer, processor, folder = hf_siglip2
    model = vitkit.load_clip(folder)
    theirs = processor(text=CAPTIONS, return_tensors="pt")
    ids = model.tokenize(CAPTIONS)
    assert torch.equal(ids, theirs["input_ids"]) and ids.shape == (4, 64)
    assert torch.equal(model.tokenize(["A DOG"]), model.tokenize(["a dog"]))
    with torch.no_grad():
        assert_close(model.encode_text(CAPTIONS), peer.get_text_features(input_ids=theirs["input_ids"]).pooler_output)
    assert (model.logit_scale.item(), model.logit_bias.item()) == (peer.logit_scale.item(), peer.logit_bias.item())
    assert (model.text.config.causal, model.text.config.pool, model.text.config.gelu) == (False, "last", "tanh")


def test_siglip_text_tower_canonicalises_and_pads_as_its_tokenizer(hf_siglip):
    """transformers' SiglipTokenizer: punctuation removed, lower-cased, whitespace collapsed, </s> appended (kept
    when the text is cut), padded with </s> to the full context."""
    peer, tokenizer, folder = hf_siglip
    model = vitkit.load_clip(folder)
    texts = [*CAPTIONS, "zebra, XYLOPHONE?"]
    theirs = tokenizer(texts, padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    ids = model.tokenize(texts)
    assert torch.equal(ids, theirs.input_ids) and ids.shape == (5, 16) and ids[3, -1] == tokenizer.eos_token_id
    with torch.no_grad():
        assert_close(model.encode_text(texts), peer.get_text_features(input_ids=theirs.input_ids).pooler_output)
        images = torch.randn(2, 3, 32, 32)
        assert_close(model.encode_image(images), peer.get_image_features(pixel_values=images).pooler_output)
    assert (model.logit_scale.item(), model.logit_bias.item()) == (peer.logit_scale.item(), peer.logit_bias.item())


def test_open_clip_text_tower_gives_open_clips_embeddings(open_clip_hub):
    peer, tokenizer, folder = open_clip_hub
    model = vitkit.load_clip(folder)
    theirs = tokenizer(CAPTIONS)
    assert torch.equal(model.tokenize(CAPTIONS), theirs) and theirs.shape == (4, 12)
    with torch.no_grad():
        assert_close(model.encode_text(CAPTIONS), peer.encode_text(theirs))
        images = torch.randn(2, 3, 32, 32)
        assert_close(model.encode_image(images), peer.encode_image(images))
    assert model.logit_scale.item() == peer.logit_scale.item()


@pytest.mark.parametrize("custom,text,bias", [
    (True, dict(ls_init_value=0.1, proj_bias=True), None),  # LayerScale, a projection with bias, under text.*
    (True, dict(pool_type="last", no_causal_mask=True, norm_kwargs={"eps": 1e-6}), -10.0),  # SigLIP-like
    (False, dict(pool_type="eos", eos_id=49407), None),
])
def test_open_clip_text_tower_options(tmp_path, custom, text, bias):
    """The text_cfg options of open_clip's own TextTransformer, in CLIP and CustomTextCLIP (weights under text.)."""
    from open_clip.push_to_hf_hub import save_config_for_hf

    config = dict(embed_dim=16, vision_cfg=dict(image_size=32, layers=1, width=64, patch_size=8, head_width=16),
                  text_cfg=dict(context_length=12, vocab_size=49408, width=32, heads=2, layers=2, **text),
                  init_logit_bias=bias, **({"custom_text": True} if custom else {}))
    built = {key: value for key, value in config.items() if key != "custom_text"}
    peer = randomised((open_clip.CustomTextCLIP if custom else open_clip.CLIP)(**built))
    peer.visual.image_mean, peer.visual.image_std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    (tmp_path / "hub").mkdir()
    weights = {k: v.contiguous() for k, v in peer.state_dict().items()}
    save_file(weights, tmp_path / "hub" / "open_clip_model.safetensors")
    save_config_for_hf(peer, tmp_path / "hub" / "open_clip_config.json", model_config=config)
    model = vitkit.load_clip(tmp_path / "hub")
    ids = open_clip.get_tokenizer(f"local-dir:{tmp_path / 'hub'}")(CAPTIONS)
    assert torch.equal(model.tokenize(CAPTIONS), ids)
    with torch.no_grad():
        assert_close(model.encode_text(CAPTIONS), peer.encode_text(ids))
    assert (model.logit_bias is None) == (bias is None)


def image_files(folder, count=2):
    paths = []
    for index in range(count):
        path = folder / f"image{index}.png"
        Image.fromarray(np.random.default_rng(index).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def cli_json(capsys, *argv):
    assert main(["zeroshot", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


class PeerEncoder:
    """A peer model with open_clip's ``encode_text`` (ids in), for open_clip's own ``build_zero_shot_classifier``."""

    def __init__(self, encode):
        self.encode = encode

    def encode_text(self, ids, normalize=False):
        embedded = self.encode(ids)
        return F.normalize(embedded, dim=-1) if normalize else embedded


def peer_probabilities(peer_model, tokenize, encode_image, images, classes, templates, scale, bias=None):
    from open_clip import build_zero_shot_classifier

    classifier = build_zero_shot_classifier(peer_model, tokenize, classes, templates, use_tqdm=False).T  # (K, E)
    logits = scale.exp() * F.normalize(encode_image(images), dim=-1) @ classifier.T
    return logits.softmax(dim=-1) if bias is None else torch.sigmoid(logits + bias)


def check_cli(records, paths, classes, expected):
    assert [record["path"] for record in records] == [record["image"] for record in records] == list(map(str, paths))
    for record, row in zip(records, expected):
        assert len(record["top_k"]) == 2
        for entry in record["top_k"]:
            assert entry["probability"] == pytest.approx(row[classes.index(entry["label"])].item(), abs=2e-6)
        assert record["top_k"][0]["label"] == classes[row.argmax()]


def test_cli_probabilities_are_those_of_the_peers_embeddings_clip(hf_clip, tmp_path, capsys):
    """Default templates (open_clip's 80): the classifier built by open_clip's own code from transformers'
    text features; the images prepared as vitkit predict prepares them."""
    peer, tokenizer, folder = hf_clip
    paths, classes = image_files(tmp_path), ["cat", "dog", "a photo"]
    records = cli_json(capsys, folder, "--images", *paths, "--classes", *classes, "--top-k", 2)
    model = vitkit.load_clip(folder)
    images = torch.stack([image_transform(model.visual, read_image(p), "crop", False)(read_image(p)) for p in paths])
    text = PeerEncoder(lambda ids: peer.get_text_features(input_ids=ids).pooler_output)
    tokenize = lambda texts: tokenizer(texts, padding=True, truncation=True, max_length=16,
                                       return_tensors="pt").input_ids
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES
    with torch.no_grad():
        expected = peer_probabilities(text, tokenize, lambda x: peer.get_image_features(pixel_values=x).pooler_output,
                                      images, classes, OPENAI_IMAGENET_TEMPLATES, peer.logit_scale)
    check_cli(records, paths, classes, expected)


def siglip2_patches(images):
    """transformers' SigLIP 2 inputs of one-size images whose patches are all valid: patches flattened as (row,
    column, channel), the grid, a mask of ones."""
    batch, channels, height, width = images.shape
    rows, cols = height // 8, width // 8
    patches = images.reshape(batch, channels, rows, 8, cols, 8).permute(0, 2, 4, 3, 5, 1)
    patches = patches.reshape(batch, rows * cols, -1)
    return dict(pixel_values=patches, spatial_shapes=torch.tensor([[rows, cols]] * batch),
                pixel_attention_mask=torch.ones(batch, rows * cols, dtype=torch.long))


@pytest.mark.parametrize("multi_label", [False, True])
def test_cli_probabilities_are_those_of_the_peers_embeddings_siglip2(hf_siglip2, tmp_path, capsys, multi_label):
    """Own templates; softmax over the classes, or with --multi-label SigLIP's sigmoid with its bias."""
    peer, processor, folder = hf_siglip2
    paths, classes, templates = image_files(tmp_path), ["Cat", "dog", "bird"], ["a photo of a {}.", "{}!"]
    records = cli_json(capsys, folder, "--images", *paths, "--classes", *classes, "--templates", *templates,
                       "--top-k", 2, *(["--multi-label"] if multi_label else []))
    model = vitkit.load_clip(folder)
    images = torch.stack([image_transform(model.visual, read_image(p), "crop", False)(read_image(p)) for p in paths])
    text = PeerEncoder(lambda ids: peer.get_text_features(input_ids=ids).pooler_output)
    tokenize = lambda texts: processor(text=texts, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert_close(model.encode_image(images), peer.get_image_features(**siglip2_patches(images)).pooler_output)
        expected = peer_probabilities(
            text, tokenize, lambda x: peer.get_image_features(**siglip2_patches(x)).pooler_output, images, classes,
            templates, peer.logit_scale,
            peer.logit_bias if multi_label else None)
    check_cli(records, paths, classes, expected)


def test_cli_probabilities_are_those_of_the_peers_embeddings_open_clip(open_clip_hub, tmp_path, capsys):
    """--templates simple (the class name alone) and a classes file, names verbatim."""
    peer, tokenizer, folder = open_clip_hub
    paths, classes = image_files(tmp_path), ["tabby cat", "dog", "Golden Retriever"]
    (tmp_path / "names.txt").write_text("\n".join(classes) + "\n")
    records = cli_json(capsys, folder, "--images", *paths, "--classes-file", tmp_path / "names.txt",
                       "--templates", "simple", "--top-k", 2)
    model = vitkit.load_clip(folder)
    images = torch.stack([image_transform(model.visual, read_image(p), "crop", False)(read_image(p)) for p in paths])
    with torch.no_grad():
        expected = peer_probabilities(peer, tokenizer, peer.encode_image, images, classes, ["{}"],
                                      peer.logit_scale)
    check_cli(records, paths, classes, expected)


# ------------------------------------------------------------------------------------------------ bad input
def cli_error(capsys, *argv):
    code = main(["zeroshot", *map(str, argv)])
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return code, err


def test_a_checkpoint_without_a_text_tower_is_one_line(tmp_path, capsys):
    vitkit.create_model("ViT-Ti/16", image_size=32, num_classes=3).save(tmp_path / "model")
    with pytest.raises(vitkit.CheckpointError, match="no text tower vitkit reads .*CLIPModel, MetaClip2Model"):
        vitkit.load_clip(tmp_path / "model")
    code, err = cli_error(capsys, tmp_path / "model", "--images", *image_files(tmp_path, 1), "--classes", "a", "b")
    assert code == 2 and "no text tower" in err


@pytest.mark.parametrize("argv,message", [
    (["--templates", "simple"], "no class names: give them"),
    (["--classes", "cat", "", "--templates", "simple"], "class 2: an empty class name"),
    (["--classes", "cat", "cat", "--templates", "simple"], "given more than once: 'cat'"),
    (["--classes", "cat", "--templates", "a photo"], "template 'a photo': expected one '{}'"),
    (["--classes", "cat", "--templates", "{} and {}"], "expected one '{}'"),
    (["--classes", "cat", "dog", "--templates", "simple", "--multi-label"], r"--multi-label: .* \(no logit_bias\)"),
    (["--classes", "cat", "--templates", "simple", "--out", "x"], "--out: for --dataset"),
])
def test_bad_classes_and_templates_are_one_line(hf_clip, tmp_path, capsys, argv, message):
    code, err = cli_error(capsys, hf_clip[2], "--images", *image_files(tmp_path, 1), *argv)
    assert code == 2 and re.search(message, err), err


def test_a_blank_line_in_the_classes_file_is_named(hf_clip, tmp_path, capsys):
    (tmp_path / "names.txt").write_text("cat\n\ndog\n")
    code, err = cli_error(capsys, hf_clip[2], "--images", *image_files(tmp_path, 1), "--classes-file",
                          tmp_path / "names.txt")
    assert code == 2 and "names.txt: line 2 is empty" in err


def test_a_missing_or_broken_tokenizer_is_one_line_and_tokenizer_dir_mends_it(hf_clip, tmp_path, capsys):
    peer, tokenizer, folder = hf_clip
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(vitkit.CheckpointError, match="no tokenizer.json; pass tokenizer=DIR"):
        vitkit.load_clip(bare)
    code, err = cli_error(capsys, bare, "--images", *image_files(tmp_path, 1), "--classes", "cat", "--templates",
                          "simple")
    assert code == 2 and "--tokenizer DIR" in err
    model = vitkit.load_clip(bare, tokenizer=folder)
    assert torch.equal(model.tokenize(CAPTIONS), vitkit.load_clip(folder).tokenize(CAPTIONS))
    (bare / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(vitkit.CheckpointError, match="tokenizer.json: not a tokenizers file"):
        vitkit.load_clip(bare)



def test_a_broken_sentencepiece_model_is_one_line(hf_siglip, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(hf_siglip[2], bare)
    (bare / "spiece.model").write_text("not a model")
    with pytest.raises(vitkit.CheckpointError, match="spiece.model: not a SentencePiece model"):
        vitkit.load_clip(bare)
    (bare / "spiece.model").unlink()
    with pytest.raises(vitkit.CheckpointError, match="no spiece.model; pass tokenizer=DIR"):
        vitkit.load_clip(bare)


def test_dataset_top1_top5_are_those_of_the_peers_classifier(open_clip_hub, tmp_path, capsys):
    """--dataset imagefolder:DIR: the classes named by its folders; top-1, per-class accuracy and the loss from
    open_clip's model and its own zero-shot classifier, on the images as vitkit's loader prepares them."""
    from open_clip import build_zero_shot_classifier
    from vitkit.data import evaluation_loader, load_dataset
    from vitkit.evaluate.preprocessing import checkpoint_transform

    peer, tokenizer, folder = open_clip_hub
    classes = ["bird", "cat", "dog"]
    for name in classes:
        (tmp_path / "data" / name).mkdir(parents=True)
        image_files(tmp_path / "data" / name, 3)
    report = cli_json(capsys, folder, "--dataset", f"imagefolder:{tmp_path / 'data'}", "--templates",
                      "a photo of a {}.", "{}")
    model = vitkit.load_clip(folder)
    data = load_dataset(f"imagefolder:{tmp_path / 'data'}", report["split"])
    images, labels = zip(*evaluation_loader(data, checkpoint_transform(model.visual.config), 64))
    images, labels = torch.cat(images), torch.cat(labels)
    with torch.no_grad():
        classifier = build_zero_shot_classifier(peer, tokenizer, classes, ["a photo of a {}.", "{}"])
        logits = peer.logit_scale.exp() * F.normalize(peer.encode_image(images), dim=-1) @ classifier
    predicted = logits.argmax(dim=-1)
    confusion = torch.bincount(labels * 3 + predicted, minlength=9).reshape(3, 3)
    assert report["images"] == 9 and report["top5"] == 1.0 and report["confusion"] == confusion.tolist()
    assert report["top1"] == pytest.approx((predicted == labels).float().mean().item())
    assert report["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), abs=1e-5)  # every logit counts


def test_dataset_class_names_must_match_its_classes(open_clip_hub, tmp_path, capsys):
    for name in ("a", "b"):
        (tmp_path / "data" / name).mkdir(parents=True)
        image_files(tmp_path / "data" / name, 1)
    code, err = cli_error(capsys, open_clip_hub[2], "--dataset", f"imagefolder:{tmp_path / 'data'}", "--classes",
                          "x", "y", "z", "--templates", "simple")
    assert code == 2 and "3 class names for the 2 classes of imagefolder:" in err


def test_a_hub_name_fetches_the_tokenizer_files_too(hf_siglip, monkeypatch):
    """hf-hub:ORG/NAME: huggingface_hub is asked for the tokenizer's files beside the weights (its download
    stood in for by the folder, filtered by the patterns asked for, as snapshot_download filters)."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from fnmatch import fnmatch

    folder = hf_siglip[2]

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        assert repo_id == "google/tiny-siglip"
        copy = folder.parent / "snapshot"
        shutil.rmtree(copy, ignore_errors=True)
        copy.mkdir()
        for path in folder.iterdir():
            if any(fnmatch(path.name, pattern) for pattern in allow_patterns):
                shutil.copy(path, copy / path.name)
        return str(copy)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    model = vitkit.load_clip("hf-hub:google/tiny-siglip")
    assert torch.equal(model.tokenize(CAPTIONS), vitkit.load_clip(folder).tokenize(CAPTIONS))


def test_a_malformed_open_clip_text_config_is_one_error(open_clip_hub, tmp_path):
    bare = tmp_path / "hub"
    shutil.copytree(open_clip_hub[2], bare)
    config = json.loads((bare / "open_clip_config.json").read_text())
    config["model_cfg"]["text_cfg"]["norm_kwargs"] = "eps"
    (bare / "open_clip_config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match="malformed text tower"):
        vitkit.load_clip(bare)
    config["model_cfg"]["text_cfg"] = None
    (bare / "open_clip_config.json").write_text(json.dumps(config))
    with pytest.raises(vitkit.CheckpointError, match="no model_cfg.text_cfg"):
        vitkit.load_clip(bare)


def test_a_task_clip_benchmark_knows_is_prompted_with_its_names_and_templates(open_clip_hub, tmp_path):
    """VTAB-1k's KITTI distance (classes 0-3 on disk): clip-benchmark's four class names and its templates, as
    open_clip's classifier builds them from clip-benchmark's own files; the report says where the prompts came from."""
    from importlib.resources import files

    from open_clip import build_zero_shot_classifier
    from vitkit.data import evaluation_loader, load_dataset
    from vitkit.evaluate.preprocessing import checkpoint_transform
    from vitkit.text.zeroshot import zeroshot_dataset

    folder = files("clip_benchmark") / "datasets"
    names = json.loads((folder / "en_classnames.json").read_text())["kitti_closest_vehicle_distance"]
    templates = json.loads((folder / "en_zeroshot_classification_templates.json").read_text())[
        "kitti_closest_vehicle_distance"]
    peer, tokenizer, checkpoint = open_clip_hub
    for label in range(4):
        (tmp_path / "data" / str(label)).mkdir(parents=True)
        image_files(tmp_path / "data" / str(label), 2)
    model = vitkit.load_clip(checkpoint)
    report = zeroshot_dataset(model, f"imagefolder:{tmp_path / 'data'}", "all", task="vtab-kitti_distance")
    assert report["prompts"] == {"class_names": "clip-benchmark", "templates": "clip-benchmark"}
    assert list(report["per_class"]) == names
    data = load_dataset(f"imagefolder:{tmp_path / 'data'}", "all")
    images, labels = zip(*evaluation_loader(data, checkpoint_transform(model.visual.config), 64))
    images, labels = torch.cat(images), torch.cat(labels)
    with torch.no_grad():
        classifier = build_zero_shot_classifier(peer, tokenizer, names,
                                                [lambda c, t=t: t.replace("{c}", c) for t in templates])
        predicted = (F.normalize(peer.encode_image(images), dim=-1) @ classifier).argmax(dim=-1)
    assert report["confusion"] == torch.bincount(labels * 4 + predicted, minlength=16).reshape(4, 4).tolist()
    given = zeroshot_dataset(model, f"imagefolder:{tmp_path / 'data'}", "all", task="vtab-kitti_distance",
                             templates=["{}"])  # the user's templates win; the names stay clip-benchmark's
    assert given["prompts"] == {"class_names": "clip-benchmark", "templates": "given"}
    plain = zeroshot_dataset(model, f"imagefolder:{tmp_path / 'data'}", "all", task="digits")
    assert plain["prompts"] == {"class_names": "dataset", "templates": "openai"}


@pytest.mark.parametrize("spec, task", [("cifar10", "cifar10"), ("CIFAR-100", "cifar100"), ("pets:/data/pets", "pets"),
                                        ("flowers102:/d", "flowers102"), ("vtab:/data/vtab-1k/clevr_dist",
                                                                          "vtab-clevr_distance"),
                                        ("vtab:/d/eurosat/", "vtab-eurosat"), ("imagefolder:/x", None)])
def test_the_dataset_spec_names_the_task_whose_prompts_are_used(spec, task):
    from vitkit.cli.zeroshot import benchmark_task

    assert benchmark_task(spec) == task
