"""The analyses on the 2023-25 families (DINOv3 with [class] and 4 registers, timm's reg1_gap RoPE ViT whose
only prefix token is a register, AIMv2 without prefix tokens, EVA-02, RoPE-ViT mixed): attention taken from
timm's own blocks, rollout and attention distance written out with explicit loops on a non-square grid, a
hand-worked case, and the rotary phase similarity against timm's own rotary tables."""

import json
import math

import numpy as np
import pytest
import torch

import vitkit
from vitkit.analysis import (attention_maps, attention_rollout, mean_attention_distance, output_readout,
                             position_similarity, rope_phases)
from vitkit.cli import main

timm = pytest.importorskip("timm")

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, dynamic_img_size=True)


def test_rollout_and_distance_of_a_hand_worked_case_with_a_register_on_a_1x2_grid():
    """Tokens [register, p0, p1], patches 4 px apart. Layer 1 (both heads alike) and layer 2 (uniform and
    identity heads) rolled out by hand in fractions: the mean of the patch rows over the patch columns is
    (83/192, 109/320), so the map is (1, 327/415); row 0 gives (77/480, 23/160), so (1, 69/77). Distances: p0
    splits its patch attention evenly (2 px), p1 puts 3/4 on p0 (3 px); uniform attention gives 2 px, identity 0."""
    first = torch.tensor([[0.6, 0.2, 0.2], [0.5, 0.25, 0.25], [0.2, 0.6, 0.2]])
    second = torch.stack([torch.full((3, 3), 1 / 3), torch.eye(3)])
    attn = torch.stack([torch.stack([first, first]), second])[:, None]  # (layers, batch, heads, 3, 3)
    torch.testing.assert_close(attention_rollout(attn, (1, 2), readout="mean"), torch.tensor([[[1, 327 / 415]]]))
    torch.testing.assert_close(attention_rollout(attn, (1, 2), readout="token"), torch.tensor([[[1, 69 / 77]]]))
    torch.testing.assert_close(mean_attention_distance(attn, (1, 2), 4), torch.tensor([[2.5, 2.5], [2.0, 0.0]]))


def timm_peer(architecture, **kwargs):
    torch.manual_seed(0)
    model = timm.create_model(architecture, **{**SMALL, **kwargs}).eval()
    with torch.no_grad():  # LayerScale at 1e-5 would hide the blocks' attention behind the residual
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def loaded(theirs, tmp_path):
    from timm.models._hub import save_for_hf

    save_for_hf(theirs, str(tmp_path / "hub"))
    return vitkit.load(tmp_path / "hub").eval()


def timm_attention(theirs, images):
    """The softmax of every timm block, caught where timm's unfused attention applies its dropout to it."""
    caught = []
    hooks = []
    for block in theirs.blocks:
        block.attn.fused_attn = False
        hooks.append(block.attn.attn_drop.register_forward_hook(lambda module, inputs, output: caught.append(output)))
    with torch.no_grad():
        theirs(images)
    for hook in hooks:
        hook.remove()
    return torch.stack(caught)


def rollout_by_loops(attn, prefix, grid, readout_row):
    """Rollout of one image's (layers, heads, T, T) attention as plain Python: heads averaged, (A + I) / 2, rows
    renormalised, products accumulated entry by entry; then a row (or the mean of the patch rows) over the patch
    columns, scaled to a maximum of 1."""
    layers, heads, tokens, _ = attn.shape
    a = attn.tolist()
    joint = [[float(i == j) for j in range(tokens)] for i in range(tokens)]
    for layer in range(layers):
        fused = [[(sum(a[layer][h][i][j] for h in range(heads)) / heads + (i == j)) / 2 for j in range(tokens)]
                 for i in range(tokens)]
        fused = [[value / sum(row) for value in row] for row in fused]
        joint = [[sum(fused[i][k] * joint[k][j] for k in range(tokens)) for j in range(tokens)] for i in range(tokens)]
    rows = [readout_row] if readout_row is not None else range(prefix, tokens)
    patches = [sum(joint[i][prefix + p] for i in rows) / len(rows) for p in range(grid[0] * grid[1])]
    return torch.tensor([value / max(patches) for value in patches]).reshape(grid)


