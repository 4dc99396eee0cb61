"""``vitkit predict``: the most probable classes of image files, and on request their dense features."""

from __future__ import annotations

import argparse
import json
import sys

from ..checkpoints.runnable import load_inference
from ..classnames import escape_name
from ..evaluate.accuracy import check_model_memory
from ..analysis.inputs import image_files
from ..errors import ConfigError
from ..evaluate.dense import predict_dense
from ..evaluate.predict import check_feature_request, predict_files, prediction_record
from .flags import (checkpoint_flags, max_patches_flag, model_source, positive, resize_flag, runtime_flags,
                    slide_flag)

HELP: dict[str, tuple[str, str | None]] = {
    "predict": ("The most probable classes of image files, folders or glob patterns.",
                "examples:\n"
                "  vitkit predict runs/x/model cat.jpg photos/ --top-k 3\n"
                "  vitkit predict runs/x/model 'img/*.jpg' --json\n"
                "  vitkit predict runs/seg/model street.jpg --out masks/   (a segmentation or depth model)"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    predict_ = sub.add_parser("predict", help="top-k labels of image files")
    checkpoint_flags(predict_, help="anything vitkit.load reads, or an .onnx file")
    predict_.add_argument("images", nargs="+", metavar="IMAGE",
                          help="image files, folders (every image below them) or quoted glob patterns ('img/*.jpg')")
    predict_.add_argument("--json", action="store_true", help="the predictions as a JSON list on stdout")
    predict_.add_argument("--top-k", type=positive, default=5, metavar="K",
                          help="how many of the most probable classes to list for each image (default: 5)")
    predict_.add_argument("--features", metavar="OUT", help="also write each image's dense patch features (D, H/P, "
                          "W/P) and pooled embedding to OUT (.npz or .safetensors)")
    predict_.add_argument("--out", metavar="DIR", help="a segmentation or depth model's PNGs: STEM-mask.png and "
                          "STEM-overlay.png, or STEM-depth.png (16-bit mm) and STEM-depth-colour.png")
    predict_.add_argument("--keep-aspect", action="store_true",
                          help="resize each image to its own aspect ratio, the shorter side to the model's, both "
                               "sides rounded to the patch size (no crop), instead of --resize")
    slide_flag(predict_)
    resize_flag(predict_)
    max_patches_flag(predict_)
    runtime_flags(predict_)
    predict_.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Top-k labels with probabilities for each image file; with --features, each image's dense patch features
    and pooled embedding written to one file."""
    check_feature_request(args.checkpoint, args.features)
    check_model_memory(args.checkpoint, args.overrides, args.device, args.precision, adapter=args.adapter,
                       command="vitkit predict")
    model, device, dtype = load_inference(args.checkpoint, args.overrides, args.device, args.precision,
                                          adapter=args.adapter)
    if model.config.dense_head != "none" or args.out:
        return run_dense(args, model, device, dtype)
    if args.slide is not None:
        raise ConfigError(f"{model_source(args)} is a classifier: --slide (sliding windows) is for segmentation and "
                          f"depth models")
    predictions, features = predict_files(model, args.images, args.top_k, device, dtype, args.resize, args.features,
                                          args.keep_aspect, args.max_patches, source=model_source(args))
    if args.json:
        print(json.dumps([prediction_record(prediction) for prediction in predictions], indent=1))
    else:
        for prediction in predictions:
            ranked = ", ".join(f"{escape_name(label)} {100 * p:.1f}%"
                               for label, p in zip(prediction.labels, prediction.probabilities))
            if prediction.features is not None:
                ranked = f"features {'x'.join(map(str, prediction.features.shape))}" + (f"; {ranked}" if ranked else "")
            print(f"{prediction.path}: {ranked}")
    if features:
        print(f"dense features and embeddings in {features}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def run_dense(args: argparse.Namespace, model, device, dtype) -> int:
    """A dense model's masks and overlays, or depth maps, written as PNGs into ``--out``."""
    what = "segmentation" if model.config.dense_output == "classes" else "depth"
    if model.config.dense_head == "none":
        raise ConfigError(f"--out: {model_source(args)} classifies whole images; --out DIR takes the PNGs of a "
                          f"segmentation or depth model")
    if not args.out:
        raise ConfigError(f"{model_source(args)} is a {what} model: pass --out DIR for its PNGs")
    unused = [flag for flag, value in (("--features", args.features), ("--keep-aspect", args.keep_aspect),
                                       ("--max-patches", args.max_patches)) if value]
    if unused:
        raise ConfigError(f"{', '.join(unused)}: not for a {what} model, whose images are stretched to its size "
                          f"(or, with --slide, resized at their aspect ratio)")
    predictions = predict_dense(model, image_files(args.images), args.out, device, dtype, args.slide)
    if args.json:
        print(json.dumps([prediction.record() for prediction in predictions], indent=1))
        return 0
    for prediction in predictions:
        if prediction.shares is not None:
            shown = ", ".join(f"{escape_name(label)} {100 * share:.1f}%"
                              for label, share in list(prediction.shares.items())[:5])
        else:
            shown = f"depth {prediction.depth_range[0]:.3g}-{prediction.depth_range[1]:.3g} m"
        print(f"{prediction.path}: {shown}")
    print(f"PNGs in {args.out}")
    return 0
