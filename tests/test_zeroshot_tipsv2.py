"""TIPSv2's text tower (transformers' Tipsv2Model) read by vitkit.load_clip, against a tiny Tipsv2Model and
Tipsv2Tokenizer built and saved by transformers: token ids as its processor gives them (lower-cased, padded to the
64 positions, cut), the masked mean of the text features, the [class] image embedding, the temperature as the log
scale, the CLI's probabilities, the ONNX graph; a bad config in one line."""

import json
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

import vitkit
from interop_helpers import randomised
from test_zeroshot import assert_close, check_cli, cli_json, image_files
from vitkit.data.images import read_image
from vitkit.evaluate.predict import image_transform

transformers = pytest.importorskip("transformers")

CAPTIONS = ["a photo of a cat", "A DOG, Running!", "  cat   dog  ", "a photo of a cat dog " * 8]  # the last: too long
CONTEXT = 64  # what Tipsv2Processor pads and cuts to: the config's max_position_embeddings
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=14, mlp_ratio=2)
STORED, TEMPERATURE = 0.01, 0.02  # the temperature in the weights, and that of a config without it


def tipsv2_tokenizer():
    """A SentencePiece-style BPE with byte fallback, by transformers' own Tipsv2Tokenizer (which lower-cases)."""
    vocab = {"<pad>": 0, "<unk>": 1}
    for char in "abcdefghijklmnopqrstuvwxyz▁,.!":
        vocab[char] = len(vocab)
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    merges = [("c", "a"), ("ca", "t"), ("▁", "ca"), ("d", "o"), ("▁", "a")]
    for first, second in merges:
        vocab[first + second] = len(vocab)
    return transformers.Tipsv2Tokenizer(vocab=vocab, merges=merges), vocab


def tipsv2_folder(folder, **text):
    """A randomised Tipsv2Model saved with its tokenizer and image processor in ``folder``; ``text``: fields of
    its text_config."""
    tokenizer, vocab = tipsv2_tokenizer()
    text = {**dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   vocab_size=len(vocab), max_position_embeddings=CONTEXT), **text}
    torch.manual_seed(0)
    peer = randomised(transformers.Tipsv2Model(transformers.Tipsv2Config(text_config=text, vision_config=VISION)),
                      std=0.1)
    with torch.no_grad():
        peer.temperature.fill_(STORED)
    peer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformers.Tipsv2ImageProcessor().save_pretrained(folder)
    return peer


