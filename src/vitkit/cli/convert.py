"""``vitkit convert``: a checkpoint written in another format, or exported to ONNX or OpenVINO and checked."""

from __future__ import annotations

import argparse

from ..checkpoints import export
from ..checkpoints.convert import FORMATS, check_quantizable, output_format
from ..checkpoints.quantize import QUANTIZATIONS
from ..evaluate.calibration import CALIBRATION_IMAGES, calibration_batches
from ..models.stats import count_parameters
from ..errors import ConfigError
from ..runtime import select_device
from .flags import checkpoint_flags, load_checkpoint, positive, runtime_flags

HELP: dict[str, tuple[str, str | None]] = {
    "convert": ("Convert a checkpoint to another format, or export it to ONNX or OpenVINO (checked after writing).",
                "examples:\n"
                "  vitkit convert ViT-B_16.npz runs/vit-b --to native\n"
                "  vitkit convert runs/x/model model.onnx --to onnx --quantize int8\n"
                "  vitkit convert runs/x/model model.xml --quantize int8 --calibration mnist --data-dir data\n"
                "  vitkit convert runs/x/model model.xml --to openvino\n"
                "  vitkit convert clip-dir text.onnx --text   (the text tower: token ids in, embeddings out)"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    conv = sub.add_parser("convert", help="convert a checkpoint between formats")
    checkpoint_flags(conv, help="vitkit/HF directory, .npz, timm/torchvision state dict, hf-hub:ORG/NAME, gs://...")
    conv.add_argument("dst", metavar="DST", help="the file or folder to write: .onnx, .xml (OpenVINO), .npz "
                      "(Google), .safetensors (timm), or a folder (vitkit's own unless --to says hf or timm)")
    conv.add_argument("--to", choices=FORMATS, help="the format (default: the one DST's extension names)")
    conv.add_argument("--quantize", choices=QUANTIZATIONS,
                      help="ONNX and OpenVINO: int8 matrix products (static with --calibration; ONNX without it: "
                           "dynamic, activations quantised on the fly)")
    conv.add_argument("--calibration", metavar="DATASET", help="int8: calibrate activation scales on this dataset's "
                      "train split, read through the checkpoint's evaluation preprocessing (needed for OpenVINO)")
    conv.add_argument("--calibration-size", type=positive, default=CALIBRATION_IMAGES, metavar="N",
                      help=f"calibration images, drawn with a fixed seed (default: {CALIBRATION_IMAGES})")
    conv.add_argument("--data-dir", help="where --calibration lies (torchvision layout)")
    conv.add_argument("--naflex", action="store_true",
                      help="ONNX and OpenVINO: a graph taking NaFlex batches (patches, coords, mask, grids: images at "
                           "their own aspect ratio, run with --max-patches) instead of image tensors")
    conv.add_argument("--text", action="store_true",
                      help="ONNX: the text tower of an image-text checkpoint (CLIP, SigLIP, ...) instead: token ids "
                           "(batch, tokens) in, text embeddings (batch, E) out, any batch; the tokenizer is not in "
                           "the graph: tokenize with the checkpoint's own (vitkit.load_clip(CHECKPOINT).tokenize)")
    runtime_flags(conv, precision=False)
    conv.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read a checkpoint in any format and write it as a vitkit directory, a Google .npz, an HF directory, a
    timm state dict, ONNX (checked by ONNX Runtime after writing) or OpenVINO IR (checked by OpenVINO)."""
    args.to = output_format(args.dst, args.to)
    if args.text:
        return run_text(args)
    check_quantizable(args.to, args.dst, args.quantize, args.calibration is not None)
    model = load_checkpoint(args)
    calibration = None if args.calibration is None else calibration_batches(
        model.config, args.calibration, args.calibration_size, data_dir=args.data_dir)
    written = export(model, args.dst, args.to, args.quantize, select_device(args.device), args.naflex, calibration)
    print(f"wrote {args.dst} ({args.to}): {model.config.provenance.format or 'vitkit'} -> {args.to}, "
          f"{count_parameters(model):,} parameters")
    if args.to == "openvino":
        print(f"OpenVINO (fp32) vs PyTorch on a probe batch: max |difference| {written.max_difference:.2g}")
    if args.to in ("onnx", "openvino") and written.quantized_difference is not None:
        kind = "static, calibrated on " + args.calibration if calibration else "dynamic"
        print(f"{args.quantize} ({kind}): max |difference| {written.quantized_difference:.3g}, top-1 kept on "
              f"{100 * written.quantized_agreement:.0f}% of the probe images (random; check accuracy with "
              f"`vitkit eval {args.dst}`)")
    if args.to == "onnx":
        inputs = "NaFlex batches of any size" if args.naflex else "images of any batch and size"
        print(f"opset {written.opset}, takes {inputs}; ONNX Runtime vs PyTorch on probe batches: max |difference| "
              f"{written.max_difference:.2g}")
    return 0


def run_text(args: argparse.Namespace) -> int:
    """The text tower of an image-text checkpoint to ONNX, checked by ONNX Runtime after writing."""
    from ..text.onnx import export_text_onnx

    if args.to != "onnx":
        raise ConfigError(f"--text: the text tower is exported to ONNX; {args.dst} is {args.to} (write a .onnx file)")
    unused = [flag for flag, value in (("--quantize", args.quantize), ("--calibration", args.calibration),
                                       ("--naflex", args.naflex), ("--adapter", args.adapter),
                                       ("--set", args.overrides)) if value]
    if unused:
        raise ConfigError(f"{', '.join(unused)}: for the image tower; --text exports the text tower as it is stored")
    written = export_text_onnx(args.checkpoint, args.dst, select_device(args.device))
    print(f"wrote {args.dst} (onnx): the text tower of {args.checkpoint}, opset {written.opset}, token ids of any "
          f"batch in, embeddings out (the tokenizer is not in the graph); ONNX Runtime vs PyTorch on probe batches: "
          f"max |difference| {written.max_difference:.2g}")
    return 0
