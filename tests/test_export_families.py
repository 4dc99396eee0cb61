"""ONNX and OpenVINO export of the families of 2022-25: rotary embeddings (DINOv3's centred coordinates and
rotate-half pairs, EVA-02's index grid and interleaved pairs beside a learned table, PE's (x, y) + 1 grid under an
8-head attention pool, RoPE-ViT's learned mixed frequencies), AIMv2's RMSNorm and SwiGLU, and position tables
resampled with antialias (timm's and SigLIP 2's way): ONNX Runtime and OpenVINO give PyTorch's logits at any batch
and any image size, the tables made in the graph for the input's grid; NaFlex graphs take patch batches of any
length with their mask."""

import numpy as np
import pytest
import torch
from interop_helpers import randomised

from vitkit.checkpoints import export
from vitkit.checkpoints.onnx import OPSET, OnnxModel
from vitkit.cli import main
from vitkit.models import ViTConfig, create_model
from vitkit.models.naflex import naflex_batch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

TINY = dict(image_size=(32, 48), patch_size=8, dim=64, depth=2, num_heads=4, mlp_dim=96, num_classes=7)
MODELS = {  # the families' own options on tiny sizes
    "DINOv3-S+/16": lambda: create_model("DINOv3-S+/16", **TINY),
    "EVA02-B/14": lambda: create_model("EVA02-B/14", **TINY),
    "PE-core-T/16": lambda: create_model("PE-core-T/16", **TINY),
    "AIMv2-L/14": lambda: create_model("AIMv2-L/14", **TINY),
    "RoPE-ViT mixed": lambda: create_model(ViTConfig(**TINY, rope="mixed", rope_theta=10.0, rope_xy=True,
                                                     pos_embed="none")),
    "SigLIP 2 table": lambda: create_model(ViTConfig(**TINY, class_token=False, pool="map", pos_interp="bilinear",
                                                     pos_interp_antialias=True)),
    "timm table": lambda: create_model(ViTConfig(**TINY, reg_tokens=2, pos_interp_antialias=True)),
    # TIPSv2 as transformers runs it: one register, LayerScale, a table without prefix rows resized bilinearly with
    # antialias
    "TIPSv2 table": lambda: create_model(ViTConfig(**TINY, reg_tokens=1, no_embed_class=True, layer_scale=1.0,
                                                   pos_interp="bilinear", pos_interp_antialias=True)),
    # C-RADIO: a table on its own grid, resized to a square of the input grid's longer side and cropped; a summary
    # of two class tokens under the head; no final norm
    "C-RADIO table": lambda: create_model(ViTConfig(**TINY, reg_tokens=3, no_embed_class=True, final_norm=False,
                                                    pos_interp="bilinear", pos_interp_align_corners=True,
                                                    pos_interp_crop=True, pos_grid=(9, 9), summary_tokens=(0, 2))),
}
SIZES = ((32, 48), (16, 24), (56, 32))  # the native size, one that shrinks the table (antialias acts), a taller one


def tiny(name):
    """A tiny model of the family with every weight random (LayerScale and heads included, so none hides)."""
    torch.manual_seed(0)
    model = randomised(MODELS[name](), std=0.2)
    torch.nn.init.normal_(model.head.weight)  # logits of about 1, which the comparisons' tolerance is for
    return model


