"""Device and precision choice (vitkit.runtime): names, the clean error for a missing GPU, what `auto` picks."""

import pytest
import torch

from vitkit import runtime
from vitkit.cli import main
from vitkit.errors import ConfigError, DeviceError

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")


def test_cpu_and_default_device():
    assert runtime.select_device("cpu") == torch.device("cpu")
    assert runtime.select_device(None) == runtime.best_device()
    expected = "cuda" if torch.cuda.is_available() else "mps" if runtime.mps_available() else "cpu"
    assert runtime.best_device().type == expected


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda:x"])
def test_unknown_device_names_are_device_errors(name):
    with pytest.raises(DeviceError, match="expected cpu, cuda, cuda:N or mps"):
        runtime.select_device(name)


@no_gpu
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_gpu_is_a_one_line_error(name, tmp_path, capsys):
    with pytest.raises(DeviceError, match="no CUDA GPU is available"):
        runtime.select_device(name)
    vitkit_model = tmp_path / "model"
    torch.manual_seed(0)
    from vitkit.models import ViTConfig, VisionTransformer

    VisionTransformer(ViTConfig(image_size=8, patch_size=4, dim=16, depth=1, num_heads=2, mlp_dim=16,
                                in_chans=1, num_classes=10)).save(vitkit_model)
    for command in (["eval", str(vitkit_model)], ["predict", str(vitkit_model), "x.png"], ["info", str(vitkit_model)],
                    ["train", "--steps", "1"]):
        assert main([*command, "--device", name]) == 1  # the machine lacks it: a runtime error, not a usage one
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and f"--device {name}: no CUDA GPU" in error, error


def fake_cpu(monkeypatch, capability, flags):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(runtime, "cpu_flags", lambda: frozenset(flags))


@pytest.mark.parametrize("capability, flags, expected", [
    ("AVX2", {"avx2", "fma"}, torch.float32),  # no native bf16: emulated, several times slower
    ("AVX512", {"avx512f", "avx512bw"}, torch.float32),  # AVX512 without its bf16 extension
    ("AVX512", {"avx512f", "avx512_bf16"}, torch.bfloat16),  # e.g. Zen 4, Cooper Lake
    ("AMX", {"avx512f", "amx_bf16", "amx_tile"}, torch.bfloat16),
    ("AVX512", {"amx_bf16", "amx_tile"}, torch.bfloat16),  # Sapphire Rapids
    ("DEFAULT", {"avx512_bf16"}, torch.float32),  # torch's kernels built without AVX512 cannot use it
])
def test_auto_picks_bf16_only_where_the_cpu_runs_it_natively(monkeypatch, capability, flags, expected):
    fake_cpu(monkeypatch, capability, flags)
    assert runtime.resolve_precision("auto", torch.device("cpu")) == expected
    assert runtime.autocast_dtype("auto", torch.device("cpu")) == expected
    assert runtime.resolve_precision("fp32", torch.device("cpu")) == torch.float32
    assert runtime.resolve_precision("bf16", torch.device("cpu")) == torch.bfloat16  # asked for: given, if slow


def test_this_cpu_flags_are_read_from_proc_cpuinfo():
    text = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    line = next((l for l in text.splitlines() if l.startswith(("flags", "Features"))), "")
    assert runtime.cpu_flags() == frozenset(line.partition(":")[2].split())
    native = torch.backends.cpu.get_cpu_capability().startswith(("AVX512", "AMX")) and bool(
        {"avx512_bf16", "amx_bf16"} & runtime.cpu_flags())
    assert runtime.native_bf16(torch.device("cpu")) == native


def test_precision_errors():
    with pytest.raises(DeviceError, match="unknown precision 'int4'"):
        runtime.resolve_precision("int4", torch.device("cpu"))
    with pytest.raises(ConfigError, match="precision='fp16' for training"):
        runtime.autocast_dtype("fp16", torch.device("cpu"))


def test_eval_in_bf16_stays_close_to_fp32(tmp_path, capsys):
    """--precision bf16 runs the matrix products in bf16 (autocast): logits move a little, accuracy hardly."""
    from vitkit.evaluate import evaluate
    from vitkit.models import ViTConfig, VisionTransformer

    model = VisionTransformer(ViTConfig(image_size=16, patch_size=4, dim=32, depth=2, num_heads=2, mlp_dim=64,
                                        num_classes=5)).eval()
    torch.nn.init.normal_(model.head.weight)
    images = torch.randn(64, 3, 16, 16)
    labels = model(images).argmax(-1)
    loader = [(images, labels)]
    assert evaluate(model, loader, 5).top1 == 1.0
    with runtime.autocast(torch.device("cpu"), torch.bfloat16):
        assert model(images).dtype == torch.bfloat16
    assert evaluate(model, loader, 5, "cpu", torch.bfloat16).top1 >= 0.9
