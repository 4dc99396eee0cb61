"""Static int8 exports (ONNX Runtime QDQ, OpenVINO NNCF) calibrated on a dataset, the precision each graph or runtime
reports it ran, and the refusals of int8 requests an export cannot meet."""

import importlib.util
import json

import numpy as np
import pytest
import torch

from vitkit.checkpoints import export
from vitkit.checkpoints.quantize import onnx_precision
from vitkit.cli import main
from vitkit.errors import ConfigError, DatasetError, FormatError
from vitkit.evaluate.calibration import calibration_batches
from vitkit.models import Provenance, ViTConfig, VisionTransformer
from vitkit.runtime import native_bf16

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402


def small_model(channels: int = 1, classes: int = 10, **changes) -> VisionTransformer:
    config = ViTConfig(image_size=16, patch_size=4, dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=classes,
                       in_chans=channels, provenance=Provenance(normalization="imagenet"), **changes)
    model = VisionTransformer(config).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would make every logit 0
    return model


def product_graph(kinds: list[str]):
    """A hand-made graph of one product per entry of ``kinds``: 'fp32' a MatMul of two plain inputs, 'int8' a
    MatMulInteger, 'qdq' a MatMul of two DequantizeLinear outputs (static int8 in QDQ form)."""
    nodes, inputs, initializers = [], [], []
    for index, kind in enumerate(kinds):
        a, b, out = f"a{index}", f"b{index}", f"y{index}"
        if kind == "qdq":
            initializers += [helper.make_tensor(f"s{index}", TensorProto.FLOAT, [], [0.1]),
                             helper.make_tensor(f"w{index}", TensorProto.INT8, [2, 2], [1, 2, 3, 4])]
            nodes += [helper.make_node("DequantizeLinear", [a, f"s{index}"], [f"da{index}"]),
                      helper.make_node("DequantizeLinear", [f"w{index}", f"s{index}"], [f"dw{index}"]),
                      helper.make_node("MatMul", [f"da{index}", f"dw{index}"], [out])]
            inputs.append(helper.make_tensor_value_info(a, TensorProto.INT8, [2, 2]))
            continue
        op, dtype = ("MatMulInteger", TensorProto.UINT8) if kind == "int8" else ("MatMul", TensorProto.FLOAT)
        nodes.append(helper.make_node(op, [a, b], [out]))
        inputs += [helper.make_tensor_value_info(name, dtype, [2, 2]) for name in (a, b)]
    outputs = [helper.make_tensor_value_info(f"y{index}", TensorProto.FLOAT, None) for index in range(len(kinds))]
    return helper.make_model(helper.make_graph(nodes, "products", inputs, outputs, initializers))


@pytest.mark.parametrize("kinds, expected", [(["fp32"], "fp32"), (["int8"], "int8"), (["qdq"], "int8"),
                                             (["int8", "qdq", "fp32"], "int8+fp32"),
                                             (["fp32", "fp32", "qdq"], "fp32+int8")])
def test_onnx_precision_reads_the_products_types(kinds, expected):
    assert onnx_precision(product_graph(kinds)) == expected


def digits_batches(model: VisionTransformer, images: int = 32) -> list[np.ndarray]:
    return calibration_batches(model.config, "digits", images)


def test_calibration_is_a_seeded_sample_through_the_eval_preprocessing():
    model = small_model()
    batches = digits_batches(model, 20)
    assert [b.shape for b in batches] == [(16, 1, 16, 16), (4, 1, 16, 16)]
    assert all(b.dtype == np.float32 for b in batches)
    again = digits_batches(model, 20)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    (mean,), (std,) = model.config.input_statistics  # the checkpoint's normalisation: black is -mean / std
    assert np.isclose(np.concatenate(batches).min(), -mean / std, atol=1e-5)
    assert not np.array_equal(batches[0], calibration_batches(model.config, "digits", 20, seed=1)[0])


