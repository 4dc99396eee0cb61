"""Parameter-efficient fine-tuning: each method trains what it should, adapters round-trip and load in peft,
adapters written by peft for timm and HF transformers ViTs give peft's logits, runs resume exactly, frozen
weights are not counted in the memory estimate, and bad adapters are refused in one line."""

import copy
import importlib
import hashlib
import json
import re
import shutil

import pytest
import torch

import vitkit
from vitkit.checkpoints.adapters import (AdapterSpec, adapt, copy_of, load_adapter, merged, save_adapter,
                                         save_model)
from vitkit.cli import main
from vitkit.errors import CheckpointError, ConfigError
from vitkit.memory import Limit, estimate
from vitkit.models.naflex import PatchBatch
from vitkit.train import Recipe
from vitkit.train.checkpointing import list_checkpoints
from vitkit.train.optim import make_optimizer, param_groups
from vitkit.train.run import prepare

peft = pytest.importorskip("peft", reason="could not import peft")

TINY = dict(num_classes=5, image_size=32, depth=2)
METHODS = ["lora", "dora", "vpt-shallow", "vpt-deep", "adaptformer", "bitfit", "linear"]


def perturbed(model):
    """``model`` with every trained tensor moved, so that an adapter changes the logits."""
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * 0.05)
    return model.eval()


def tiny(**changes):
    return vitkit.create_model("ViT-Ti/16", **{**TINY, **changes}).eval()


@pytest.mark.parametrize("method", METHODS)
def test_each_method_trains_its_own_parameters_and_round_trips(tmp_path, method):
    base = tiny()
    base.save(tmp_path / "base")
    model = vitkit.load(tmp_path / "base")
    trained, total = adapt(model, AdapterSpec(method, lora_rank=4))
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    expected = {"lora": r"(head\..*|blocks\.\d\.(attn\.qkv|mlp\.fc[12])\.lora_[AB]\.default\.weight)",
                "dora": r"(head\..*|blocks\.\d\.(attn\.qkv|mlp\.fc[12])\.lora_(A|B|magnitude_vector)\.default\.weight)",
                "vpt-shallow": r"(head\..*|prompts)", "vpt-deep": r"(head\..*|prompts)",
                "adaptformer": r"(head\..*|blocks\.\d\.adapter\.(down|up)\.(weight|bias))",
                "bitfit": r"(head\..*|.*bias)", "linear": r"head\..*"}[method]
    assert names and all(re.fullmatch(expected, name) for name in names), sorted(names)
    assert trained == sum(p.numel() for p in model.parameters() if p.requires_grad) < total / 4
    if method == "bitfit":
        assert names == {name for name, _ in base.named_parameters() if name.endswith("bias") or name.startswith("head")}
    if method == "vpt-deep":
        assert model.prompts.shape == (2, 10, 192)

    images = torch.randn(2, 3, 32, 32)
    adapted = perturbed(model)(images)
    assert not torch.allclose(adapted, base(images))
    save_adapter(model, tmp_path / "adapter", base=str(tmp_path / "base"))
    size = sum(f.stat().st_size for f in (tmp_path / "adapter").iterdir())
    assert size < (tmp_path / "base" / "model.safetensors").stat().st_size / 4
    loaded = vitkit.load(tmp_path / "base", adapter=tmp_path / "adapter")
    torch.testing.assert_close(loaded(images), adapted, rtol=0, atol=1e-5)
    torch.testing.assert_close(merged(loaded)(images), adapted, rtol=0, atol=1e-5)
    save_model(model, tmp_path / "whole")  # a plain checkpoint (LoRA merged) with the adapted model's outputs
    torch.testing.assert_close(vitkit.load(tmp_path / "whole")(images), adapted, rtol=0, atol=1e-5)


def test_vpt_shallow_is_registers_without_position_rows():
    """VPT-shallow's prompts enter as register tokens of a model whose prefix tokens take no position embedding
    do (the register path is checked against DINOv2's weights elsewhere)."""
    prompted = tiny(no_embed_class=True)
    adapt(prompted, AdapterSpec("vpt-shallow", prompt_tokens=3))
    perturbed(prompted)
    registers = tiny(no_embed_class=True, reg_tokens=3)
    state = {k: v for k, v in prompted.state_dict().items() if k != "prompts"}
    registers.load_state_dict({**state, "reg_token": prompted.prompts.detach()})
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(prompted(images), registers(images), rtol=0, atol=1e-6)
    maps = prompted.forward_intermediates(images, attention=True).attentions
    assert maps[0].shape[-1] == 1 + 3 + 4  # [class], the prompts, the 2x2 patches: rollout sees them all