def distance_by_loops(attn, prefix, grid, patch):
    """Mean attention distance (layers, heads) of a (layers, batch, heads, T, T) stack: per patch query, the
    patch-key weights renormalised times the pixel distance of the patch centres, averaged over queries and
    images."""
    layers, batch, heads = attn.shape[:3]
    count = grid[0] * grid[1]
    a = attn.tolist()
    out = torch.zeros(layers, heads, dtype=torch.float64)
    for layer in range(layers):
        for head in range(heads):
            total = 0.0
            for image in range(batch):
                for q in range(count):
                    weights = a[layer][image][head][prefix + q][prefix:]
                    (qr, qc), norm = divmod(q, grid[1]), sum(weights)
                    total += sum(w / norm * patch * math.hypot(qr - k // grid[1], qc - k % grid[1])
                                 for k, w in enumerate(weights))
            out[layer, head] = total / (batch * count)
    return out.float()


# architecture, prefix tokens, the output token's row (None: the mean of the patch rows), what the summary says
FAMILIES = [
    ("vit_small_patch16_dinov3", 5, None, "the mean of the patch tokens"),  # timm's default pool is 'avg'
    ("vit_medium_patch16_rope_reg1_gap_256", 1, None, "the mean of the patch tokens"),  # its prefix is a register
    ("aimv2_large_patch14_224", 0, None, "the mean of the patch tokens"),
    ("eva02_base_patch16_clip_224", 1, 0, "the [class] token"),
]


@pytest.mark.parametrize("architecture,prefix,row,output", FAMILIES)
def test_rollout_and_distance_on_a_non_square_grid_equal_loops_over_timms_attention(tmp_path, architecture, prefix,
                                                                                   row, output):
    theirs = timm_peer(architecture)
    model = loaded(theirs, tmp_path)
    images = torch.randn(2, 3, 32, 48)
    expected = timm_attention(theirs, images)
    attn = attention_maps(model, images)
    assert attn.shape == (2, 2, 4, prefix + 24, prefix + 24)
    torch.testing.assert_close(attn, expected, atol=1e-5, rtol=0)
    maps = attention_rollout(attn, (4, 6), readout=model)
    for image in range(2):
        torch.testing.assert_close(maps[image], rollout_by_loops(expected[:, image], prefix, (4, 6), row),
                                   atol=1e-5, rtol=0)
    torch.testing.assert_close(mean_attention_distance(attn, (4, 6), 8), distance_by_loops(expected, prefix, (4, 6), 8),
                               atol=1e-4, rtol=0)
    assert vitkit.analysis.attention.READOUTS[output_readout(model)] == output


def test_the_output_token_is_checked_against_the_model(tmp_path, capsys):
    """A register is no [class] token: asking for the token readout of timm's reg1_gap ViT is refused."""
    model = loaded(timm_peer("vit_medium_patch16_rope_reg1_gap_256"), tmp_path)
    with pytest.raises(vitkit.ConfigError, match=r"readout='token' reads the \[class\] token, but the model has "
                                                  r"none \(1 prefix tokens, all registers\)"):
        output_readout(model, "token")
    assert main(["analyze", str(tmp_path / "hub"), "--out", str(tmp_path / "out"), "--readout", "token"]) == 2
    assert "readout='token' reads the [class] token, but the model has none" in capsys.readouterr().err


def timm_phases(theirs, grid):
    """timm's rotary table of the patches ([sin, cos] per token), blocks and heads flattened into the vector."""
    table = theirs.rope.get_embed(shape=grid)  # (N, 2d), or (depth, heads, N, 2d) for mixed frequencies
    return table.movedim(-2, 0).reshape(grid[0] * grid[1], -1)


@pytest.mark.parametrize("architecture", ["vit_small_patch16_dinov3", "eva02_tiny_patch14_224",
                                          "vit_pe_core_base_patch16_224", "vit_small_patch16_rope_mixed_224"])
def test_rotary_phase_similarity_equals_timms_tables_pair_by_pair(tmp_path, architecture):
    theirs = timm_peer(architecture)
    model = loaded(theirs, tmp_path)
    similarity = position_similarity(rope_phases(model, (3, 5)), (3, 5))
    phases = timm_phases(theirs, (3, 5)).double()
    if model.config.rope == "mixed":  # the mean over blocks and heads of each head's own cosine
        per_head = theirs.rope.get_embed(shape=(3, 5)).double()
        per_head = per_head / per_head.norm(dim=-1, keepdim=True)
        expected = torch.einsum("bhid,bhjd->ij", per_head, per_head) / per_head.shape[0] / per_head.shape[1]
        torch.testing.assert_close(similarity.reshape(15, 15), expected.float(), atol=1e-5, rtol=0)
    for i in range(15):
        for j in range(15):
            cosine = phases[i] @ phases[j] / (phases[i].norm() * phases[j].norm())
            assert similarity[i // 5, i % 5, j // 5, j % 5].item() == pytest.approx(cosine.item(), abs=1e-5)
    assert torch.allclose(similarity.reshape(15, 15).diagonal(), torch.ones(15))


def test_analyze_a_dinov3_checkpoint_gives_the_full_report(tmp_path):
    theirs = timm_peer("vit_small_patch16_dinov3")
    loaded(theirs, tmp_path)
    assert main(["analyze", str(tmp_path / "hub"), "--out", str(tmp_path / "out"), "--image-size", "32x48"]) == 0
    out = tmp_path / "out"
    assert {"attention_distance.png", "filters.png", "rope_similarity.png", "rollout_000.png", "rollout_001.png",
            "index.html"} <= {p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == {}
    assert summary["prefix_tokens"] == {"class": 1, "distillation": 0, "registers": 4}
    assert summary["rollout"]["output_token"] == "the mean of the patch tokens"
    assert [entry["kind"] for entry in summary["position_similarity"]] == ["rope"]
    assert np.load(out / "rope_similarity.npy").shape == (4, 6, 4, 6)
    assert np.load(out / "rollout.npy").shape == (2, 4, 6)
    page = (out / "index.html").read_text()
    assert "Attention rollout from the mean of the patch tokens" in page
    assert "the rotary phases" in page and "1 [class] token, 4 register tokens" in page
    # --readout token reads the [class] row instead
    assert main(["analyze", str(tmp_path / "hub"), "--out", str(tmp_path / "cls"), "--image-size", "32x48",
                 "--readout", "token"]) == 0
    assert json.loads((tmp_path / "cls" / "summary.json").read_text())["rollout"]["output_token"] == "the [class] token"
    assert not np.allclose(np.load(tmp_path / "cls" / "rollout.npy"), np.load(out / "rollout.npy"))


def test_a_model_with_a_table_and_rotary_phases_shows_both(tmp_path):
    """EVA-02 adds an absolute table and turns its queries and keys: both similarities are drawn, the table at
    its own grid, the rotary phases at the analysed one."""
    from vitkit.analysis.report import analyze

    model = loaded(timm_peer("eva02_tiny_patch14_224"), tmp_path)
    pictures = [np.zeros((32, 48, 3), np.uint8)] * 2
    result = analyze(model, torch.randn(2, 3, 32, 48), pictures, tmp_path / "out", overlays=0)
    drawn = result.summary["position_similarity"]
    table_grid = list(model.config.grid_size)
    assert drawn[0] == {"kind": "table", "grid": table_grid, "file": "position_similarity.png"}
    assert drawn[1] == {"kind": "rope", "grid": [4, 6], "file": "rope_similarity.png",
                        "blocks": "one table for every block"}
    assert np.load(tmp_path / "out" / "position_similarity.npy").shape == (*table_grid, *table_grid)
