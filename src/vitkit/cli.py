"""The ``vitkit`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from .checkpoints import CheckpointError, convert, load
from .models import list_models, model_config
from .models.config import pair
from .models.stats import config_parameters, count_parameters, forward_flops


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for index, row in enumerate(cells):
        print("  ".join(c.rjust(w) if index and c[:1].isdigit() else c.ljust(w) for c, w in zip(row, widths)))
        if index == 0:
            print("  ".join("-" * w for w in widths))


def cmd_models(args: argparse.Namespace) -> int:
    """Table of the named variants with their size and cost at a given resolution."""
    rows = []
    for name in args.names or list_models():
        config = model_config(name, image_size=args.image_size, num_classes=args.num_classes)
        params = config_parameters(config)
        rows.append([config.extra["name"], config.depth, config.dim, config.mlp_dim, config.num_heads,
                     f"{params:,}", f"{forward_flops(config) / 1e9:.2f}"])
    height, width = args.image_size
    print(f"at {height}x{width} px, {args.num_classes} classes; GFLOPs = 2 x multiply-adds per image")
    print_table(["model", "layers", "D", "MLP", "heads", "params", "GFLOPs"], rows)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Config, parameter count and input size of a checkpoint of any format."""
    model = load(args.path, **dict(args.set))
    config = model.config
    if args.json:
        print(json.dumps({"config": config.to_dict(), "parameters": count_parameters(model)}, indent=2))
        return 0
    height, width = config.image_size
    print(f"checkpoint   {args.path}" + (f" ({config.extra['format']})" if "format" in config.extra else ""))
    print(f"model        {config.extra.get('name', 'custom')}: {config.depth} layers, D={config.dim}, "
          f"MLP={config.mlp_dim}, {config.num_heads} heads, patch {config.patch_size}"
          + (f" on a ResNet {list(config.backbone)}" if config.backbone is not None else ""))
    print(f"numerics     GELU {config.gelu}, LayerNorm eps {config.ln_eps:g}"
          + (f", StdConv {config.std_conv} eps {config.std_conv_eps:g}, GroupNorm eps {config.gn_eps:g}"
             if config.backbone is not None else ""))
    print(f"input        {config.in_chans}x{height}x{width} (grid {config.grid_size[0]}x{config.grid_size[1]})")
    print(f"output       {config.num_classes} classes, pooling '{config.pool}'"
          + (f", pre-logits {config.representation_size}" if config.representation_size else ""))
    print(f"parameters   {count_parameters(model):,}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Read a checkpoint in any format and write it as a vitkit directory, a Google .npz or an HF directory."""
    model = convert(args.src, args.dst, args.to, **dict(args.set))
    print(f"wrote {args.dst} ({args.to}): {model.config.extra.get('format', 'vitkit')} -> {args.to}, "
          f"{count_parameters(model):,} parameters")
    return 0


def _override(text: str) -> tuple[str, object]:
    """``key=value`` with a JSON value (``num_heads=4``, ``pool="gap"``; bare words are strings)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _image_size(text: str) -> tuple[int, int]:
    parts = [int(p) for p in text.lower().split("x")]
    return pair(parts[0] if len(parts) == 1 else tuple(parts))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="list the named ViT variants")
    models.add_argument("names", nargs="*", help="variants to show (default: the paper's)")
    models.add_argument("--image-size", type=_image_size, default=(224, 224), help="e.g. 224 or 384x512")
    models.add_argument("--num-classes", type=int, default=1000)
    models.set_defaults(run=cmd_models)

    info = sub.add_parser("info", help="describe a checkpoint")
    info.add_argument("path")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=cmd_info)

    conv = sub.add_parser("convert", help="convert a checkpoint between formats")
    conv.add_argument("src", help="vitkit/HF directory, .npz, timm/torchvision state dict, hf-hub:ORG/NAME, gs://...")
    conv.add_argument("dst")
    conv.add_argument("--to", choices=["native", "npz", "hf"], default="native")
    conv.set_defaults(run=cmd_convert)
    for command in (info, conv):
        command.add_argument("--set", type=_override, action="append", default=[], metavar="KEY=VALUE",
                             help="config override, e.g. num_heads=4 for a packed qkv (repeatable)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except (CheckpointError, ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"vitkit {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