def test_vpt_deep_replaces_the_prompts_before_every_block():
    model = tiny()
    adapt(model, AdapterSpec("vpt-deep", prompt_tokens=2))
    perturbed(model)
    seen = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda module, args: seen.append(args[0][:, 1:3].detach().clone()))
    model(torch.randn(1, 3, 32, 32))
    for layer, tokens in enumerate(seen):
        torch.testing.assert_close(tokens[0], model.prompts[layer].detach())


def test_adaptformer_adds_a_scaled_bottleneck_beside_the_mlp():
    model = tiny(depth=1)
    adapt(model, AdapterSpec("adaptformer", adapter_dim=8, adapter_scale=0.5))
    perturbed(model)
    block, z = model.blocks[0], torch.randn(2, 5, 192)
    with torch.no_grad():
        attended = z + block.attn(block.norm1(z))
        adapter = block.adapter
        by_hand = attended + block.mlp(block.norm2(attended)) + 0.5 * (
            torch.relu(attended @ adapter.down.weight.T + adapter.down.bias) @ adapter.up.weight.T + adapter.up.bias)
        torch.testing.assert_close(block(z), by_hand, rtol=0, atol=1e-5)


def test_lora_on_q_and_v_leaves_the_keys_alone_through_training():
    model = tiny(depth=1)
    torch.nn.init.normal_(model.head.weight)  # a head that passes gradients back
    base = copy.deepcopy(model)
    adapt(model, AdapterSpec("dora", lora_rank=2, targets=("q", "v")))
    optimizer = make_optimizer(model, "adamw", lr=0.05, weight_decay=0.1)  # as a run builds it
    images = torch.randn(4, 3, 32, 32)
    for _ in range(3):
        optimizer.zero_grad()
        model(images).square().mean().backward()
        optimizer.step()
    qkv, original = merged(model).blocks[0].attn.qkv, base.blocks[0].attn.qkv
    tokens = torch.randn(7, 192)
    q, k, v = qkv(tokens).chunk(3, dim=-1)
    q0, k0, v0 = original(tokens).chunk(3, dim=-1)
    torch.testing.assert_close(k, k0, rtol=0, atol=1e-6)
    assert not torch.allclose(q, q0) and not torch.allclose(v, v0)


@pytest.mark.parametrize("family", ["rope", "hybrid", "separate-qv-bias", "map-pool-registers"])
@pytest.mark.parametrize("method", ["lora", "vpt-deep", "adaptformer"])
def test_every_family_adapts_and_round_trips(tmp_path, family, method):
    changes = {"rope": dict(rope="axial", rope_grid="centered", rope_half=True, pos_embed="none", reg_tokens=2),
               "hybrid": dict(backbone=(1,), patch_size=1, image_size=64),
               "separate-qv-bias": dict(k_bias=False, layer_scale=1e-5, qk_norm=True),
               "map-pool-registers": dict(pool="map", class_token=False, reg_tokens=1)}[family]
    base = tiny(**changes)
    base.save(tmp_path / "base")
    model = vitkit.load(tmp_path / "base")
    adapt(model, AdapterSpec(method, lora_rank=2, prompt_tokens=3, adapter_dim=8))
    perturbed(model)
    size = model.config.image_size
    images = torch.randn(2, 3, *size)
    save_adapter(model, tmp_path / "adapter")
    loaded = vitkit.load(tmp_path / "base", adapter=tmp_path / "adapter")
    torch.testing.assert_close(loaded(images), model(images), rtol=0, atol=1e-5)
    if family == "rope":  # a NaFlex batch of one image gives what the image tensor gives
        patches = images[:1].unfold(2, 16, 16).unfold(3, 16, 16).permute(0, 2, 3, 4, 5, 1).reshape(1, 4, -1)
        coords = torch.tensor([[[0, 0], [0, 1], [1, 0], [1, 1]]])
        batch = PatchBatch(patches, coords, torch.ones(1, 4, dtype=torch.bool), torch.tensor([[2, 2]]))
        torch.testing.assert_close(loaded(batch), model(images[:1]), rtol=0, atol=1e-5)