def test_static_onnx_int8_is_qdq_with_per_channel_weights_and_says_so(tmp_path):
    from vitkit.checkpoints.onnx import OnnxModel

    model = small_model()
    report = export(model, tmp_path / "s.onnx", "onnx", quantize="int8", calibration=digits_batches(model))
    graph = onnx.load(str(tmp_path / "s.onnx"))
    ops = [node.op_type for node in graph.graph.node]
    assert "QuantizeLinear" in ops and "DynamicQuantizeLinear" not in ops and "MatMulInteger" not in ops
    int8_weights = [t for t in graph.graph.initializer if t.data_type == TensorProto.INT8 and len(t.dims) == 2]
    assert len(int8_weights) == 2 * 4 + 1  # per block qkv, proj, fc1, fc2; the head
    scales = {t.name: t for t in graph.graph.initializer}
    weight_scales = [scales[node.input[1]] for node in graph.graph.node
                     if node.op_type == "DequantizeLinear" and node.input[0] in {t.name for t in int8_weights}]
    assert len(weight_scales) == 9 and all(len(s.dims) == 1 and s.dims[0] > 1 for s in weight_scales)  # per channel
    # the 2 x 2 attention products (q k^T, attention x v) stay fp32: 9 int8 linear layers + the patch conv
    assert report.precision == OnnxModel(tmp_path / "s.onnx").precision == "int8+fp32"
    assert json.loads(dict((e.key, e.value) for e in graph.metadata_props)["vitkit.config"])["in_chans"] == 1


def test_every_int8_export_keeps_its_weights_to_7_bits(tmp_path):
    """Weights within [-64, 64], so that AVX2's vpmaddubsw (u8 x s8, pairs summed in 16 bits: 2 x 255 x 64 <
    32767) cannot saturate on CPUs without VNNI or AMX, whichever CPU wrote the file."""
    from onnx import numpy_helper

    model = small_model()
    export(model, tmp_path / "static.onnx", "onnx", quantize="int8", calibration=digits_batches(model))
    export(model, tmp_path / "dynamic.onnx", "onnx", quantize="int8")
    weights = {}
    for name in ("static.onnx", "dynamic.onnx"):
        graph = onnx.load(str(tmp_path / name))
        weights[name] = [numpy_helper.to_array(t) for t in graph.graph.initializer
                         if t.data_type == TensorProto.INT8 and len(t.dims) >= 2]
    if importlib.util.find_spec("openvino") and importlib.util.find_spec("nncf"):
        import openvino

        export(model, tmp_path / "q.xml", "openvino", quantize="int8", calibration=digits_batches(model, 8))
        weights["q.xml"] = [op.get_data() for op in openvino.Core().read_model(tmp_path / "q.xml").get_ops()
                            if op.get_type_name() == "Constant" and op.get_element_type() == openvino.Type.i8]
    for name, found in weights.items():
        assert len(found) == 2 * 4 + 2, name  # per block qkv, proj, fc1, fc2; the head; the patch embedding
        assert max(np.abs(w.astype(np.int32)).max() for w in found) == 64, name  # the 7-bit range, used


def test_openvino_reports_the_precision_its_plugin_runs(tmp_path):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    from vitkit.checkpoints.openvino import OpenVinoModel

    model = small_model()
    export(model, tmp_path / "f.xml", "openvino")
    assert OpenVinoModel(tmp_path / "f.xml", torch.float32).precision == "fp32"
    report = export(model, tmp_path / "q.xml", "openvino", quantize="int8", calibration=digits_batches(model, 8))
    assert report.max_difference <= 1e-4 and report.quantized_agreement is not None
    assert OpenVinoModel(tmp_path / "q.xml", torch.float32).precision.startswith("int8")
    if native_bf16(torch.device("cpu")):
        assert OpenVinoModel(tmp_path / "f.xml", torch.bfloat16).precision == "bf16"
        assert OpenVinoModel(tmp_path / "q.xml", torch.bfloat16).precision == "int8+bf16"


