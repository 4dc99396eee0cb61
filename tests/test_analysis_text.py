"""`vitkit analyze --text`: text-conditioned similarity maps, each patch's embedding (its final state through the
image tower's final norm and projection; SigLIP's attention pool over that patch alone) against each prompt's text
embedding, checked against the same maps computed by hand from transformers' CLIPModel and SiglipModel; the
figures and the page that show them; bad requests in one line."""

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import test_zeroshot
from test_zeroshot import image_files
from vitkit.cli import main
from vitkit.data.images import read_image
from vitkit.evaluate.preprocessing import checkpoint_transform

transformers = pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
hf_clip, hf_siglip = test_zeroshot.hf_clip, test_zeroshot.hf_siglip  # the tiny peers, as fixtures here too
PROMPTS = ["a photo of a cat", "DOG", "a bird on a tree"]


def analysed(folder, tmp_path, *extra):
    paths = image_files(tmp_path, 3)
    assert main(["analyze", str(folder), "--images", *map(str, paths), "--text", *PROMPTS, "--out",
                 str(tmp_path / "out"), *extra]) == 0
    return paths, tmp_path / "out"


def pixels(folder, paths):
    """The images as the checkpoint's evaluation transform prepares them (what analyze feeds the model)."""
    import vitkit

    transform = checkpoint_transform(vitkit.load(folder).config)
    return torch.stack([transform(read_image(path)) for path in paths])


def by_hand(patches, texts):
    """(B, N, E) patch embeddings and (K, E) text embeddings -> (B, K, rows, cols) cosines on a square grid."""
    cosine = F.normalize(patches, dim=-1) @ F.normalize(texts, dim=-1).T
    side = int(patches.shape[1] ** 0.5)
    return cosine.transpose(1, 2).reshape(len(patches), len(texts), side, side)


def test_clip_maps_are_the_peers_patches_through_its_final_norm_and_projection(hf_clip, tmp_path):
    peer, tokenizer, folder = hf_clip
    paths, out = analysed(folder, tmp_path)
    with torch.no_grad():
        states = peer.vision_model(pixel_values=pixels(folder, paths)).last_hidden_state  # before post_layernorm
        patches = peer.visual_projection(peer.vision_model.post_layernorm(states[:, 1:]))
        texts = peer.get_text_features(**tokenizer(PROMPTS, padding=True, return_tensors="pt")).pooler_output
    maps = torch.from_numpy(np.load(out / "text_similarity.npy"))
    assert maps.shape == (3, 3, 4, 4)
    torch.testing.assert_close(maps, by_hand(patches, texts), atol=1e-5, rtol=0)
    assert maps.std() > 0.01  # maps that differ from patch to patch, not a constant a wrong projection could match
    summary = json.loads((out / "summary.json").read_text())
    assert summary["text_similarity"]["prompts"] == PROMPTS
    assert summary["text_similarity"]["max"][0] == pytest.approx(maps[0].amax(dim=(1, 2)).tolist(), abs=1e-5)
    page = (out / "index.html").read_text()
    assert all(f"text_similarity_{index:03d}.png" in page for index in range(3))
    assert "maps for 'a photo of a cat', 'DOG', 'a bird on a tree': the cosine" in page
    assert (out / "text_similarity_002.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_siglip_maps_pool_each_patch_alone(hf_siglip, tmp_path):
    """SigLIP embeds an image by its attention pool (no projection): a patch's embedding is the pool over that
    patch alone, transformers' own head run on one token."""
    peer, tokenizer, folder = hf_siglip
    paths, out = analysed(folder, tmp_path, "--overlays", "1")
    with torch.no_grad():
        states = peer.vision_model(pixel_values=pixels(folder, paths)).last_hidden_state  # after post_layernorm
        batch, count, dim = states.shape
        patches = peer.vision_model.head(states.reshape(batch * count, 1, dim)).reshape(batch, count, -1)
        ids = tokenizer(PROMPTS, padding="max_length", max_length=16, truncation=True, return_tensors="pt").input_ids
        texts = peer.get_text_features(input_ids=ids).pooler_output
    maps = torch.from_numpy(np.load(out / "text_similarity.npy"))
    torch.testing.assert_close(maps, by_hand(patches, texts), atol=1e-5, rtol=0)
    assert maps.std() > 0.01
    assert sorted(path.name for path in out.glob("text_similarity_*.png")) == ["text_similarity_000.png"]


@pytest.mark.parametrize("extra,message", [
    (["--text", "a dog", "--adapter", "x"], "--text and --adapter"),
    (["--tokenizer", "x"], "--tokenizer: for --text"),
])
def test_bad_text_requests_are_one_line(hf_clip, tmp_path, capsys, extra, message):
    code = main(["analyze", str(hf_clip[2]), "--images", str(image_files(tmp_path, 1)[0]), "--out",
                 str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and message in err, err


def test_text_maps_of_a_checkpoint_without_a_text_tower_are_refused(tmp_path, capsys):
    import vitkit

    vitkit.create_model("ViT-Ti/16", image_size=32, num_classes=3).save(tmp_path / "model")
    code = main(["analyze", str(tmp_path / "model"), "--images", str(image_files(tmp_path, 1)[0]), "--text", "a dog",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and re.search("no text tower vitkit reads .*CLIPModel", err), err
