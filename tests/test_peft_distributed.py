"""Parameter-efficient fine-tuning under torchrun (gloo, CPU): `vitkit finetune --peft` on two processes, data
parallel or sharded, ends with the adapter one process trains on the same global batch."""

import pytest
import torch
from launch import VITKIT, VITKIT_TORCHRUN, launch
from safetensors.torch import load_file

import vitkit

pytest.importorskip("peft", reason="could not import peft")

ARGS = ["--dataset", "digits", "--steps", "3", "--batch-size", "32", "--optimizer", "sgd", "--lr", "0.3",
        "--warmup-steps", "1", "--transform", "pretrain", "--crop-scale", "0.5", "1.0", "--threads", "1"]


@pytest.mark.parametrize("method", ["lora"])
def test_a_peft_run_on_two_processes_equals_one(tmp_path, method):
    vitkit.VisionTransformer(vitkit.ViTConfig(image_size=(8, 8), patch_size=2, dim=16, depth=2, num_heads=2,
                                              mlp_dim=32, in_chans=1, num_classes=10)).save(tmp_path / "base")
    flags = ["finetune", tmp_path / "base", *ARGS, "--peft", method, "--lora-rank", "2", "--adapter-dim", "4"]
    launch(VITKIT, *flags, "--run-dir", tmp_path / "single")
    single = load_file(tmp_path / "single" / "adapter" / "adapter_model.safetensors")
    assert any(".lora_B" in key or ".adapter.up" in key for key in single)
    for parallel in ("ddp", "fsdp"):
        stdout = launch(VITKIT_TORCHRUN, *flags, "--run-dir", tmp_path / parallel, "--parallel", parallel)
        assert stdout.count("test accuracy:") == 1, "only rank 0 writes"
        double = load_file(tmp_path / parallel / "adapter" / "adapter_model.safetensors")
        assert double.keys() == single.keys()
        for key in single:  # the gradient of the global batch summed in another order moves the last bits
            torch.testing.assert_close(double[key], single[key], rtol=1e-5, atol=1e-6, msg=f"{parallel} {key}")