def test_lora_parameters_take_their_blocks_layer_decay():
    model = tiny()
    adapt(model, AdapterSpec("lora", lora_rank=2))
    groups = param_groups(model, 0.05, layer_decay=0.5)
    scale = {id(p): group["lr_scale"] for group in groups for p in group["params"]}
    named = dict(model.named_parameters())
    assert scale[id(named["blocks.0.attn.qkv.lora_A.default.weight"])] == 0.5 ** 2
    assert scale[id(named["blocks.1.mlp.fc2.lora_B.default.weight"])] == 0.5
    assert scale[id(named["head.weight"])] == 1.0
    assert id(named["blocks.0.attn.qkv.base_layer.weight"]) not in scale  # frozen: not in the optimiser


# ------------------------------------------------------------------------------------------ peft, both ways
def test_a_vitkit_adapter_loads_in_peft_with_vitkit_logits(tmp_path):
    tiny().save(tmp_path / "base")
    for method, targets in (("lora", ("qkv", "fc1", "fc2")), ("dora", ("q", "v"))):
        model = vitkit.load(tmp_path / "base")
        adapt(model, AdapterSpec(method, lora_rank=4, lora_alpha=16, targets=targets))
        save_adapter(perturbed(model), tmp_path / method)
        assert json.loads((tmp_path / method / "adapter_config.json").read_text())["peft_type"] == "LORA"
        images = torch.randn(2, 3, 32, 32)
        theirs = peft.PeftModel.from_pretrained(vitkit.load(tmp_path / "base"), tmp_path / method).eval()
        torch.testing.assert_close(theirs(images), model(images), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dora", [False, True])
def test_peft_adapters_of_timm_vits_give_peft_logits(tmp_path, dora):
    timm = pytest.importorskip("timm", reason="could not import timm")
    from safetensors.torch import save_file
    net = timm.create_model("vit_tiny_patch16_224", num_classes=5, img_size=32, depth=2).eval()
    save_file(net.state_dict(), tmp_path / "timm.safetensors")
    theirs = peft.get_peft_model(copy.deepcopy(net), peft.LoraConfig(
        r=4, lora_alpha=16, target_modules=["qkv", "fc1"], modules_to_save=["head"], use_dora=dora))
    perturbed(theirs).save_pretrained(tmp_path / "adapter")
    images = torch.randn(2, 3, 32, 32)
    ours = vitkit.load(tmp_path / "timm.safetensors", adapter=tmp_path / "adapter")
    torch.testing.assert_close(ours(images), theirs(images), rtol=0, atol=1e-5)


V5_TO_V4 = {"q_proj": "attention.query", "k_proj": "attention.key", "v_proj": "attention.value",
            "o_proj": "output.dense"}


def transformers4_names(folder, into):
    """An adapter folder as peft on transformers 4 writes it: ``encoder.layer.N.attention.attention.query``."""
    from safetensors.torch import load_file, save_file
    into.mkdir()
    shutil.copy(folder / "adapter_config.json", into)
    state = load_file(folder / "adapter_model.safetensors")
    renamed = {re.sub(r"\.layers\.(\d+)\.attention\.(\w_proj)\.",
                      lambda found: f".encoder.layer.{found[1]}.attention.{V5_TO_V4[found[2]]}.", key): value
               for key, value in state.items()}
    assert renamed.keys() != state.keys()
    save_file(renamed, into / "adapter_model.safetensors")


@pytest.mark.parametrize("dora", [False, True])
def test_peft_adapters_of_hf_vits_on_q_and_v_give_peft_logits_in_both_namings(tmp_path, dora):
    transformers = pytest.importorskip("transformers", reason="could not import transformers")
    net = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
        patch_size=16, num_labels=3)).eval()
    net.save_pretrained(tmp_path / "hf")
    theirs = peft.get_peft_model(copy.deepcopy(net), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["classifier"], use_dora=dora))
    perturbed(theirs).save_pretrained(tmp_path / "v5")
    transformers4_names(tmp_path / "v5", tmp_path / "v4")
    images = torch.randn(2, 3, 32, 32)
    expected = theirs(pixel_values=images).logits
    for names in ("v5", "v4"):
        ours = vitkit.load(tmp_path / "hf", adapter=tmp_path / names)
        torch.testing.assert_close(ours(images), expected, rtol=0, atol=1e-5)
        assert ours.blocks[0].attn.qkv.lora_A["default"].weight.shape == (8, 32)  # q and v fused: rank 2 x 4


