"""timm state dicts (plain and hybrid), saved by timm's model itself, load with timm's logits."""

import pickle

import pytest
import torch
from interop_helpers import randomised, timm_model
from safetensors.torch import save_file

import vitkit

timm = pytest.importorskip("timm")


def save(peer, path):
    state = {k: v.contiguous() for k, v in peer.state_dict().items()}
    if path.suffix == ".safetensors":
        save_file(state, path)
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize("kwargs,pool", [
    (dict(), "token"),
    (dict(class_token=False, global_pool="avg"), "gap"),  # timm's avg defaults to fc_norm
    (dict(class_token=False, global_pool="avg", fc_norm=False), "gap"),
    (dict(no_embed_class=True), "token"),
])
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_timm_state_dicts_give_timms_logits(tmp_path, kwargs, pool, suffix):
    peer = timm_model(**kwargs)
    model = vitkit.load(save(peer, tmp_path / f"peer{suffix}"), num_heads=4)
    assert model.config.pool == pool and model.config.fc_norm == ("fc_norm.weight" in peer.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)


def test_class_token_with_avg_pooling_needs_the_pool_override(tmp_path):
    peer = timm_model(global_pool="avg", fc_norm=False)
    path = save(peer, tmp_path / "peer.safetensors")
    x = torch.randn(2, 3, 32, 32)
    model = vitkit.load(path, num_heads=4, pool="gap")
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)
        assert not torch.allclose(vitkit.load(path, num_heads=4)(x), peer(x), atol=1e-3)


@pytest.mark.parametrize("layers,patch,size", [((1, 1), 1, 64), ((), 2, 32)])
def test_timm_hybrids_give_timms_logits(tmp_path, layers, patch, size):
    peer = timm_model(backbone=layers, img_size=size, patch_size=patch)
    model = vitkit.load(save(peer, tmp_path / "hybrid.safetensors"), num_heads=4)
    c = model.config
    assert (c.backbone, c.std_conv, c.std_conv_eps, c.gn_eps) == (layers, "sqrt(var+eps)", 1e-8, 1e-5)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=2e-5, rtol=0)


def test_head_count_of_a_nonstandard_width_must_be_passed(tmp_path):
    path = save(timm_model(), tmp_path / "peer.safetensors")
    with pytest.raises(vitkit.CheckpointError, match="pass the override num_heads="):
        vitkit.load(path)


@pytest.mark.parametrize("safetensors", [True, False])
def test_timm_hub_directories_carry_pooling_heads_and_normalisation(tmp_path, safetensors):
    """What ``hf-hub:timm/...`` downloads, written by timm's own hub code: the config says the pooling
    (avg over the patches despite a [class] token), the head count and the input statistics."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from timm.models._hub import save_for_hf

    peer = randomised(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=64, depth=2,
                                        num_heads=4, num_classes=5, global_pool="avg", fc_norm=False))
    peer.pretrained_cfg = {**peer.pretrained_cfg, "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD}
    save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=safetensors)
    model = vitkit.load(tmp_path / "hub")
    assert (model.config.pool, model.config.num_heads) == ("gap", 4)
    assert model.config.provenance.normalization == "imagenet"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)


def test_timm_hub_pooling_vitkit_lacks_is_named(tmp_path):
    from timm.models._hub import save_for_hf

    peer = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=5,
                             global_pool="max")
    save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=True)
    with pytest.raises(vitkit.CheckpointError, match=r"config.json: global_pool='max'"):
        vitkit.load(tmp_path / "hub")


class Payload:
    """Any class: unpickling it would run code from the file."""


def test_pickle_bearing_files_are_refused(tmp_path):
    state = {k: v for k, v in timm_model().state_dict().items()}
    state["payload"] = Payload()
    torch.save(state, tmp_path / "evil.pth")
    with pytest.raises(vitkit.CheckpointError, match="refusing to unpickle"):
        vitkit.load(tmp_path / "evil.pth")
    (tmp_path / "raw.bin").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(vitkit.CheckpointError, match="refusing to unpickle|corrupt or unreadable"):
        vitkit.load(tmp_path / "raw.bin")


def test_unknown_keys_are_listed(tmp_path):
    state = {k: v.contiguous() for k, v in timm_model().state_dict().items()}
    state.update({f"blocks.{i}.adapter.weight": torch.zeros(4) for i in range(2)})  # LayerScale is read since #13
    save_file(state, tmp_path / "adapter.safetensors")
    with pytest.raises(vitkit.CheckpointError, match=r"unexpected keys \(2\): blocks.0.adapter.weight"):
        vitkit.load(tmp_path / "adapter.safetensors", num_heads=4)


def test_internvit_without_a_final_norm_reads_as_timm_runs_it(tmp_path):
    """timm's InternViT-300M (vit_intern300m_patch14_448: LayerScale, no norm after the last block), from its hub
    directory and as a bare state dict: timm's logits and features at its size and at another; the writers whose
    formats always hold a final norm refuse it by name, and timm's own state dict travels back."""
    from timm.models._hub import save_for_hf

    from vitkit.checkpoints.google import write_npz
    from vitkit.checkpoints.hf import write_hf
    from vitkit.checkpoints.timm import write_timm
    from vitkit.errors import FormatError

    peer = randomised(timm.create_model("vit_intern300m_patch14_448", img_size=56, embed_dim=64, depth=2, num_heads=4,
                                        num_classes=5))
    assert not any(key.startswith(("norm.", "fc_norm.")) for key in peer.state_dict())
    save_for_hf(peer, str(tmp_path / "hub"), safe_serialization=True)
    bare = save(peer, tmp_path / "bare.safetensors")
    for model in (vitkit.load(tmp_path / "hub"), vitkit.load(bare, num_heads=4)):
        assert not model.config.final_norm and model.config.layer_scale
        for size in ((56, 56), (28, 42)):
            x = torch.randn(2, 3, *size)
            with torch.no_grad():
                torch.testing.assert_close(model.eval()(x), peer(x), atol=1e-5, rtol=0)
                torch.testing.assert_close(model.forward_features(x), peer.forward_features(x), atol=1e-5, rtol=0)
    for write, name in ((write_hf, "hf"), (write_npz, "out.npz")):
        with pytest.raises(FormatError, match="final_norm=False"):
            write(model, tmp_path / name)
    back = vitkit.load(write_timm(model, tmp_path / "back.safetensors"), num_heads=4)
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(x), peer(x), atol=1e-5, rtol=0)
