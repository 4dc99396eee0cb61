"""Layer-wise learning-rate decay: every parameter's lr scale and weight decay against timm's
``param_groups_layer_decay`` on the same weights, and a fine-tuning run with it that resumes bit for bit."""

import pytest
import torch
from interop_helpers import randomised, timm_model
from safetensors.torch import save_file
from test_train_loop import crash_at, state, tiny_recipe

import vitkit
from vitkit.train.optim import param_groups
from vitkit.train.run import prepare

timm = pytest.importorskip("timm")

DECAY, WD, DEPTH = 0.5, 0.05, 3
# vitkit's name of a timm parameter where the two differ (checked below: the tensors are equal after loading).
VITKIT_NAMES = {"pos_embed": "pos_embed.weight", "attn_pool.latent": "attn_pool.probe"}
# timm groups its final norm with the last block (its group_matcher), BEiT, MAE and DINOv2 (and vitkit) with the
# head: timm's scale is DECAY ** 1, ours 1. (lr scale, weight decay) as (timm, vitkit).
FINAL_NORM = {"norm.weight": ((DECAY, 0.0), (1.0, 0.0)), "norm.bias": ((DECAY, 0.0), (1.0, 0.0))}


def _peer(family):
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.eva import Eva

    base = dict(img_size=32, patch_size=8, embed_dim=64, depth=DEPTH, num_heads=4, mlp_ratio=2, num_classes=10)
    return {
        "vit": lambda: timm_model(depth=DEPTH),
        "vit-gap": lambda: timm_model(depth=DEPTH, class_token=False, global_pool="avg"),  # fc_norm; norm is Identity
        "dinov2-reg-prenorm": lambda: timm_model(depth=DEPTH, reg_tokens=2, no_embed_class=True, init_values=1e-5,
                                                 pre_norm=True),
        "siglip": lambda: timm_model(depth=DEPTH, class_token=False, global_pool="map"),
        "deit-distilled": lambda: randomised(VisionTransformerDistilled(**base)),
        "eva-reg": lambda: randomised(Eva(**base, num_reg_tokens=2, qkv_bias=False, use_rot_pos_emb=False)),
    }[family]()


def _timm_groups(model):
    from timm.optim import param_groups_layer_decay

    return param_groups_layer_decay(model, WD, model.no_weight_decay(), layer_decay=DECAY)


def _by_name(model, groups):
    """Each parameter's (lr scale, weight decay), by its name in ``model``."""
    names = {id(p): name for name, p in model.named_parameters()}
    return {names[id(p)]: (group["lr_scale"], group["weight_decay"]) for group in groups for p in group["params"]}


@pytest.mark.parametrize("family,differences", [
    ("vit", FINAL_NORM), ("vit-gap", {}), ("dinov2-reg-prenorm", FINAL_NORM), ("deit-distilled", FINAL_NORM),
    ("eva-reg", {}),
    # Weight decay: timm spares 1-D tensors and the model's no_weight_decay() names, vitkit decays dense and
    # conv weights only; they agree by design except on a many-dimensional tensor outside both, as the
    # attention pool's probe, which timm decays.
    ("siglip", {**FINAL_NORM, "attn_pool.latent": ((1.0, WD), (1.0, 0.0))}),
])
def test_groups_are_timms_for_the_same_weights(tmp_path, family, differences):
    peer = _peer(family)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, tmp_path / "peer.safetensors")
    model = vitkit.load(tmp_path / "peer.safetensors", num_heads=4)
    theirs, ours = _by_name(peer, _timm_groups(peer)), _by_name(model, param_groups(model, WD, DECAY))
    timm_weights, weights = peer.state_dict(), model.state_dict()
    assert sorted(VITKIT_NAMES.get(name, name) for name in theirs) == sorted(ours), "one parameter for one"
    for name in theirs:
        assert torch.equal(timm_weights[name], weights[VITKIT_NAMES.get(name, name)]), name
    found = {name: (theirs[name], ours[VITKIT_NAMES.get(name, name)]) for name in theirs
             if theirs[name] != ours[VITKIT_NAMES.get(name, name)]}
    assert found == differences
    assert {scale for scale, _ in ours.values()} == {DECAY ** k for k in range(DEPTH + 2)}


def test_learned_rotary_frequencies_go_with_the_embedding():
    """On timm's EVA with learned ("mixed") rotary frequencies, LayerScale and q/v biases, named as vitkit names
    them: the same groups, but for ``rope.freqs``, which timm leaves to the head's group and vitkit puts with the
    position embeddings they stand for."""
    from timm.models.eva import Eva

    peer = randomised(Eva(img_size=32, patch_size=8, embed_dim=64, depth=DEPTH, num_heads=4, num_classes=10,
                          use_rot_pos_emb=True, rope_type="mixed", init_values=0.1))
    theirs, ours = _by_name(peer, _timm_groups(peer)), _by_name(peer, param_groups(peer, WD, DECAY))
    assert [name for name in theirs if theirs[name] != ours[name]] == ["rope.freqs"]  # fc_norm: no final norm
    assert (theirs["rope.freqs"], ours["rope.freqs"]) == ((1.0, 0.0), (DECAY ** (DEPTH + 1), 0.0))


