"""The GPU acceptance suite (`pytest -m cuda`, run by `make gpu-check`, docs/guide/gpu.md): bf16 training against
fp32, the fused attention kernels of every family, compiled training, NCCL DDP and FSDP2 with exact resume, pinned
loading, ONNX from a CUDA model, ``--device cuda`` on every command and the memory of a ViT-B/16 training step
against timm's. Where the same code runs on the CPU, the test is parametrised by device and its CPU twin runs in the
normal suite; the distributed tests' CPU twins are tests/test_train_ddp.py and test_train_fsdp.py (gloo)."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from launch import child_env
from safetensors.torch import load_file

import vitkit
from vitkit.cli import main
from vitkit.models import ViTConfig, VisionTransformer

CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=(
    "needs a CUDA GPU: `make gpu-check` runs it on a GPU machine (docs/guide/gpu.md)"))]
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
TINY = dict(image_size=8, patch_size=4, in_chans=1, dim=16, depth=1, num_heads=2, mlp_dim=16, num_classes=10)
# A training run's model on digits: the recipe gives the image size and the number of classes.
MODEL_ARGS = {key: value for key, value in TINY.items() if key not in ("image_size", "num_classes")}

# Each family's attention on the same skeleton (head width 64, which the fused kernels take).
FAMILIES = {
    "vit": {},
    "deit-distilled": dict(dist_token=True),
    "dinov2-registers": dict(reg_tokens=4, layer_scale=1e-5),
    "clip": dict(pre_norm=True, patch_bias=False),
    "siglip-map": dict(class_token=False, pool="map"),
    "qk-norm": dict(qk_norm=True),
    "dinov3-rope": dict(rope="axial", rope_grid="centered", rope_half=True, pos_embed="none", reg_tokens=4,
                        layer_scale=1e-5, qkv_bias=False),
    "rope-mixed": dict(rope="mixed", rope_xy=True, pos_embed="none", layer_scale=1e-5),
    "aimv2": dict(norm="rms", ln_eps=1e-5, patch_norm=True, mlp="swiglu", proj_bias=False, qkv_bias=False,
                  class_token=False, pool="gap"),
}


def _tiny_checkpoint(folder):
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**TINY))
    torch.nn.init.normal_(model.head.weight)
    model.save(folder)
    return folder


@pytest.mark.parametrize("device", DEVICES)
def test_a_bf16_autocast_training_step_follows_fp32(device):
    """One step of the same model and batch under bf16 autocast and in fp32: loss within 2% and every gradient
    with cosine similarity >= 0.99 to fp32's (bf16 keeps 8 bits of mantissa: about 0.4% a rounding)."""
    from vitkit.runtime import autocast

    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(image_size=32, patch_size=8, dim=128, depth=2, num_heads=2, mlp_dim=256,
                                        num_classes=10)).to(device)
    torch.nn.init.normal_(model.head.weight, std=0.02)
    images, labels = torch.randn(16, 3, 32, 32, device=device), torch.randint(0, 10, (16,), device=device)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model.zero_grad(set_to_none=True)
        with autocast(torch.device(device), dtype):
            loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
        loss.backward()
        results[dtype] = loss.item(), {name: p.grad.flatten().float() for name, p in model.named_parameters()}
    (loss32, grads32), (loss16, grads16) = results[torch.float32], results[torch.bfloat16]
    assert loss16 == pytest.approx(loss32, rel=0.02)
    for name, grad in grads32.items():
        if grad.norm() > 0:
            assert torch.nn.functional.cosine_similarity(grads16[name], grad, dim=0) >= 0.99, name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device", DEVICES)
