"""``vitkit zeroshot --retrieval``: recall@1/5/10 both ways against recall counted by hand from the peers' own
embeddings (transformers' CLIPModel and SiglipModel), with several captions per image and a caption two images
share (an exact tie); and the captions file's bad lines, one line each."""

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vitkit
import test_zeroshot
from test_zeroshot import cli_error, cli_json, image_files
from vitkit.cli import main
from vitkit.data.images import read_image
from vitkit.evaluate.predict import image_transform
from vitkit.text.retrieval import recall

transformers = pytest.importorskip("transformers")
hf_clip, hf_siglip = test_zeroshot.hf_clip, test_zeroshot.hf_siglip  # the tiny peers, as fixtures here too

# (image index, caption): image 0 has three captions, images 1 and 2 share "a photo of a dog" (a tie), image 3 is
# named as ./sub/../image3.png once and as image3.png once (one image).
LINES = [(0, "a photo of a cat"), (1, "a photo of a dog"), (0, "a cat on a mat"), (2, "a photo of a dog"),
         (3, "A DOG, Running!"), (4, "a bird"), (0, "cat cat cat"), (5, "a photo of a car on the road"),
         (3, "dog dog"), (4, "a tree with a bird"), (5, "the quick brown fox")]


COLOURS = [(230, 20, 20), (20, 200, 40), (30, 30, 220), (240, 240, 30), (10, 10, 10), (250, 250, 250)]


def captions_file(folder):
    """Six images, each a colour over a noise of its own (noise alone embeds alike in a random tiny tower)."""
    paths = []
    for index, colour in enumerate(COLOURS):
        noise = np.random.default_rng(index).integers(-40, 40, (40, 48, 3))
        paths.append(folder / f"image{index}.png")
        Image.fromarray((np.array(colour) + noise).clip(0, 255).astype(np.uint8)).save(paths[-1])
    (folder / "sub").mkdir()
    names = [path.name for path in paths]
    written = [("./sub/../" if (image, caption) == (3, "dog dog") else "") + names[image] + "\t" + caption
               for image, caption in LINES]
    (folder / "captions.tsv").write_text("\n".join(written) + "\n")
    return paths, folder / "captions.tsv"


def recall_by_hand(scores, right, k):
    """Queries in rows: a hit when fewer than k wrong candidates score at least as high as the best right one."""
    hits = 0
    for row, marks in zip(scores.tolist(), right.tolist()):
        best = max(score for score, mark in zip(row, marks) if mark)
        # no near tie that the 1e-5 between the peer's embeddings and vitkit's could turn (equal captions tie exactly)
        # no near tie that the 1e-7 between the peer's cosines and vitkit's could turn (equal captions tie exactly)
        assert not any(0 < abs(score - best) < 1e-5 for score, mark in zip(row, marks) if not mark)
        hits += sum(1 for score, mark in zip(row, marks) if not mark and score >= best) < k
    return hits / len(scores)


def peer_recalls(encode_image, encode_text, images):
    distinct = sorted({caption for _, caption in LINES})
    with torch.no_grad():
        texts = dict(zip(distinct, F.normalize(encode_text(distinct), dim=-1)))
        embedded = F.normalize(encode_image(images), dim=-1)
    scores = embedded @ torch.stack([texts[caption] for _, caption in LINES]).T  # (6 images, 11 captions)
    right = torch.tensor([[image == row for image, _ in LINES] for row in range(6)])
    return {direction: {f"recall@{k}": recall_by_hand(s, r, k) for k in (1, 5, 10)}
            for direction, s, r in (("image_to_text", scores, right), ("text_to_image", scores.T, right.T))}


def check_report(report, expected, tsv):
    assert (report["images"], report["texts"], report["captions"]) == (6, 11, str(tsv))
    for direction in expected:
        for key, value in expected[direction].items():
            assert report[direction][key] == pytest.approx(value, abs=1e-12), (direction, key)


def prepared(model, paths):
    return torch.stack([image_transform(model.visual, read_image(p), "crop", False)(read_image(p)) for p in paths])


def test_retrieval_recalls_are_those_counted_from_transformers_clip(hf_clip, tmp_path, capsys):
    peer, tokenizer, folder = hf_clip
    paths, tsv = captions_file(tmp_path)
    report = cli_json(capsys, folder, "--retrieval", tsv, "--batch-size", 4, "--out", tmp_path / "out")
    encode_text = lambda texts: peer.get_text_features(**tokenizer(texts, padding=True, truncation=True,
                                                                   max_length=16, return_tensors="pt")).pooler_output
    expected = peer_recalls(lambda x: peer.get_image_features(pixel_values=x).pooler_output, encode_text,
                            prepared(vitkit.load_clip(folder), paths))
    check_report(report, expected, tsv)
    assert json.loads((tmp_path / "out" / "retrieval-captions.json").read_text()) == report
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["retrieval-captions.json"]  # no temporary left