# ------------------------------------------------------------------------------------------------ training
def lora_recipe(run_dir, base, **changes) -> Recipe:
    recipe = Recipe(model=dict(init=str(base)), data=dict(dataset="digits"),
                    augment=dict(transform="pretrain", crop_scale=(0.5, 1.0), hflip=False),
                    peft=dict(method="dora", lora_rank=2, lora_dropout=0.1, targets=("q", "v", "fc1")),
                    schedule=dict(steps=6, batch_size=32, warmup_steps=2), optim=dict(lr=3e-2),
                    run=dict(checkpoint_every=3, keep_last=5, log_every=1, threads=1, dir=str(run_dir)))
    return recipe.replace(**changes)


@pytest.fixture
def digits_base(tmp_path):
    config = vitkit.ViTConfig(image_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=2, mlp_dim=32, in_chans=1,
                              num_classes=10)
    model = vitkit.VisionTransformer(config)
    model.save(tmp_path / "base")
    return tmp_path / "base"


def test_a_peft_run_resumes_exactly(tmp_path, digits_base):
    straight = prepare(lora_recipe(tmp_path / "straight", digits_base)).trainer
    straight.fit()
    interrupted = prepare(lora_recipe(tmp_path / "resumed", digits_base)).trainer
    objective = interrupted.objective

    def failing(model, batch):
        if interrupted.step == 4:
            raise KeyboardInterrupt("simulated crash")
        return objective(model, batch)
    interrupted.objective = failing
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    assert [p.name for p in list_checkpoints(tmp_path / "resumed")] == ["step-00000003"]
    resumed = prepare(lora_recipe(tmp_path / "resumed", digits_base)).trainer
    resumed.fit(resume=True)
    ours, theirs = resumed.model.state_dict(), straight.model.state_dict()
    assert ours.keys() == theirs.keys() and any(".lora_" in key for key in ours)
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def test_finetune_peft_from_the_command_line(tmp_path, digits_base, capsys):
    before = hashlib.sha256((digits_base / "model.safetensors").read_bytes()).hexdigest()
    run = tmp_path / "run"
    assert main(["finetune", str(digits_base), "--dataset", "digits", "--peft", "lora", "--lora-rank", "2",
                 "--steps", "4", "--batch-size", "32", "--threads", "1", "--run-dir", str(run)]) == 0
    err = capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert f"training {summary['params/trained']:,} of {summary['params/total']:,} parameters" in err
    adapted = vitkit.load(digits_base, adapter=run / "adapter")
    # rank 2 on qkv (2 x 16 + 48 x 2), fc1 (2 x 16 + 32 x 2) and fc2 (2 x 32 + 16 x 2) of 2 blocks, and the head
    assert summary["peft/method"] == "lora" and summary["params/trained"] == 2 * (128 + 96 + 96) + 16 * 10 + 10
    images = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(vitkit.load(run / "model")(images), adapted(images), rtol=0, atol=1e-5)
    assert not torch.allclose(adapted(images), vitkit.load(digits_base)(images))
    assert hashlib.sha256((digits_base / "model.safetensors").read_bytes()).hexdigest() == before


def test_frozen_weights_need_no_gradients_or_optimiser_state(tmp_path, monkeypatch, digits_base):
    config = vitkit.models.model_config("ViT-B/16")
    full, lora = estimate(config, 8, training=True), estimate(config, 8, training=True, trained=1_000_000)
    assert full.parts["gradients"] == full.parts["weights"] and lora.parts["gradients"] == 4_000_000
    assert lora.parts["optimiser"] == 2 * 4_000_000
    probe = estimate(config, 8, training=True, trained=7_690, frozen_blocks=True)
    assert probe.parts["activations"] == estimate(config, 8).parts["activations"]
    # A limit between the two runs' estimates: the full fine-tuning is refused, the LoRA run goes through.
    run_module = importlib.import_module("vitkit.train.run")
    recipe = lora_recipe(tmp_path / "r", digits_base, model={"image_size": 8}, peft={"method": "none"})
    small = vitkit.load(digits_base).config
    limit = Limit(run_module.estimate(small, 32, (8, 8), training=True, optimizer="adamw").total - 1, "a test's bound")
    monkeypatch.setattr(run_module, "available_memory", lambda: limit)
    with pytest.raises(ConfigError, match="needs about"):
        run_module.check_run_memory(recipe, small, torch.device("cpu"), "vitkit finetune")
    run_module.check_run_memory(recipe.replace(peft={"method": "lora", "targets": ("qkv",)}), small,
                                torch.device("cpu"), "vitkit finetune")