def assert_runtime_gives_pytorchs_logits(run, model):
    for batch, size in zip((1, 3, 2), SIZES):
        images = torch.randn(batch, 3, *size)
        with torch.no_grad():
            expected = model(images)
        assert expected.abs().max() > 0.5  # the comparison is of real, non-zero logits
        torch.testing.assert_close(run(images), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_runtime_gives_pytorchs_logits(tmp_path, name):
    model = tiny(name)
    report = export(model, tmp_path / "m.onnx", "onnx")
    assert report.opset == OPSET and report.max_difference <= 1e-4
    graph = onnx.load(str(tmp_path / "m.onnx"))
    assert [o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]
    assert [d.dim_param or d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim] == ["batch", 3, "height", "width"]
    assert_runtime_gives_pytorchs_logits(OnnxModel(tmp_path / "m.onnx"), model)


@pytest.mark.parametrize("name", list(MODELS))
def test_openvino_gives_pytorchs_logits(tmp_path, name):
    pytest.importorskip("openvino")
    from vitkit.checkpoints.openvino import OpenVinoModel

    model = tiny(name)
    assert export(model, tmp_path / "m.xml", "openvino").max_difference <= 1e-4
    assert_runtime_gives_pytorchs_logits(OpenVinoModel(tmp_path / "m.xml"), model)


def test_rms_norm_is_written_as_opset_17_ops(tmp_path):
    """RMSNormalization is an op of opset 23: AIMv2's norms go out as x / sqrt(mean(x^2) + eps) * weight."""
    export(tiny("AIMv2-L/14"), tmp_path / "m.onnx", "onnx")
    ops = {node.op_type for node in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    assert "ReduceMean" in ops and "Sqrt" in ops and not ops & {"RMSNormalization", "LayerNormalization"}


def test_int8_runs_a_rope_model(tmp_path):
    """Smoke: the int8 weights of a rotary model run, their logits near fp32's (random weights, so no accuracy)."""
    model = tiny("EVA02-B/14")
    report = export(model, tmp_path / "q.onnx", "onnx", quantize="int8")
    graph = onnx.load(str(tmp_path / "q.onnx")).graph
    assert sum(node.op_type == "MatMulInteger" for node in graph.node) == 2 * 4 + 1  # qkv, proj, fc1, fc2; head
    images = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        expected = model(images).numpy()
    got = OnnxModel(tmp_path / "q.onnx")(images).numpy()
    assert 0 < report.quantized_difference and np.abs(got - expected).max() < 0.1 * np.abs(expected).max()


NAFLEX = ("SigLIP 2 table", "DINOv3-S+/16", "RoPE-ViT mixed", "timm table", "C-RADIO table")


def naflex_batches():
    """Batches of images of three aspect ratios at patch budgets the export's probes did not use."""
    images = [torch.randn(3, 20, 70), torch.randn(3, 64, 16), torch.randn(3, 40, 40)]
    return [naflex_batch(images[:count], 8, budget) for count, budget in ((3, 19), (2, 40), (1, 7))]


@pytest.mark.parametrize("name", NAFLEX)
def test_naflex_graphs_give_pytorchs_logits_at_any_patch_count(tmp_path, name):
    """SigLIP 2's bilinear antialiased table, DINOv3's centred rotary grid, learned mixed frequencies and [class]
    plus register tokens: each image's table made for its own grid inside the graph, padding masked."""
    pytest.importorskip("openvino")
    from vitkit.checkpoints.openvino import OpenVinoModel

    model = tiny(name)
    assert export(model, tmp_path / "m.onnx", "onnx", naflex=True).max_difference <= 1e-4
    assert export(model, tmp_path / "m.xml", "openvino", naflex=True).max_difference <= 1e-4
    for run in (OnnxModel(tmp_path / "m.onnx"), OpenVinoModel(tmp_path / "m.xml")):
        assert run.naflex
        for batch in naflex_batches():
            with torch.no_grad():
                expected = model(batch)
            assert expected.abs().max() > 0.5
            torch.testing.assert_close(run(batch), expected, atol=1e-4, rtol=0)
        with pytest.raises(ValueError, match="takes NaFlex batches"):
            run(torch.randn(1, 3, 32, 48))


def test_naflex_onnx_from_the_command_line(tmp_path, capsys):
    """`convert --naflex` writes a graph that `predict --max-patches` runs, and that refuses to run without it."""
    from PIL import Image

    tiny("SigLIP 2 table").save(tmp_path / "model")
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 70, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    assert main(["convert", str(tmp_path / "model"), str(tmp_path / "m.onnx"), "--to", "onnx", "--naflex"]) == 0
    assert "takes NaFlex batches" in capsys.readouterr().out
    for checkpoint in ("model", "m.onnx"):
        assert main(["predict", str(tmp_path / checkpoint), str(tmp_path / "a.png"), "--max-patches", "12"]) == 0
    native, exported = capsys.readouterr().out.strip().split("\n")
    assert native == exported  # the same top classes and probabilities, as printed
    assert main(["predict", str(tmp_path / "m.onnx"), str(tmp_path / "a.png")]) == 2
    assert "exported for NaFlex batches; pass --max-patches" in capsys.readouterr().err
