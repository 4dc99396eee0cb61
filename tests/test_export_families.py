"""ONNX and OpenVINO export of the families of 2022-25: rotary embeddings (DINOv3's centred coordinates and
rotate-half pairs, EVA-02's index grid and interleaved pairs beside a learned table, PE's (x, y) + 1 grid under an
8-head attention pool, RoPE-ViT's learned mixed frequencies) and AIMv2's RMSNorm and SwiGLU: ONNX Runtime and
OpenVINO give PyTorch's logits at any batch. The image size is fixed at export (the batch axis is dynamic)."""

import numpy as np
import pytest
import torch
from interop_helpers import randomised

from vitkit.checkpoints import export
from vitkit.checkpoints.onnx import OPSET, OnnxModel
from vitkit.models import ViTConfig, create_model

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
}


def tiny(name):
    """A tiny model of the family with every weight random (LayerScale and heads included, so none hides)."""
    torch.manual_seed(0)
    model = randomised(MODELS[name](), std=0.2)
    torch.nn.init.normal_(model.head.weight)  # logits of about 1, which the comparisons' tolerance is for
    return model


def assert_runtime_gives_pytorchs_logits(run, model):
    for batch in (1, 3):
        images = torch.randn(batch, 3, 32, 48)
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
    assert [d.dim_param or d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim] == ["batch", 3, 32, 48]
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