def test_without_layer_decay_two_groups_and_refusals():
    model = vitkit.create_model(vitkit.ViTConfig(image_size=8, patch_size=4, dim=8, depth=1, num_heads=2,
                                                 mlp_dim=16, num_classes=3))
    groups = param_groups(model, WD)
    assert [group["weight_decay"] for group in groups] == [WD, 0.0] and not any("lr_scale" in g for g in groups)
    with pytest.raises(ValueError, match=r"layer_decay=1.5: expected a number in \(0, 1\]"):
        param_groups(model, WD, 1.5)
    with pytest.raises(ValueError, match="layer_decay needs a ViT with its blocks at .blocks; Linear has none"):
        param_groups(torch.nn.Linear(2, 2), WD, DECAY)


def test_finetuning_with_layer_decay_resumes_bit_exact(tmp_path):
    """Fine-tune a checkpoint with SGD, layer decay 0.5 and a constant rate 0.2 after warm-up; interrupted after
    the step-3 checkpoint and resumed, it ends as the straight run. Each group learns at 0.2 * 0.5 ** (3 - layer)."""
    vitkit.create_model(vitkit.ViTConfig(image_size=8, patch_size=2, dim=16, depth=2, num_heads=2, mlp_dim=32,
                                         in_chans=1, num_classes=5)).save(tmp_path / "pretrained")
    recipe = dict(model=dict(init=str(tmp_path / "pretrained"), args=dict(dropout=0.1, drop_path=0.1)),
                  optim=dict(optimizer="sgd", lr=0.2, layer_decay=0.5), schedule=dict(decay="constant"))
    straight = prepare(tiny_recipe(tmp_path / "straight", **recipe)).trainer
    straight.fit()
    interrupted = prepare(tiny_recipe(tmp_path / "resumed", **recipe)).trainer
    crash_at(interrupted, 5)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = prepare(tiny_recipe(tmp_path / "resumed", **recipe)).trainer
    resumed.fit(resume=True)
    assert resumed.step == straight.step == 8
    ours, theirs = state(resumed), state(straight)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in ours)
    for a, b in zip(resumed.optimizer.state.values(), straight.optimizer.state.values(), strict=True):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    groups = resumed.optimizer.param_groups  # in layer order, the weight matrices' group first
    assert [group["lr"] for group in groups] == [0.025, 0.025, 0.05, 0.05, 0.1, 0.1, 0.2, 0.2]
    assert [group["weight_decay"] for group in groups] == [0.1, 0.0] * 4


@pytest.mark.parametrize("architecture,differences", [
    ("vit_small_patch16_dinov3", FINAL_NORM),  # [class] and storage tokens with the embedding
    ("vit_pe_core_base_patch16_224", {**FINAL_NORM, "attn_pool.latent": ((1.0, WD), (1.0, 0.0))}),  # pool: head
    ("eva02_base_patch14_224", {}),  # q/v biases, sub-LN, separate SwiGLU gates (packed in vitkit: one group each)
])
def test_groups_of_the_rotary_families_are_timms(tmp_path, architecture, differences):
    """The 2023-25 families read from timm hub directories: each timm parameter's (lr scale, weight decay) is the
    one vitkit gives the parameter it became (LayerScale's gamma_1 as ls1.gamma; EVA-02's gate and value layers
    as halves of one fc1, so both must have the same groups in timm)."""
    from timm.models._hub import save_for_hf

    from vitkit.checkpoints.timm_families import NAMES

    peer = randomised(timm.create_model(architecture, img_size=32, patch_size=8, embed_dim=64, depth=DEPTH,
                                        num_heads=4, num_classes=10))
    save_for_hf(peer, str(tmp_path / "hub"))
    model = vitkit.load(tmp_path / "hub")
    theirs, ours = _by_name(peer, _timm_groups(peer)), _by_name(model, param_groups(model, WD, DECAY))
    packed = {".attn.q_proj.bias": ".attn.q_bias", ".attn.v_proj.bias": ".attn.v_bias", ".mlp.fc1_g.": ".mlp.fc1.",
              ".mlp.fc1_x.": ".mlp.fc1.", ".attn.q_proj.": ".attn.qkv.", ".attn.k_proj.": ".attn.qkv.",
              ".attn.v_proj.": ".attn.qkv."}

    def vitkit_name(name):
        for part, whole in packed.items():
            name = name.replace(part, whole)
        return NAMES.to_ours(name)

    assert {vitkit_name(name) for name in theirs} == set(ours)
    found = {name: (theirs[name], ours[vitkit_name(name)]) for name in theirs if theirs[name] != ours[vitkit_name(name)]}
    assert found == differences