def test_every_family_runs_its_attention_in_a_fused_kernel(device, family):
    """Forward and backward with the math fallback switched off (``sdpa_kernel`` allows only the flash and
    memory-efficient kernels, so attention that needs the fallback raises "No available kernel"); on the GPU, in
    bf16 autocast as training runs, the profiler must also show a flash or cutlass fMHA kernel. The proof that no
    family falls back to math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from vitkit.runtime import autocast

    torch.manual_seed(0)
    config = ViTConfig(**{**dict(image_size=32, patch_size=8, dim=128, depth=2, num_heads=2, mlp_dim=256,
                                 num_classes=10), **FAMILIES[family]})
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = VisionTransformer(config).to(device).train()
    images = torch.randn(4, 3, 32, 32, device=device)
    backends = [SDPBackend.FLASH_ATTENTION] + ([SDPBackend.EFFICIENT_ATTENTION] if device == "cuda" else [])
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if device == "cuda" else [])
    with sdpa_kernel(backends), torch.profiler.profile(activities=activities) as profile:
        with autocast(torch.device(device), dtype):
            loss = model(images).float().sum()
        loss.backward()
    if device == "cuda":
        kernels = {event.name for event in profile.events()}
        assert any("flash" in name.lower() or "fmha" in name.lower() for name in kernels), sorted(kernels)[:20]


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow), DEVICES[1]])
def test_compiled_bf16_training_learns(device, tmp_path):
    """`vitkit train --compile` (bf16 where the device runs it natively) trains: the loss falls and the test
    accuracy is over twice chance (0.40 on the CPU; compiling takes about a minute there)."""
    run_dir = tmp_path / "run"
    assert main(["train", "--dataset", "digits", "--model-args", json.dumps(MODEL_ARGS),
                 "--steps", "30", "--batch-size", "64", "--lr", "3e-3", "--compile", "--precision", "auto",
                 "--device", device, "--log-every", "5", "--run-dir", str(run_dir)]) == 0
    losses = [record["train/loss"] for record in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if "train/loss" in record]
    assert losses[-1] < 0.97 * losses[0], losses
    assert json.loads((run_dir / "summary.json").read_text())["test/accuracy"] > 0.2


def _torchrun(nproc: int, run_dir, *extra) -> None:
    """``vitkit train`` on a tiny model under torchrun with ``nproc`` GPU processes (NCCL)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
               "vitkit", "train", "--dataset", "digits", "--model-args", json.dumps({**MODEL_ARGS, "dropout": 0.2}),
               "--steps", "6", "--checkpoint-every", "3", "--batch-size", "32", "--optimizer", "sgd", "--lr", "0.3",
               "--device", "cuda", "--run-dir", str(run_dir), *extra]
    env = {key: value for key, value in child_env().items() if key != "OMP_NUM_THREADS"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA[1].kwargs["reason"])
