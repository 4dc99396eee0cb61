"""`vitkit bench` against references it does not compute: FLOPs counted by hand, peaks computed by hand from given
CPU features and clocks, a matrix product timed here, and no row above its peak (tiny model, few repeats)."""

import json

import pytest
import torch

from vitkit.benchmark import bench, timm_twin
from vitkit.cli import main
from vitkit.models import ViTConfig, VisionTransformer

pytest.importorskip("onnxruntime")
pytest.importorskip("timm")

TINY = dict(image_size=16, patch_size=4, dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)


def closed_form_flops(image: int, patch: int, dim: int, depth: int, mlp_dim: int, num_classes: int,
                      channels: int = 3) -> int:
    """2 x multiply-adds of a [class]-token ViT by hand: patch projection, per block qkv, q k^T, attention
    times v, output projection and the MLP, then the head."""
    patches = (image // patch) ** 2
    tokens = patches + 1
    block = 3 * tokens * dim * dim + 2 * tokens * tokens * dim + tokens * dim * dim + 2 * tokens * dim * mlp_dim
    return 2 * (patches * patch * patch * channels * dim + depth * block + dim * num_classes)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("bench") / "model"
    VisionTransformer(ViTConfig(**TINY)).save(checkpoint)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", str(checkpoint), "--batch-size", "4", "--runtimes", "eager", "onnxruntime", "timm",
                     "--repeats", "2", "--peak-size", "128", "--json"]) == 0
    return json.loads(out.getvalue())


def test_rows_cover_each_runtime_precision_and_phase(rows):
    kinds = {(r["runtime"], r["precision"], r["phase"]) for r in rows}
    expected = {("eager", "fp32", "inference"), ("eager", "fp32", "train_step"), ("timm", "fp32", "inference"),
                ("timm", "fp32", "train_step"), ("onnxruntime", "fp32", "inference"),
                ("onnxruntime", "int8+fp32", "inference")}  # dynamic int8: the attention products stay fp32
    assert expected <= kinds
    low = {precision for _, precision, _ in kinds} - {"fp32", "int8+fp32"}
    from vitkit.benchmark import low_precision

    native = low_precision(torch.device("cpu"))
    assert low == (set() if native is None else {"bf16"})  # bf16 rows only where the CPU runs it natively
    assert len(kinds) == len(rows)
    for row in rows:
        assert {"runtime", "precision", "images_per_s", "gflops_per_s", "peak_gflops_per_s"} <= set(row)


def test_a_rows_flops_are_the_hand_counted_flops_of_the_model(rows):
    per_image = closed_form_flops(16, 4, 32, 2, 64, 10)
    assert per_image == 2 * (16 * 48 * 32 + 2 * (17 * (3 + 1) * 32 * 32 + 2 * 17 * 17 * 32 + 2 * 17 * 32 * 64)
                             + 32 * 10) == 680832  # 2 x (params of each matrix x the tokens through it + attention)
    for row in rows:
        passes = 3 if row["phase"] == "train_step" else 1  # forward + backward (twice the forward)
        assert row["gflops_per_s"] * row["median_s"] / 4 * 1e9 == pytest.approx(per_image * passes, rel=1e-6)
        assert row["peak_memory_mib"] is None  # the CPU: torch does not track it


def test_no_row_is_above_its_peak_and_the_spread_holds_the_median(rows):
    for row in rows:
        assert row["gflops_per_s"] <= 1.15 * row["peak_gflops_per_s"], row
        assert row["peak_source"].startswith(("computed: ", "measured: ")), row
        assert row["slowest_images_per_s"] <= row["images_per_s"] <= row["fastest_images_per_s"]
        assert row["repeats"] == 2
        if row["runtime"] == "timm" and row["precision"] == "fp32":
            assert row["speedup_vs_timm"] == 1.0


