"""`vitkit convert CHECKPOINT text.onnx --text`: the text tower as an ONNX graph (token ids in, embeddings out, any
batch), run by ONNX Runtime on the checkpoint's own tokenization against the peers' text features (transformers'
CLIP with both pooling rules and SigLIP, open_clip's CLIP); its metadata; bad requests in one line."""

import json
import re

import pytest
import torch

import test_zeroshot
import vitkit
from test_zeroshot import CAPTIONS
from vitkit.cli import main

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
hf_clip, hf_siglip, open_clip_hub = test_zeroshot.hf_clip, test_zeroshot.hf_siglip, test_zeroshot.open_clip_hub


def exported(folder, tmp_path, capsys):
    assert main(["convert", str(folder), str(tmp_path / "text.onnx"), "--text"]) == 0
    out = capsys.readouterr().out
    assert "the tokenizer is not in the graph" in out and "max |difference|" in out
    return ort.InferenceSession(str(tmp_path / "text.onnx"), providers=["CPUExecutionProvider"])


def embeddings(run, ids):
    return torch.from_numpy(run.run(["embeddings"], {"ids": ids.numpy()})[0])


def check_graph(run, folder):
    (ids,), (output,) = run.get_inputs(), run.get_outputs()
    assert (ids.name, ids.type, output.name) == ("ids", "tensor(int64)", "embeddings")
    assert isinstance(ids.shape[0], str) and isinstance(ids.shape[1], str) and isinstance(output.shape[0], str)
    metadata = run.get_modelmeta().custom_metadata_map
    model = vitkit.load_clip(folder)
    assert json.loads(metadata["vitkit.text_config"])["context_length"] == model.text.config.context_length
    assert json.loads(metadata["logit_scale"]) == pytest.approx(model.logit_scale.item())
    assert json.loads(metadata["logit_bias"]) == (None if model.logit_bias is None else
                                                  pytest.approx(model.logit_bias.item()))
    assert "not in the graph" in metadata["tokenizer"]
    return model


def check_against_transformers(peer, folder, tmp_path, capsys):
    """The graph's embeddings of the checkpoint's own tokenization, batches of 4 and 1, against transformers'."""
    run = exported(folder, tmp_path, capsys)
    model = check_graph(run, folder)
    for texts in (CAPTIONS, CAPTIONS[1:2]):
        ids = model.tokenize(texts)
        with torch.no_grad():
            theirs = peer.get_text_features(input_ids=ids).pooler_output
        torch.testing.assert_close(embeddings(run, ids), theirs, atol=1e-5, rtol=0)


def test_hf_clip_text_graph_gives_transformers_text_features(hf_clip, tmp_path, capsys):
    """Both pooling rules of HF's CLIP (the first end token, and the largest id of configs from before the fix),
    texts padded to the longest of the batch."""
    check_against_transformers(hf_clip[0], hf_clip[2], tmp_path, capsys)


def test_siglip_text_graph_gives_transformers_text_features(hf_siglip, tmp_path, capsys):
    """SigLIP: the full context of padding, no attention mask, the last position pooled, a head with a bias."""
    check_against_transformers(hf_siglip[0], hf_siglip[2], tmp_path, capsys)


def test_open_clip_text_graph_gives_open_clips_encode_text(open_clip_hub, tmp_path, capsys):
    peer, tokenizer, folder = open_clip_hub
    run = exported(folder, tmp_path, capsys)
    check_graph(run, folder)
    ids = tokenizer(CAPTIONS)  # open_clip's own tokenizer: the full context, zeros after the end token
    with torch.no_grad():
        theirs = peer.encode_text(ids)
    torch.testing.assert_close(embeddings(run, ids), theirs, atol=1e-5, rtol=0)
    assert not list(tmp_path.glob(".*"))  # nothing of the staging left beside the file


@pytest.mark.parametrize("extra,message", [
    (["--quantize", "int8"], "--quantize: for the image tower"),
    (["--naflex"], "--naflex: for the image tower"),
    (["--set", "image_size=64"], "--set: for the image tower"),
])
def test_image_tower_flags_are_refused_with_text(open_clip_hub, tmp_path, capsys, extra, message):
    code = main(["convert", str(open_clip_hub[2]), str(tmp_path / "text.onnx"), "--text", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and message in err, err
    assert not (tmp_path / "text.onnx").exists()


def test_text_export_needs_onnx_and_a_text_tower(open_clip_hub, tmp_path, capsys):
    code = main(["convert", str(open_clip_hub[2]), str(tmp_path / "text.xml"), "--text"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--text: the text tower is exported to ONNX" in err
    vitkit.create_model("ViT-Ti/16", image_size=32, num_classes=3).save(tmp_path / "model")
    code = main(["convert", str(tmp_path / "model"), str(tmp_path / "text.onnx"), "--text"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and re.search("no text tower vitkit reads", err), err
    assert not list(tmp_path.glob("*.onnx"))
