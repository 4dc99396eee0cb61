"""Static int8: an exported graph's matrix products in int8 with activation scales calibrated on real images,
for ONNX Runtime (QDQ) and OpenVINO (NNCF). The calibration images come as batches of model inputs (the
checkpoint's evaluation preprocessing already applied; ``vitkit.evaluate.calibration`` reads them from a dataset).

What each graph computes in is read back from the graph itself (ONNX: which products take int8 operands) or from
the runtime (OpenVINO: the precision each compiled layer runs in), so that a benchmark or a report says what ran,
not what was asked for.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import ConfigError

# The CPU flags of int8 dot-product instructions (VNNI, AMX). Without them u8 x s8 products go through AVX2's
# vpmaddubsw, whose 16-bit intermediate sums saturate unless the weights use 7 bits: int8 exports keep their weights
# to 7 bits (ONNX Runtime's reduce_range, NNCF's overflow fix), so that one file computes right on every x86 CPU
# (ViT-S/16 on OpenVINO, AVX2 kernels: 9 of 16 top-1 classes kept with 8-bit weights, 16 with 7).
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
# ONNX ops whose products a static int8 graph computes in int8: every MatMul with a constant weight (the linear
# layers), the patch embedding's Conv and any Gemm. The attention products (activation x activation) stay in fp32.
ONNX_INT8_OPS = ("MatMul", "Gemm", "Conv")
_INT8_PRODUCTS = {"MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "ConvInteger",
                  "QLinearConv", "QGemm"}
_PRODUCTS = {"MatMul", "Gemm", "Conv", "FusedMatMul", "FusedGemm"}
QUANTIZATIONS = ("int8",)
OPENVINO_PRECISIONS = {"u8": "int8", "i8": "int8", "f32": "fp32", "bf16": "bf16", "f16": "fp16"}
OPENVINO_PRODUCTS = {"FullyConnected", "MatMul", "Convolution", "ScaledAttn"}


def check_quantize(quantize: str | None, calibration: Sequence[np.ndarray] | None, channels: int, naflex: bool,
                   where: str, needs_calibration: bool = False) -> None:
    """Refuse a quantisation the export cannot make: an unknown one, calibration images without int8 or for a
    NaFlex graph, none where the runtime needs them (``needs_calibration``), or batches that are not the model's
    images."""
    if quantize not in (None, *QUANTIZATIONS):
        raise ConfigError(f"{where}: quantize={quantize!r}; expected one of {QUANTIZATIONS} or none")
    check_calibration_wanted(quantize, calibration is not None, where)
    if quantize and naflex and (calibration is not None or needs_calibration):
        raise ConfigError(f"{where}: static int8 calibrates graphs of image tensors, not a NaFlex graph; export it "
                          f"without --naflex, or (ONNX) without --calibration for dynamic int8")
    if quantize and needs_calibration and calibration is None:
        raise ConfigError(f"{where}: int8 OpenVINO export is static and needs calibration images: pass "
                          f"--calibration DATASET (images of the data the model will see)")
    if calibration is not None:
        check_calibration(calibration, channels, where)


def check_calibration_wanted(quantize: str | None, calibrated: bool, where: str) -> None:
    """Refuse calibration images for an export that is not quantised."""
    if calibrated and not quantize:
        raise ConfigError(f"{where}: calibration images apply to int8 quantisation (static, calibrated); ask for "
                          f"--quantize int8 or leave out --calibration")


def check_calibration(batches: Sequence[np.ndarray], channels: int, where: str) -> None:
    """Refuse calibration input that is no batch of ``channels``-channel images, or none at all."""
    if not batches or not sum(len(batch) for batch in batches):
        raise ConfigError(f"{where}: no calibration images; static int8 needs images of the data the model will see")
    for batch in batches:
        if batch.ndim != 4 or batch.shape[1] != channels:
            raise ConfigError(f"{where}: calibration batch of shape {list(batch.shape)}; expected (batch, {channels}, "
                              f"H, W) images, the model's {channels} channels")


def quantize_onnx_static(source: Path, target: Path, batches: Sequence[np.ndarray], input_name: str,
                         workdir: Path) -> Path:
    """``source`` as a static int8 QDQ graph at ``target``: weights int8 per output channel, activations uint8
    with min-max scales from ``batches`` (u8 x s8, the kernels ONNX Runtime has for x86; 7-bit weights, which no
    x86 kernel saturates: ``INT8_DOT_FLAGS``). Products listed in ``ONNX_INT8_OPS`` with a constant weight only;
    ``source``'s metadata is kept."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        """The batches one at a time as the graph's input, then None (quantize_static reads them once)."""

        def __init__(self):
            self.remaining = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self.remaining, None)
            return None if batch is None else {input_name: np.ascontiguousarray(batch, dtype=np.float32)}

    prepared = workdir / "prepared.onnx"
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its notes on tensors it leaves in fp32 (the norms' 1-D weights)
    try:
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quantize_static(str(prepared), str(target), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                        reduce_range=True, op_types_to_quantize=list(ONNX_INT8_OPS),
                        nodes_to_exclude=activation_products(onnx.load(str(prepared))))
    finally:
        root.setLevel(level)
    _copy_metadata(onnx, source, target)
    return target


def activation_products(graph) -> list[str]:
    """The names of a graph's MatMuls of two activations (attention's q k^T and its weighted sum of v): no
    constant weight to quantise ahead, and per-tensor scales would cost accuracy for little speed."""
    constants = {initializer.name for initializer in graph.graph.initializer}
    constants |= {output for node in graph.graph.node if node.op_type == "Constant" for output in node.output}
    return [node.name for node in graph.graph.node if node.op_type == "MatMul" and node.input[1] not in constants]


def _copy_metadata(onnx, source: Path, target: Path) -> None:
    """``source``'s metadata entries into ``target`` where the quantiser's pre-processing dropped them."""
    metadata = onnx.load(str(source), load_external_data=False).metadata_props
    graph = onnx.load(str(target))
    have = {entry.key for entry in graph.metadata_props}
    missing = [entry for entry in metadata if entry.key not in have]
    if missing:
        for entry in missing:
            graph.metadata_props.add(key=entry.key, value=entry.value)
        onnx.save(graph, str(target))


def quantize_openvino(graph, batches: Sequence[np.ndarray]):
    """An OpenVINO model's matrix products in int8 (NNCF post-training quantisation for transformers: softmax
    and norms stay in the precision the runtime is told at load), with activation scales from ``batches``.
    SmoothQuant is off: on a small trained digits ViT it took top-1 from 84% to 50% (without it: 85%)."""
    extensions = logging.getLogger("torch.utils.cpp_extension")
    level = extensions.level
    extensions.setLevel(logging.ERROR)  # nncf's import loads it, which warns of CUDA_HOME on machines without CUDA
    try:
        import nncf
        from nncf.quantization.advanced_parameters import (AdvancedQuantizationParameters,
                                                           AdvancedSmoothQuantParameters, OverflowFix)
    except ImportError as error:
        raise ImportError(f"int8 OpenVINO export needs nncf: pip install 'vitkit[deploy]' ({error})") from None
    finally:
        extensions.setLevel(level)
    nncf.set_log_level(logging.ERROR)
    advanced = AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1),
                                              overflow_fix=OverflowFix.ENABLE)  # 7-bit weights (INT8_DOT_FLAGS)
    return nncf.quantize(graph, nncf.Dataset(list(batches)), model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=len(batches), advanced_parameters=advanced)


def onnx_precision(graph) -> str:
    """The precisions an ONNX graph's matrix products take, most frequent first (``int8+fp32``): int8 for
    integer products and for products whose operands all come from DequantizeLinear (QDQ), fp32 otherwise."""
    made_by = {output: node.op_type for node in graph.graph.node for output in node.output}
    constants = {initializer.name for initializer in graph.graph.initializer}
    found: Counter[str] = Counter()
    for node in graph.graph.node:
        if node.op_type in _INT8_PRODUCTS:
            found["int8"] += 1
        elif node.op_type in _PRODUCTS:
            operands = [name for name in node.input[:2] if name]
            int8 = all(made_by.get(name) == "DequantizeLinear" for name in operands if name not in constants)
            found["int8" if int8 and any(made_by.get(name) == "DequantizeLinear" for name in operands) else
                  "fp32"] += 1
    return "+".join(name for name, _ in found.most_common()) or "fp32"


def openvino_precision(compiled) -> str:
    """The precisions a compiled OpenVINO model's matrix products run in (its runtime model's per-layer
    ``runtimePrecision``), most frequent first (``int8+bf16``)."""
    found: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) in OPENVINO_PRODUCTS:
            precision = info["runtimePrecision"].astype(str)
            found[OPENVINO_PRECISIONS.get(precision, precision)] += 1
    return "+".join(name for name, _ in found.most_common()) or "fp32"