def test_nccl_training_resumes_exactly(parallel, tmp_path):
    """DDP and FSDP2 over NCCL (world size 1 on one GPU, 2 where there are two): a run continued from its
    middle checkpoint ends with the uninterrupted run's weights, bit for bit."""
    nproc = min(2, torch.cuda.device_count())
    straight = tmp_path / "straight"
    _torchrun(nproc, straight, "--parallel", parallel)
    resumed = tmp_path / "resumed"  # as if stopped right after the middle checkpoint
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000006")
    shutil.rmtree(resumed / "model")
    _torchrun(nproc, resumed, "--parallel", parallel, "--resume")
    ours, theirs = load_file(resumed / "model" / "model.safetensors"), load_file(straight / "model" /
                                                                                  "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in theirs)


@pytest.mark.parametrize("device", DEVICES)
def test_batches_bound_for_a_gpu_are_pinned_and_copied_without_blocking(device):
    """The training loader pins host memory only for a GPU; the non-blocking copy gives the same tensor."""
    from vitkit.data.loading import worker_options

    options = worker_options(0, torch.device(device))
    assert options["pin_memory"] is (device == "cuda")
    batch = torch.arange(4 * 3 * 8 * 8, dtype=torch.float32).reshape(4, 3, 8, 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(batch), batch_size=4, **options)
    (images,) = next(iter(loader))
    assert images.is_pinned() is (device == "cuda")
    copied = images.to(device, non_blocking=True)
    torch.cuda.synchronize() if device == "cuda" else None
    assert torch.equal(copied.cpu(), batch)


@pytest.mark.parametrize("device", DEVICES)
def test_onnx_export_from_a_model_on_the_device(device, tmp_path):
    """`vitkit convert --to onnx --device D`: ONNX Runtime on the CPU gives the model's outputs on D."""
    pytest.importorskip("onnxruntime")
    import onnxruntime

    checkpoint = _tiny_checkpoint(tmp_path / "model")
    assert main(["convert", str(checkpoint), str(tmp_path / "model.onnx"), "--to", "onnx", "--device", device]) == 0
    images = torch.randn(3, 1, 8, 8)
    model = vitkit.load(checkpoint).eval().to(device)
    with torch.no_grad():
        expected = model(images.to(device)).cpu()
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    (ours,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    torch.testing.assert_close(torch.from_numpy(ours), expected, atol=1e-4, rtol=1e-4)


def _commands(checkpoint, image, out):
    """Every command of vitkit that takes ``--device``, on the tiny checkpoint, each writing under ``out``."""
    return {
        "info": ["info", checkpoint],
        "eval": ["eval", checkpoint, "--dataset", "digits", "--out", out / "eval"],
        "predict": ["predict", checkpoint, image],
        "fewshot": ["fewshot", checkpoint, "--dataset", "digits", "--shots", "5", "--seeds", "1", "--out",
                    out / "fewshot"],
        "analyze": ["analyze", checkpoint, "--images", image, "--out", out / "analysis"],
        "convert": ["convert", checkpoint, out / "copy", "--to", "native"],
        "bench": ["bench", checkpoint, "--runtimes", "eager", "--precision", "fp32", "--repeats", "1",
                  "--peak-size", "64", "--batch-size", "2"],
        "train": ["train", "--dataset", "digits", "--model-args", json.dumps(MODEL_ARGS), "--steps", "2",
                  "--batch-size", "8", "--run-dir", out / "train"],
        "finetune": ["finetune", checkpoint, "--dataset", "digits", "--steps", "2", "--batch-size", "8", "--run-dir",
                     out / "finetune"],
    }


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("every-command")
    Image.new("L", (8, 8), 128).save(folder / "digit.png")
    return _tiny_checkpoint(folder / "model"), folder / "digit.png"


COMMANDS = ("info", "eval", "predict", "fewshot", "analyze", "convert", "bench", "train", "finetune")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA[1].kwargs["reason"])
def test_every_command_runs_on_the_gpu(command, tiny_inputs, tmp_path, capsys):
    """Each command with ``--device cuda`` exits 0 (its CPU twins: the commands' own tests, which run on the CPU)."""
    checkpoint, image = tiny_inputs
    arguments = [str(argument) for argument in _commands(checkpoint, image, tmp_path)[command]]
    assert main([*arguments, "--device", "cuda"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_every_command_refuses_cuda_without_a_gpu_in_one_line(command, tiny_inputs, tmp_path, capsys):
    checkpoint, image = tiny_inputs
    arguments = [str(argument) for argument in _commands(checkpoint, image, tmp_path)[command]]
    assert main([*arguments, "--device", "cuda"]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "--device cuda: no CUDA GPU is available" in error, error
    assert not any(tmp_path.iterdir()), "nothing is written before the device is checked"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason=CUDA[1].kwargs["reason"])
def test_vit_b16_training_step_needs_no_more_memory_than_timms():
    """Peak GPU memory (torch.cuda.max_memory_allocated) of a bf16 ViT-B/16 training step at batch 64, AdamW, against
    timm's vit_base_patch16_224 holding the same weights: at most 5% more."""
    from vitkit.benchmark import timm_twin
    from vitkit.models import create_model
    from vitkit.runtime import autocast

    device = torch.device("cuda")
    ours = create_model("ViT-B/16")
    peaks = {}
    for name, model in (("vitkit", ours), ("timm", timm_twin(ours))):  # one model on the GPU at a time
        model = model.to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        images, labels = torch.randn(64, 3, 224, 224, device=device), torch.randint(0, 1000, (64,), device=device)
        for _ in range(2):  # the second step holds the optimiser's state too
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            with autocast(device, torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        peaks[name] = torch.cuda.max_memory_allocated(device)
        model.to("cpu")
        del optimizer, images, labels, loss
        torch.cuda.empty_cache()
    assert peaks["vitkit"] <= 1.05 * peaks["timm"], {name: f"{bytes / 2**20:.0f} MiB" for name, bytes in peaks.items()}
