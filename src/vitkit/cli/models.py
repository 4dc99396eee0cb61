"""``vitkit models`` (the named variants with their size and cost) and ``vitkit info`` (a checkpoint described)."""

from __future__ import annotations

import argparse
import json

from ..checkpoints.runnable import load_on_device
from ..evaluate.accuracy import check_model_memory
from ..models import list_models, model_config
from ..models.dense import dense_layers
from ..models.stats import config_parameters, count_parameters, forward_flops
from .flags import checkpoint_flags, count, image_size_type, print_table, runtime_flags

HELP: dict[str, tuple[str, str | None]] = {
    "models": ("List the named ViT variants with their layers, width, heads, parameters and GFLOPs.",
               "example:\n  vitkit models ViT-B/16 DINOv2-S/14 --image-size 384"),
    "info": ("Describe a checkpoint of any format: config, parameters, input size and numerics.",
             "example:\n  vitkit info hf-hub:timm/vit_small_patch16_224.augreg_in21k_ft_in1k --json"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``models`` and ``info`` to ``sub``, the subparsers of ``vitkit``."""
    models = sub.add_parser("models", help="list the named ViT variants")
    models.add_argument("names", nargs="*", help="variants to show (default: all named ones)")
    models.add_argument("--image-size", type=image_size_type, metavar="HxW",
                        help="e.g. 224 or 384x512 (default: the variant's)")
    models.add_argument("--num-classes", type=count, help="default: the variant's (1000, or 0 for a bare tower)")
    models.set_defaults(run=run_models)

    info = sub.add_parser("info", help="describe a checkpoint")
    checkpoint_flags(info)
    info.add_argument("--json", action="store_true", help="machine-readable output")
    runtime_flags(info, precision=False)
    info.set_defaults(run=run_info)


def run_models(args: argparse.Namespace) -> int:
    """Table of the named variants with their size and cost at a given resolution."""
    rows = []
    given = {key: value for key, value in (("image_size", args.image_size), ("num_classes", args.num_classes))
             if value is not None}
    for name in args.names or list_models():
        config = model_config(name, **given)
        params = config_parameters(config)
        height, width = config.image_size
        rows.append([config.provenance.name, config.depth, config.dim, config.mlp_dim, config.num_heads,
                     f"{height}x{width}", config.num_classes, f"{params:,}", f"{forward_flops(config) / 1e9:.2f}"])
    print("each variant at its own default size and head unless --image-size/--num-classes are given "
          "(224 px and 1000 classes for the paper's); GFLOPs = 2 x multiply-adds per image")
    print_table(["model", "layers", "D", "MLP", "heads", "px", "classes", "params", "GFLOPs"], rows)
    return 0


def run_info(args: argparse.Namespace) -> int:
    """Config, parameter count and input size of a checkpoint of any format."""
    check_model_memory(args.checkpoint, args.overrides, args.device, "fp32", adapter=args.adapter,
                       command="vitkit info")
    model, device, _ = load_on_device(args.checkpoint, args.overrides, args.device, adapter=args.adapter)
    config = model.config
    if args.json:
        print(json.dumps({"config": config.to_dict(), "parameters": count_parameters(model), "device": str(device)},
                         indent=2))
        return 0
    height, width = config.image_size
    print(f"checkpoint   {args.checkpoint}" + (f" ({config.provenance.format})" if config.provenance.format else ""))
    print(f"model        {config.provenance.name or 'custom'}: {config.depth} layers, D={config.dim}, "
          f"MLP={config.mlp_dim}, {config.num_heads} heads, patch {config.patch_size}"
          + (f" on a ResNet {list(config.backbone)}" if config.backbone is not None else ""))
    options = config.family_options()
    if options:
        print("options      " + ", ".join(f"{name}={value!r}" for name, value in options.items()))
    print(f"numerics     GELU {config.gelu}, {'RMSNorm' if config.norm == 'rms' else 'LayerNorm'} eps {config.ln_eps:g}"
          + (f", StdConv {config.std_conv} eps {config.std_conv_eps:g}, GroupNorm eps {config.gn_eps:g}"
             if config.backbone is not None else ""))
    mean, std = config.input_statistics
    print(f"input        {config.in_chans}x{height}x{width} (grid {config.grid_size[0]}x{config.grid_size[1]}), "
          f"crop_pct {config.provenance.crop_pct:g}, normalised '{config.provenance.normalization}': "
          f"mean {[round(m, 3) for m in mean]}, std {[round(v, 3) for v in std]}")
    print("output       " + output_line(config))
    print(f"parameters   {count_parameters(model):,} on {device}")
    return 0


def output_line(config) -> str:
    """What the model outputs: pooled class logits, or a dense head's maps (its kind and the blocks it reads)."""
    if config.dense_head == "none":
        return (f"{config.num_classes} classes, pooling '{config.pool}'"
                + (f" of the patch merger's {config.token_dim}-wide tokens, one per {config.merge_size}x"
                   f"{config.merge_size} cell" if config.merge_size else "")
                + (f", pre-logits {config.representation_size}" if config.representation_size else ""))
    per_pixel = (f"depth per pixel from {config.num_classes} bins, {config.depth_min:g}-{config.depth_max:g} m"
                 if config.dense_output == "depth" else f"{config.num_classes} classes per pixel")
    blocks = ", ".join(str(block + 1) for block in dense_layers(config))
    return f"{per_pixel}, head '{config.dense_head}' on block{'s' if ',' in blocks else ''} {blocks}"