@pytest.mark.parametrize("precision, flags, expected, how", [
    ("bf16", {"avx512f", "avx512_bf16", "amx_bf16"}, 1024 * 2 * 3.0, "AMX-BF16 1024 FLOP/cycle x 2 cores x 3.00 GHz"),
    ("int8", {"avx512f", "avx512_vnni", "amx_int8"}, 2048 * 2 * 3.0, "AMX-INT8 2048 OP/cycle x 2 cores x 3.00 GHz"),
    ("bf16", {"avx512f", "avx512_bf16"}, 128 * 2 * 3.0, "AVX-512 BF16 128 FLOP/cycle x 2 cores x 3.00 GHz"),
    ("int8", {"avx512f", "avx512bw", "avx512_vnni"}, 256 * 2 * 3.0, "AVX-512 VNNI 256 OP/cycle x 2 cores x 3.00 GHz"),
    ("fp32", {"avx2", "fma"}, 32 * 2 * 3.0, "AVX2 FMA fp32 32 FLOP/cycle x 2 cores x 3.00 GHz"),
    # a Zen-class AVX2 CPU without VNNI: int8 by vpmaddubsw, bf16 computed in fp32
    ("int8", {"avx2", "fma"}, 64 * 2 * 3.0, "AVX2 u8s8 vpmaddubsw 64 OP/cycle x 2 cores x 3.00 GHz"),
    ("bf16", {"avx2", "fma"}, 32 * 2 * 3.0, "AVX2 FMA fp32 32 FLOP/cycle x 2 cores x 3.00 GHz"),
    ("fp32", {"avx512f", "avx2", "fma"}, 64 * 2 * 3.0, "AVX-512 FMA fp32 64 FLOP/cycle x 2 cores x 3.00 GHz"),
])
def test_the_computed_peak_is_the_hand_computed_one(precision, flags, expected, how):
    from vitkit.peaks import computed_cpu_peak

    assert computed_cpu_peak(precision, frozenset(flags), 2, 3.0) == (pytest.approx(expected), how)


def test_the_clock_is_read_from_cpufreq_else_proc_cpuinfo(tmp_path):
    from vitkit.peaks import cpu_clock_ghz

    freq, info = tmp_path / "cpuinfo_max_freq", tmp_path / "cpuinfo"
    info.write_text("model name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\ncpu MHz\t\t: 2599.998\nflags\t: fpu\n")
    assert cpu_clock_ghz(freq, info) == pytest.approx(2.599998)  # no cpufreq: the larger of the two
    freq.write_text("3500000\n")  # kHz
    assert cpu_clock_ghz(freq, info) == 3.5
    assert cpu_clock_ghz(tmp_path / "none", tmp_path / "neither") is None