def test_int8_requests_an_export_cannot_meet_are_refused(tmp_path):
    model = small_model()
    batches = digits_batches(model, 4)
    with pytest.raises(FormatError, match=r"x: quantize='int8' applies to ONNX and OpenVINO exports, not to 'native'"):
        export(model, tmp_path / "x", "native", quantize="int8")
    with pytest.raises(FormatError, match=r"t\.safetensors: calibration images apply to ONNX and OpenVINO exports"):
        export(model, tmp_path / "t.safetensors", "timm", calibration=batches)
    with pytest.raises(ConfigError, match=r"c\.onnx: calibration images apply to int8 quantisation"):
        export(model, tmp_path / "c.onnx", "onnx", calibration=batches)
    with pytest.raises(ConfigError, match=r"o\.xml: int8 OpenVINO export is static and needs calibration images"):
        export(model, tmp_path / "o.xml", "openvino", quantize="int8")
    with pytest.raises(ConfigError, match=r"calibration batch of shape \[4, 1, 16, 16\]; expected \(batch, 3, H, W\)"):
        export(small_model(channels=3), tmp_path / "m.onnx", "onnx", quantize="int8", calibration=batches)
    with pytest.raises(ConfigError, match="static int8 calibrates graphs of image tensors, not a NaFlex graph"):
        export(model, tmp_path / "n.onnx", "onnx", quantize="int8", naflex=True, calibration=batches)
    assert list(tmp_path.iterdir()) == []


def test_a_calibration_dataset_that_does_not_fit_the_model_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"--calibration digits \(train split\): 10 classes, but the model "
                                          r"predicts 7"):
        calibration_batches(small_model(classes=7).config, "digits")
    with pytest.raises(ConfigError, match=r"--calibration digits \(train split\): 1294 images, fewer than the "
                                          r"5000 asked for; pass --calibration-size 1294 or less"):
        calibration_batches(small_model().config, "digits", 5000)
    colour = tmp_path / "colour.npz"
    np.savez(colour, x_train=np.zeros((4, 8, 8, 2), np.uint8), y_train=np.arange(4) % 2,
             x_test=np.zeros((2, 8, 8, 2), np.uint8), y_test=np.arange(2))
    with pytest.raises(DatasetError, match="cannot turn a 2-channel image into 3 channels"):
        calibration_batches(small_model(channels=3, classes=2).config, f"npz:{colour}", 4)


@pytest.mark.parametrize("argv, message", [
    (["m.safetensors", "--quantize", "int8"], "quantize='int8' applies to ONNX and OpenVINO exports, not to 'timm'"),
    (["folder", "--quantize", "int8", "--calibration", "digits"], "not to 'native'"),
    (["m.onnx", "--calibration", "digits"], "calibration images apply to int8 quantisation"),
    (["m.xml", "--quantize", "int8"], "int8 OpenVINO export is static and needs calibration images"),
    (["m.onnx", "--quantize", "int8", "--calibration", "digits", "--calibration-size", "9999"],
     "1294 images, fewer than the 9999 asked for")])
def test_the_cli_refuses_in_one_line(tmp_path, capsys, argv, message):
    small_model().save(tmp_path / "model")
    capsys.readouterr()
    code = main(["convert", str(tmp_path / "model"), str(tmp_path / argv[0]), *argv[1:]])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.slow  # trains a model: about a minute on 2 cores
def test_static_int8_keeps_trained_digits_accuracy_within_one_point(tmp_path):
    """A small digits model trained here: static int8 ONNX (QDQ) and OpenVINO (NNCF), calibrated on the train
    split, within 1 point of the fp32 checkpoint on the test split."""
    run = tmp_path / "run"
    assert main(["train", "--steps", "300", "--batch-size", "64", "--warmup-steps", "30", "--lr", "0.003",
                 "--model-args", '{"dim": 32, "mlp_dim": 64, "depth": 2}', "--run-dir", str(run),
                 "--log-every", "300"]) == 0
    names = ["model", "static.onnx"]
    assert main(["convert", str(run / "model"), str(tmp_path / "static.onnx"), "--quantize", "int8",
                 "--calibration", "digits"]) == 0
    if all(importlib.util.find_spec(name) for name in ("nncf", "openvino")):
        assert main(["convert", str(run / "model"), str(tmp_path / "int8.xml"), "--quantize", "int8",
                     "--calibration", "digits", "--calibration-size", "128"]) == 0
        names.append("int8.xml")
    top1 = {}
    for name in names:
        path, out = run / name if name == "model" else tmp_path / name, tmp_path / name.replace(".", "-")
        assert main(["eval", str(path), "--dataset", "digits", "--out", str(out)]) == 0
        top1[name] = json.loads((out / "eval-test.json").read_text())["top1"]
    assert top1["model"] > 0.6, top1  # learned something: the comparison means something
    assert all(abs(value - top1["model"]) <= 0.01 for value in top1.values()), top1