def test_retrieval_recalls_are_those_counted_from_transformers_siglip(hf_siglip, tmp_path, capsys):
    """SigLIP: texts padded to the full context, as its tokenizer pads them, and no attention mask."""
    peer, tokenizer, folder = hf_siglip
    paths, tsv = captions_file(tmp_path)
    report = cli_json(capsys, folder, "--retrieval", tsv)
    encode_text = lambda texts: peer.get_text_features(input_ids=tokenizer(
        texts, padding="max_length", truncation=True, max_length=16, return_tensors="pt").input_ids).pooler_output
    expected = peer_recalls(lambda x: peer.get_image_features(pixel_values=x).pooler_output, encode_text,
                            prepared(vitkit.load_clip(folder), paths))
    check_report(report, expected, tsv)


def test_recall_counts_ties_against_the_model():
    """Three images (rows), four captions: image 0 owns captions 0 and 1, image 1 caption 2, image 2 caption 3."""
    scores = torch.tensor([[0.2, 0.9, 0.9, 0.1],   # best right 0.9 tied with a wrong one: a miss at 1, a hit at 2
                           [0.5, 0.4, 0.3, 0.1],   # two wrong above: the right one third
                           [0.0, 0.0, 0.0, 0.7]])  # first
    right = torch.tensor([[True, True, False, False], [False, False, True, False], [False, False, False, True]])
    assert recall(scores, right, (1, 2, 3)) == {"recall@1": 1 / 3, "recall@2": 2 / 3, "recall@3": 1.0}
    # text -> image: caption 0 (image 0 at 0.2 under 0.5): 2nd; caption 1: first; caption 2 (0.9 against image 0's
    # 0.9, a tie): 2nd; caption 3: first
    assert recall(scores.T, right.T, (1, 2)) == {"recall@1": 0.5, "recall@2": 1.0}


def test_the_text_report_names_both_directions(hf_siglip, tmp_path, capsys):
    paths, tsv = captions_file(tmp_path)
    assert main(["zeroshot", str(hf_siglip[2]), "--retrieval", str(tsv)]) == 0
    out = capsys.readouterr().out
    assert f"{tsv}: 6 images, 11 captions" in out
    assert re.search(r"image->text  R@1 \d+\.\d\d%  R@5 \d+\.\d\d%  R@10 100\.00%", out)
    assert re.search(r"text->image  R@1 \d+\.\d\d%  R@5 \d+\.\d\d%  R@10 100\.00%", out)


@pytest.mark.parametrize("content,message", [
    (None, r"captions.tsv: No such file"),
    ("", r"captions.tsv: an empty file"),
    ("image0.png\ta cat\nimage1.png a dog\n", r"captions.tsv:2: no tab; expected image path<TAB>caption"),
    ("image0.png\ta cat\n\n", r"captions.tsv:2: no tab"),
    ("image0.png\t \n", r"captions.tsv:1: an empty caption"),
    ("\ta cat\n", r"captions.tsv:1: an empty image path"),
    ("image0.png\ta cat\nnone.png\ta dog\n", r"captions.tsv:2: no such image none.png"),
    ("../outside.png\ta cat\n", r"captions.tsv:1: ../outside.png: the image path leads outside"),
    ("image0.png\ta cat\nbroken.png\ta dog\n", r"captions.tsv:2: .*broken.png: not a readable image"),
])
def test_bad_captions_files_are_one_line_naming_file_and_line(hf_siglip, tmp_path, capsys, content, message):
    folder = tmp_path / "data"
    folder.mkdir()
    image_files(folder, 1)
    (folder / "broken.png").write_bytes(b"not a png")
    image_files(tmp_path, 1)[0].rename(tmp_path / "outside.png")
    if content is not None:
        (folder / "captions.tsv").write_text(content)
    code, err = cli_error(capsys, hf_siglip[2], "--retrieval", folder / "captions.tsv")
    assert re.search(message, err), err
    assert code == (1 if "broken" in message else 2)  # an image that is no image is the data's fault, as in datasets


def test_classification_flags_are_refused_with_retrieval(hf_siglip, tmp_path, capsys):
    paths, tsv = captions_file(tmp_path)
    code, err = cli_error(capsys, hf_siglip[2], "--retrieval", tsv, "--templates", "simple")
    assert code == 2 and "--templates: not for --retrieval" in err