@pytest.fixture(scope="module")
def hf_tipsv2(tmp_path_factory):
    """A Tipsv2Model whose weights hold its temperature, with the processor of its saved files."""
    folder = tmp_path_factory.mktemp("tipsv2") / "hf"
    peer = tipsv2_folder(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    processor = transformers.Tipsv2Processor(image_processor=transformers.Tipsv2ImageProcessor(), tokenizer=tokenizer)
    return peer, processor, folder


def processed(processor, texts):
    return processor(text=texts, return_tensors="pt")


def test_tipsv2_text_tower_gives_transformers_text_features(hf_tipsv2):
    """Ids as the processor's (lower-cased by the tokenizer file, right-padded with <pad> to 64, the long caption
    cut); the mean of the text tokens' states, the pads left out of attention and of the mean."""
    peer, processor, folder = hf_tipsv2
    model = vitkit.load_clip(folder)
    theirs = processed(processor, CAPTIONS)
    ids = model.tokenize(CAPTIONS)
    assert torch.equal(ids, theirs["input_ids"]) and ids.shape == (4, CONTEXT)
    assert torch.equal(ids != 0, theirs["attention_mask"].bool()) and not theirs["attention_mask"][3].eq(0).any()
    assert torch.equal(model.tokenize(["A DOG"]), model.tokenize(["a dog"]))
    c = model.text.config
    assert (c.pool, c.positions, c.embed_scale, c.mlp, c.causal, c.embed_dim) == (
        "mean", "sinusoidal", True, "relu", False, None)
    with torch.no_grad():
        ours = model.encode_text(CAPTIONS)
        assert_close(ours, peer.get_text_features(**theirs).pooler_output)
        assert_close(model.encode_text(CAPTIONS[1:2]), ours[1:2])
        # a batch padded short of the context: the pads change nothing
        assert_close(model.text(ids[:3, :20]), ours[:3])
    assert ours.abs().max() > 0.1


def test_tipsv2_image_embedding_and_temperature(hf_tipsv2):
    """The image embedding is the vision tower's pooled [class] token of [0, 1] pixels; the logits, the cosine
    over the temperature, are those of Tipsv2Model."""
    peer, processor, folder = hf_tipsv2
    model = vitkit.load_clip(folder)
    images = torch.rand(2, 3, 28, 28)
    with torch.no_grad():
        assert_close(model.encode_image(images), peer.get_image_features(pixel_values=images).pooler_output)
        out = peer(pixel_values=images, **processed(processor, CAPTIONS))
        logits = model.logit_scale.exp() * F.normalize(model.encode_image(images), dim=-1) @ \
            F.normalize(model.encode_text(CAPTIONS), dim=-1).T
    assert model.visual.config.provenance.normalization == "unit" and model.logit_bias is None
    assert model.logit_scale.exp().item() == pytest.approx(1 / STORED, rel=1e-6) == 1 / peer.temperature.item()
    torch.testing.assert_close(logits, out.logits_per_image, atol=1e-3, rtol=1e-5)


def test_without_a_stored_temperature_the_configs_is_taken(hf_tipsv2, tmp_path):
    """Published checkpoints hold no temperature weight (transformers ignores its absence): config.json's
    temperature_init_value is the one; the image tower loads quietly beside the text tower."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(hf_tipsv2[2], tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    del weights["temperature"]
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["temperature_init_value"] = TEMPERATURE
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = vitkit.load_clip(tmp_path / "hf")
    assert model.logit_scale.exp().item() == pytest.approx(1 / TEMPERATURE, rel=1e-6)
    reloaded = transformers.Tipsv2Model.from_pretrained(tmp_path / "hf")
    assert reloaded.temperature.item() == pytest.approx(TEMPERATURE)


def test_cli_probabilities_are_softmax_of_the_peers_cosines_over_its_temperature(hf_tipsv2, tmp_path, capsys):
    """--templates simple: the class names alone, embedded by transformers; softmax over the classes of the
    cosines divided by the temperature, on the images as vitkit predict prepares them."""
    peer, processor, folder = hf_tipsv2
    paths, classes = image_files(tmp_path), ["Cat", "dog", "a photo"]
    records = cli_json(capsys, folder, "--images", *paths, "--classes", *classes, "--templates", "simple",
                       "--top-k", 2)
    model = vitkit.load_clip(folder)
    images = torch.stack([image_transform(model.visual, read_image(p), "crop", False)(read_image(p)) for p in paths])
    with torch.no_grad():
        texts = F.normalize(peer.get_text_features(**processed(processor, classes)).pooler_output, dim=-1)
        pictures = F.normalize(peer.get_image_features(pixel_values=images).pooler_output, dim=-1)
        expected = (pictures @ texts.T / peer.temperature).softmax(dim=-1)
    check_cli(records, paths, classes, expected)


def test_tipsv2_text_graph_gives_transformers_text_features(hf_tipsv2, tmp_path, capsys):
    """The ONNX export of the text tower: the pad mask and the sinusoidal positions are computed in the graph."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from test_text_onnx import check_graph, embeddings, exported

    peer, processor, folder = hf_tipsv2
    run = exported(folder, tmp_path, capsys)
    model = check_graph(run, folder)
    for texts in (CAPTIONS, CAPTIONS[1:2]):
        ids = model.tokenize(texts)
        with torch.no_grad():
            theirs = peer.get_text_features(**processed(processor, texts)).pooler_output
        torch.testing.assert_close(embeddings(run, ids), theirs, atol=1e-5, rtol=0)
    ids = model.tokenize(CAPTIONS[:3])
    assert_close(embeddings(run, ids[:, :20]), embeddings(run, ids))  # fewer pads, the same embeddings


def test_a_gelu_text_tower_and_another_context(tmp_path):
    """hidden_act 'gelu', no sqrt(D) scale of the token embeddings, a context of 16: as transformers computes."""
    peer = tipsv2_folder(tmp_path / "hf", hidden_act="gelu_pytorch_tanh", scale_sqrt_depth=False,
                         max_position_embeddings=16)
    model = vitkit.load_clip(tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")(
        CAPTIONS, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    assert torch.equal(model.tokenize(CAPTIONS), theirs.input_ids)
    assert (model.text.config.context_length, model.text.config.mlp, model.text.config.gelu) == (16, "gelu", "tanh")
    with torch.no_grad():
        assert_close(model.encode_text(CAPTIONS), peer.get_text_features(**theirs).pooler_output)


# ------------------------------------------------------------------------------------------------ bad input
def with_text_field(folder, tmp_path, name, value):
    """A copy of ``folder`` whose config.json sets text_config.``name`` to ``value``."""
    shutil.copytree(folder, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["text_config"][name] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    return tmp_path / "hf"


def test_an_unknown_activation_is_one_line_naming_the_field(hf_tipsv2, tmp_path):
    with pytest.raises(vitkit.CheckpointError) as caught:
        vitkit.load_clip(with_text_field(hf_tipsv2[2], tmp_path, "hidden_act", "swish"))
    message = str(caught.value)
    assert "\n" not in message and "config.json: text_config.hidden_act='swish'; expected one of" in message


def test_a_pad_token_of_another_id_than_the_towers_is_one_line(hf_tipsv2, tmp_path):
    with pytest.raises(vitkit.CheckpointError, match=r"tokenizer.json: the pad token '<pad>' has id 0; the text "
                                                     r"tower takes 1 for padding \(text_config.pad_token_id\)"):
        vitkit.load_clip(with_text_field(hf_tipsv2[2], tmp_path, "pad_token_id", 1))
