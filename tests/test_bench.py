"""`vitkit bench`: the rows' structure and internal consistency (not a timed test: tiny model, few repeats)."""

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


def test_rows_are_internally_consistent(rows):
    per_image = closed_form_flops(16, 4, 32, 2, 64, 10)
    peaks = {}
    for row in rows:
        assert row["batch_size"] == 4 and row["median_s"] > 0
        assert row["images_per_s"] == pytest.approx(4 / row["median_s"])
        passes = 3 if row["phase"] == "train_step" else 1
        assert row["gflops_per_s"] == pytest.approx(row["images_per_s"] * per_image * passes / 1e9)
        assert row["fraction_of_peak"] == pytest.approx(row["gflops_per_s"] / row["peak_gflops_per_s"])
        assert row["peak_memory_mib"] is None  # the CPU: torch does not track it
        peaks.setdefault(row["precision"], set()).add(row["peak_gflops_per_s"])
        if row["runtime"] == "timm" and row["precision"] == "fp32":
            assert row["speedup_vs_timm"] == 1.0
        else:
            assert row["speedup_vs_timm"] > 0
    assert all(len(values) == 1 for values in peaks.values())  # one measured GEMM peak per dtype


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
              fraction_of_peak=0.08, peak_memory_mib=None, median_s=0.0324, speedup_vs_timm=1.5)
    assert row.cells() == ["onnxruntime", "int8", "inference", "123.5", "7.0", "88.0", "8%", "-", "1.50x"]
    assert len(row.cells()) == len(TABLE_HEADER)


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
    """fp32 and int8 ONNX Runtime and OpenVINO all start from one trace (counted on torch's own exporter)."""
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
    rows = {(c.runtime, c.precision): c.step for c in found}
    assert set(rows) == {("onnxruntime", "fp32"), ("onnxruntime", "int8+fp32"), ("openvino", "fp32")}
    with torch.no_grad():
        expected = model(images)
    for runtime in ("onnxruntime", "openvino"):
        torch.testing.assert_close(rows[runtime, "fp32"](), expected, atol=1e-4, rtol=0)
    assert rows["onnxruntime", "int8+fp32"]().shape == expected.shape


def test_rope_families_run_against_the_timm_model_given_compiled_against_compiled(tmp_path, monkeypatch):
    """A DINOv3 read from timm's hub directory is timed against that timm Eva (``twin``). With scripted times
    (each repeat: the GEMM peak, then the inference steps of eager, compile, timm, timm-compile, then their
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
    forward = [1.0, 2.0, 1.0, 4.0, 0.5, 6.0, 3.0, 12.0, 1.5]  # peak; eager, compile, timm, timm-compile x 2 phases
    script = iter(forward + forward[:1] + forward[:0:-1] + forward)
    monkeypatch.setattr(benchmark, "timed", lambda step, device: next(script))
    monkeypatch.setattr(torch, "compile", lambda module: module)  # compiling is not what is tested here
    rows, skipped = bench(model, batch_size=2, runtimes=("eager", "compile", "timm", "timm-compile"),
                          precisions=["fp32"], repeats=3, warmup=1, peak_size=64, twin=theirs)
    assert skipped == {}
    speed = {(r.runtime, r.phase): r.speedup_vs_timm for r in rows}
    assert speed == {("eager", "inference"): 2.0, ("eager", "train_step"): 2.0,  # 4 / 2, 12 / 6
                     ("compile", "inference"): 0.5, ("compile", "train_step"): 0.5,  # 0.5 / 1, 1.5 / 3
                     ("timm", "inference"): 1.0, ("timm", "train_step"): 1.0,
                     ("timm-compile", "inference"): 8.0, ("timm-compile", "train_step"): 8.0}  # 4 / 0.5