def test_a_measurement_that_falls_short_gives_way_to_the_computed_peak(monkeypatch):
    """The AVX2 CPU where torch's int8 product ran at 1.1 GOP/s: the peak is the computed 384, so a row at 60 is
    16% of it, not 5488%; a measurement above the computed figure (a clock read low) is the peak instead."""
    from vitkit import peaks

    monkeypatch.setattr(peaks, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(peaks, "cpu_clock_ghz", lambda: 3.0)
    monkeypatch.setattr(peaks, "cpu_cores", lambda: 2)
    monkeypatch.setattr(peaks, "measured_peak", lambda precision, device, size: (1.1, "torch._int_mm 256^3"))
    peak = peaks.hardware_peak("int8", torch.device("cpu"))
    assert (peak.gflops, peak.how, peak.measured_gflops) == (
        pytest.approx(384.0), "computed: AVX2 u8s8 vpmaddubsw 64 OP/cycle x 2 cores x 3.00 GHz", 1.1)
    monkeypatch.setattr(peaks, "measured_peak", lambda precision, device, size: (400.0, "torch.mm 2048^3"))
    assert peaks.hardware_peak("fp32", torch.device("cpu")) == peaks.Peak(400.0, "measured: torch.mm 2048^3", 400.0)


def test_the_measured_gemm_rate_matches_a_matrix_product_timed_here():
    """The fastest of a few 256-square fp32 products timed in this test, against what the bench measures with
    products of at most that size: the same rate within the noise of a shared machine."""
    import time

    from vitkit.peaks import measured_peak

    a = torch.randn(256, 256)
    torch.mm(a, a)
    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        torch.mm(a, a)
        best = min(best, time.perf_counter() - start)
    ours = 2 * 256 ** 3 / best / 1e9
    theirs, how = measured_peak("fp32", torch.device("cpu"), 256)
    assert how == "torch.mm (oneDNN/MKL) 256^3"
    assert 0.5 * ours < theirs < 2 * ours, (theirs, ours)


def test_an_int8_peak_is_the_fastest_kernel_at_hand():
    from vitkit.peaks import gemm_kernels, measured_peak

    kernels = gemm_kernels("int8", torch.device("cpu"))
    assert set(kernels) == {"torch._int_mm", "ONNX Runtime MatMulInteger"}
    rate, how = measured_peak("int8", torch.device("cpu"), 128)
    assert rate > 0 and how.endswith(" 128^3") and how.split(" 128^3")[0] in kernels


def test_the_datasheet_names_the_gpu_in_the_table():
    from vitkit.peaks import gpu_datasheet

    assert gpu_datasheet("NVIDIA H100 80GB HBM3", "bf16") == 989.0  # SXM
    assert gpu_datasheet("NVIDIA H100 PCIe", "bf16") == 756.0
    assert gpu_datasheet("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert gpu_datasheet("NVIDIA L4", "bf16") == 121.0
    assert gpu_datasheet("NVIDIA GeForce GTX 1080", "bf16") is None


@pytest.mark.parametrize("times, repeats", [([1.0, 1.05, 1.02], 3),  # settled: 3 repeats
                                            ([1.0, 2.0, 1.0, 1.9, 1.0, 2.1, 1.0, 2.0, 1.0], 9)])  # never settles
def test_default_repeats_stop_once_the_spread_is_small(monkeypatch, times, repeats):
    import vitkit.benchmark as benchmark
    from vitkit.peaks import Peak

    script = iter([seconds for seconds in times for _ in range(2)])  # each repeat: inference, training step
    monkeypatch.setattr(benchmark, "timed", lambda step, device: next(script))
    monkeypatch.setattr(benchmark, "hardware_peak", lambda dtype, device, size: Peak(100.0, "computed: test", 50.0))
    model = VisionTransformer(ViTConfig(**TINY))
    rows, _ = bench(model, batch_size=2, runtimes=("eager",), precisions=["fp32"], warmup=0)
    for row in rows:
        assert row.repeats == repeats
        assert (row.slowest_images_per_s, row.images_per_s, row.fastest_images_per_s) == pytest.approx(
            (2 / max(times), 2 / sorted(times)[len(times) // 2], 2 / min(times)))
        assert (row.peak_gflops_per_s, row.peak_source, row.gemm_gflops_per_s) == (100.0, "computed: test", 50.0)
    script = iter([1.0] * 10)
    rows, _ = bench(model, batch_size=2, runtimes=("eager",), precisions=["fp32"], warmup=0, repeats=5)
    assert [row.repeats for row in rows] == [5, 5]  # asked for: as many, however settled


def test_timm_twin_holds_the_same_weights():
    model = VisionTransformer(ViTConfig(**TINY)).eval()
    torch.nn.init.normal_(model.head.weight)
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(timm_twin(model).eval()(images), model(images), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(rope="axial", rope_grid="centered", rope_half=True, pos_embed="none",
                                          reg_tokens=4, layer_scale=1e-5, ln_eps=1e-5, qkv_bias=False),  # DINOv3's
                                     dict(rope="mixed", rope_xy=True, pos_embed="none", layer_scale=1e-5),
                                     dict(norm="rms", ln_eps=1e-5, patch_norm=True, mlp="swiglu", proj_bias=False,
                                          qkv_bias=False, class_token=False, pool="gap",
                                          pos_interp_antialias=True)])  # AIMv2's, resampled as timm does
def test_the_twin_of_a_rotary_or_rms_model_is_timms_own_model_with_its_weights(options):
    """`vitkit bench --runtimes timm` compares a DINOv3, RoPE-ViT or AIMv2 model with timm's Eva (or AIMv2 ViT)
    built by timm from vitkit's timm export: the same outputs."""
    model = VisionTransformer(ViTConfig(**{**TINY, **options})).eval()
    torch.nn.init.normal_(model.head.weight)
    images = torch.randn(3, 3, 16, 24)
    twin = timm_twin(model)
    assert type(twin).__name__ == ("VisionTransformer" if "norm" in options else "Eva")
    with torch.no_grad():
        torch.testing.assert_close(twin(images), model(images), atol=1e-5, rtol=0)


def test_what_cannot_run_is_skipped_with_the_reason():
    model = VisionTransformer(ViTConfig(**TINY, gelu="tanh"))
    rows, skipped = bench(model, batch_size=2, runtimes=("eager", "timm"), precisions=["fp32"], repeats=1,
                          warmup=1, peak_size=64)
    assert {(r.runtime, r.phase) for r in rows} == {("eager", "inference"), ("eager", "train_step")}
    assert "exact GELU" in skipped["timm"]
    with pytest.raises(ValueError, match="unknown runtimes \\['tensorrt'\\]"):
        bench(model, runtimes=("tensorrt",))


def test_one_formatting_for_the_terminal_and_the_markdown_tables():
    from vitkit.benchmark import TABLE_HEADER, Row

    row = Row("onnxruntime", "int8", "inference", 4, images_per_s=123.456, gflops_per_s=7.04, peak_gflops_per_s=88.0,
              fraction_of_peak=0.08, peak_memory_mib=None, median_s=0.0324, speedup_vs_timm=1.5,
              slowest_images_per_s=101.26, fastest_images_per_s=130.0)
    assert row.cells() == ["onnxruntime", "int8", "inference", "123.5", "101.3-130.0", "7.0", "88.0", "8%", "-",
                           "1.50x"]
    assert len(row.cells()) == len(TABLE_HEADER)


def test_one_peak_line_per_precision_of_the_products():
    from vitkit.benchmark import Row, peak_notes

    def row(runtime, precision, peak):
        return Row(runtime, precision, "inference", 4, 1.0, 1.0, peak, 0.1, None, 1.0, peak_source="computed: x",
                   gemm_gflops_per_s=peak / 2)

    rows = [row("eager", "fp32", 300.0), row("onnxruntime", "int8+fp32", 800.0), row("openvino", "int8+bf16", 800.0),
            row("openvino", "bf16", 500.0)]
    assert peak_notes(rows) == ["peak fp32: 300.0 GFLOP/s, computed: x; a matrix product reached 150.0 here",
                                "peak int8: 800.0 GFLOP/s, computed: x; a matrix product reached 400.0 here",
                                "peak bf16: 500.0 GFLOP/s, computed: x; a matrix product reached 250.0 here"]


def test_openvino_row_runs_the_models_weights(tmp_path):
    pytest.importorskip("openvino")
    from vitkit.benchmark import candidates

    model = VisionTransformer(ViTConfig(**TINY)).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would make every logit 0
    images = torch.randn(3, 3, 16, 16)
    found, skipped = candidates(model, images, torch.zeros(3, dtype=torch.long), ["openvino"], ["fp32"], tmp_path)
    assert skipped == {} and [(c.runtime, c.precision, c.phase) for c in found] == [("openvino", "fp32", "inference")]
    with torch.no_grad():
        expected = model(images)
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(found[0].step(), expected, atol=1e-4, rtol=0)
    rows, skipped = bench(model, batch_size=2, runtimes=("openvino",), precisions=["fp32"], repeats=1, warmup=1,
                          peak_size=64)
    assert [(r.runtime, r.precision, r.phase) for r in rows] == [("openvino", "fp32", "inference")]
    assert rows[0].images_per_s > 0


def test_the_model_is_traced_once_for_every_onnx_and_openvino_row(tmp_path, monkeypatch):
    """fp32 and int8 ONNX Runtime and OpenVINO (static int8, calibrated on the timed images) all start from one
    trace (counted on torch's own exporter)."""
    pytest.importorskip("openvino")
    from vitkit.benchmark import candidates

    traces = []
    export = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *args, **kwargs: traces.append(1) or export(*args, **kwargs))
    model = VisionTransformer(ViTConfig(**TINY)).eval()
    torch.nn.init.normal_(model.head.weight)
    images = torch.randn(3, 3, 16, 16)
    found, skipped = candidates(model, images, torch.zeros(3, dtype=torch.long), ["onnxruntime", "openvino"],
                                ["fp32", "int8"], tmp_path)
    assert len(traces) == 1 and skipped == {}
    rows = {(c.runtime, c.peak_dtype): c for c in found}
    assert set(rows) == {("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("openvino", "fp32"), ("openvino", "int8")}
    assert rows["onnxruntime", "int8"].precision == "int8+fp32" and rows["openvino", "int8"].precision.startswith("int8")
    with torch.no_grad():
        expected = model(images)
    for runtime in ("onnxruntime", "openvino"):
        torch.testing.assert_close(rows[runtime, "fp32"].step(), expected, atol=1e-4, rtol=0)
        int8 = rows[runtime, "int8"].step()  # the static int8 graph keeps most top-1 classes of the random model
        assert int8.shape == expected.shape and (int8.argmax(-1) == expected.argmax(-1)).float().mean() >= 2 / 3


def test_rope_families_run_against_the_timm_model_given_compiled_against_compiled(tmp_path, monkeypatch):
    """A DINOv3 read from timm's hub directory is timed against that timm Eva (``twin``). With scripted times
    (each repeat: the inference steps of eager, compile, timm, timm-compile, then their
    training steps; every other repeat in reverse), eager rows are measured against timm eager and compiled rows
    against timm compiled."""
    import timm
    from timm.models._hub import save_for_hf

    import vitkit
    import vitkit.benchmark as benchmark

    theirs = timm.create_model("vit_small_patch16_dinov3", img_size=32, patch_size=8, embed_dim=32, depth=1,
                               num_heads=2, num_classes=3).eval()
    save_for_hf(theirs, str(tmp_path / "hub"))
    model = vitkit.load(tmp_path / "hub", image_size=32)
    forward = [2.0, 1.0, 4.0, 0.5, 6.0, 3.0, 12.0, 1.5]  # eager, compile, timm, timm-compile x 2 phases
    script = iter(forward + forward[::-1] + forward)
    monkeypatch.setattr(benchmark, "timed", lambda step, device: next(script))
    monkeypatch.setattr(benchmark, "hardware_peak", lambda dtype, device, size: benchmark.Peak(1.0, "test", 1.0))
    monkeypatch.setattr(torch, "compile", lambda module: module)  # compiling is not what is tested here
    rows, skipped = bench(model, batch_size=2, runtimes=("eager", "compile", "timm", "timm-compile"),
                          precisions=["fp32"], repeats=3, warmup=1, peak_size=64, twin=theirs)
    assert skipped == {}
    speed = {(r.runtime, r.phase): r.speedup_vs_timm for r in rows}
    assert speed == {("eager", "inference"): 2.0, ("eager", "train_step"): 2.0,  # 4 / 2, 12 / 6
                     ("compile", "inference"): 0.5, ("compile", "train_step"): 0.5,  # 0.5 / 1, 1.5 / 3
                     ("timm", "inference"): 1.0, ("timm", "train_step"): 1.0,
                     ("timm-compile", "inference"): 8.0, ("timm-compile", "train_step"): 8.0}  # 4 / 0.5


@pytest.mark.parametrize("options", [dict(reg_tokens=1, layer_scale=1e-5),  # TIPSv2's registers and LayerScale
                                     dict(reg_tokens=3, final_norm=False)])  # C-RADIO's tokens, no final norm
def test_the_twin_of_a_vit_with_registers_or_layer_scale_is_timms_vit(options):
    """`vitkit bench --runtimes timm` holds TIPSv2 and C-RADIO-shaped models in timm's own VisionTransformer
    (registers, init_values, final_norm): the same outputs."""
    model = VisionTransformer(ViTConfig(**{**TINY, **options})).eval()
    torch.nn.init.normal_(model.head.weight)
    for block in model.blocks:
        for parameter in (block.ls1, block.ls2) if options.get("layer_scale") else ():
            torch.nn.init.normal_(parameter.gamma)
    images = torch.randn(3, 3, 16, 16)
    twin = timm_twin(model)
    assert type(twin).__name__ == "VisionTransformer"
    with torch.no_grad():
        torch.testing.assert_close(twin(images), model(images), atol=1e-5, rtol=1e-5)