# ----------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("flags, expected", [
    (["--peft", "lorra"], "peft.method: expected one of"),
    (["--peft", "lora", "--lora-rank", "0"], "expected an int >= 1"),
    (["--peft", "lora", "--lora-rank", "64"], "--lora-rank 64: larger than blocks.0.attn.qkv"),
    (["--peft", "lora", "--peft-targets", "qkv,fc3"], "peft.targets: expected comma-separated layers"),
    (["--peft", "lora", "--peft-targets", "qkv,q"], "qkv already holds the q, k and v rows"),
])
def test_bad_peft_flags_are_one_line(tmp_path, digits_base, capsys, flags, expected):
    run = tmp_path / "run"
    try:  # refused by the parser (SystemExit) or by the run
        code = main(["finetune", str(digits_base), "--dataset", "digits", "--steps", "1", "--run-dir", str(run),
                     *flags])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err
    assert not (run / "adapter").exists() and not (run / "model").exists()


def test_peft_needs_a_checkpoint(capsys):
    assert main(["train", "--peft", "lora", "--steps", "1"]) == 2
    assert "peft.method: expected 'none' unless fine-tuning a checkpoint" in capsys.readouterr().err


def test_adapters_that_do_not_fit_their_base_are_refused(tmp_path):
    tiny().save(tmp_path / "base")
    tiny(dim=96, num_heads=3).save(tmp_path / "narrow")
    model = vitkit.load(tmp_path / "base")
    adapt(model, AdapterSpec("lora", lora_rank=2))
    save_adapter(model, tmp_path / "lora")
    with pytest.raises(CheckpointError, match=r"blocks\.0\.attn\.qkv is A \(2, 192\).*takes 96"):
        vitkit.load(tmp_path / "narrow", adapter=tmp_path / "lora")
    # target modules that match nothing, named
    from safetensors.torch import load_file, save_file
    state = load_file(tmp_path / "lora" / "adapter_model.safetensors")
    shutil.copytree(tmp_path / "lora", tmp_path / "elsewhere")
    save_file({k.replace("blocks.1.", "blocks.7."): v for k, v in state.items()},
              tmp_path / "elsewhere" / "adapter_model.safetensors")
    with pytest.raises(CheckpointError, match=r"target module blocks\.7\.attn\.qkv matches no module of the base model"):
        vitkit.load(tmp_path / "base", adapter=tmp_path / "elsewhere")
    # an adapter given where its base belongs, and an unknown type
    with pytest.raises(CheckpointError, match="is an adapter folder, not a model"):
        vitkit.load(tmp_path / "lora")
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(CheckpointError, match="peft_type='IA3'"):
        vitkit.load(tmp_path / "base", adapter=tmp_path / "lora")
    with pytest.raises(CheckpointError, match="no adapter folder"):
        vitkit.load(tmp_path / "base", adapter=tmp_path / "missing")


def test_a_stand_alone_copy_of_an_adapted_model_computes_the_same(tmp_path):
    model = tiny()
    adapt(model, AdapterSpec("dora", lora_rank=2, targets=("q", "v")))
    perturbed(model)
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(copy_of(model, model.state_dict()).eval()(images), model(images), rtol=0, atol=0)


def test_a_size_or_head_asked_for_wins_over_the_adapters(tmp_path):
    tiny().save(tmp_path / "base")
    model = vitkit.load(tmp_path / "base")
    adapt(model, AdapterSpec("vpt-deep", prompt_tokens=2))
    save_adapter(perturbed(model), tmp_path / "vpt")
    resized = vitkit.load(tmp_path / "base", adapter=tmp_path / "vpt", image_size=64, num_classes=3)
    assert resized.config.image_size == (64, 64) and resized.config.num_classes == 3
    assert resized.config.prompt_tokens == 2 and resized(torch.randn(1, 3, 64, 64)).shape == (1, 3)


def test_a_lora_model_is_not_saved_as_an_unreadable_checkpoint(tmp_path):
    model = tiny()
    adapt(model, AdapterSpec("lora", lora_rank=2))
    with pytest.raises(ConfigError, match="save_model merges them first"):
        model.save(tmp_path / "model")
    assert not (tmp_path / "model").exists()
