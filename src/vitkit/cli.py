"""The ``vitkit`` command: its subcommands, their flags and help, and how errors become exit statuses."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import logging
import math
import os
import sys
import traceback
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from . import __version__
from .analysis import inputs
from .analysis.attention import HEAD_FUSIONS, READOUTS
from .analysis.report import REPORT_FILE, analyze
from .checkpoints import export, load
from .checkpoints.convert import FORMATS, check_quantizable
from .checkpoints.hub import is_remote
from .checkpoints.quantize import QUANTIZATIONS
from .classnames import escape_name
from .data import ALL, CORRUPT, RESIZE_MODES, SPLITS
from .data.datasets import DATASET_FORMS
from .errors import ConfigError, VitkitError, parse_json
from .evaluate.calibration import CALIBRATION_IMAGES
from .evaluate.fewshot import DEFAULT_L2_REGS, DEFAULT_SHOTS
from .evaluate.knn import DEFAULT_TEMPERATURE
from .evaluate.preprocessing import checkpoint_transform, naflex_transform
from .memory import Plan, check, check_workers, estimate, usable_cpus
from .models import VisionTransformer, create_model, list_models, model_config
from .models.config import ViTConfig, pair
from .models.stats import config_parameters, count_parameters, forward_flops
from .runtime import PRECISIONS, autocast, resolve_precision, select_device
from .train.recipes import (DEFAULT_PRESETS, FIELD_HELP, IMAGE_SIZE_FORMS, RECIPE_PRESETS, Recipe, Rule, at_least,
                            field_types, fraction, image_size, merge, read_config_file, resolve)
from .train.run import check_run_memory
from .train.sizing import check_size, patch_for


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """``rows`` under ``header`` in aligned columns; each cell one printable line (class names may hold anything:
    see ``classnames``)."""
    cells = [[escape_name(str(c)) for c in header]] + [[escape_name(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for index, row in enumerate(cells):
        print("  ".join(c.rjust(w) if index and c[:1].isdigit() else c.ljust(w) for c, w in zip(row, widths)))
        if index == 0:
            print("  ".join("-" * w for w in widths))


def cmd_models(args: argparse.Namespace) -> int:
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


def cmd_info(args: argparse.Namespace) -> int:
    """Config, parameter count and input size of a checkpoint of any format."""
    device = select_device(args.device)
    model = load_checkpoint(args).to(device)
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
    print(f"numerics     GELU {config.gelu}, LayerNorm eps {config.ln_eps:g}"
          + (f", StdConv {config.std_conv} eps {config.std_conv_eps:g}, GroupNorm eps {config.gn_eps:g}"
             if config.backbone is not None else ""))
    mean, std = config.input_statistics
    print(f"input        {config.in_chans}x{height}x{width} (grid {config.grid_size[0]}x{config.grid_size[1]}), "
          f"crop_pct {config.provenance.crop_pct:g}, normalised '{config.provenance.normalization}': "
          f"mean {[round(m, 3) for m in mean]}, std {[round(v, 3) for v in std]}")
    print(f"output       {config.num_classes} classes, pooling '{config.pool}'"
          + (f", pre-logits {config.representation_size}" if config.representation_size else ""))
    print(f"parameters   {count_parameters(model):,} on {device}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Read a checkpoint in any format and write it as a vitkit directory, a Google .npz, an HF directory, a
    timm state dict, ONNX (checked by ONNX Runtime after writing) or OpenVINO IR (checked by OpenVINO)."""
    args.to = output_format(args.dst, args.to)
    check_quantizable(args.to, args.dst, args.quantize, args.calibration is not None)
    model = load_checkpoint(args)
    calibration = None
    if args.calibration is not None:
        from .evaluate.calibration import calibration_batches

        calibration = calibration_batches(model.config, args.calibration, args.calibration_size,
                                          data_dir=args.data_dir)
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


# The format a destination's extension names; any other destination is a folder: native, hf or timm.
EXTENSION_FORMATS = {".onnx": "onnx", ".xml": "openvino", ".npz": "npz", ".safetensors": "timm"}


def output_format(destination: str, asked: str | None) -> str:
    """What ``convert`` writes: ``--to``, else the format the destination's extension names, else native (a
    folder); ``--to`` and an extension that disagree are refused."""
    suffix = Path(destination).suffix.lower()
    implied = EXTENSION_FORMATS.get(suffix)
    if asked is None:
        return implied or "native"
    if implied not in (None, asked):
        fitting = {value: key for key, value in EXTENSION_FORMATS.items()}.get(asked)
        instead = f"a destination ending in {fitting}" if fitting else "a folder"
        raise ConfigError(f"--to {asked} and {destination}: a {suffix} file holds {implied}; pass --to {implied}, "
                          f"or {instead} for {asked}")
    return asked


def load_checkpoint(args: argparse.Namespace):
    """The model of the command's CHECKPOINT with its ``--set`` overrides."""
    return load(args.checkpoint, **args.overrides)


def _override(text: str) -> dict[str, object]:
    """``key=value`` with a JSON value (``num_heads=4``, ``pool="gap"``; bare words are strings);
    ``image_size`` also takes ``H`` or ``HxW``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key == "image_size":
        return {key: _image_size(value)}
    try:
        return {key: parse_json(value)}
    except json.JSONDecodeError:
        return {key: value}


class _Overrides(argparse.Action):
    """Config overrides gathered in command-line order into one mapping: ``--set`` gives one key,
    ``--model-args`` a JSON object of them; a later value of a key wins."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest, None) or {}), **values})


def _override_flags(parser: argparse.ArgumentParser, dest: str = "overrides", json_alias: bool = False,
                    help: str = "model config override, e.g. num_heads=4 for a packed qkv or ln_eps=1e-12 "
                                "(repeatable)") -> None:
    """``--set KEY=VALUE`` (and on the training commands its spellings ``--model-args JSON`` and
    ``--drop-path``): model config fields changed before the weights are loaded, or, for patch_size,
    image_size and num_classes, by surgery after."""
    default = argparse.SUPPRESS if json_alias else {}
    parser.add_argument("--set", type=_override, action=_Overrides, dest=dest, default=default, metavar="KEY=VALUE",
                        help=help)
    if json_alias:
        parser.add_argument("--model-args", type=_json_object, action=_Overrides, dest=dest, default=default,
                            metavar="JSON", help='several --set at once, e.g. \'{"dim": 192, "depth": 12}\'')
        parser.add_argument("--drop-path", type=_drop_path, action=_Overrides, dest=dest, default=default,
                            metavar="RATE", help="stochastic depth rate (timm's name for --set drop_path=RATE)")


def _drop_path(text: str) -> dict[str, float]:
    return {"drop_path": _fraction(text)}


def _checkpoint_flags(parser: argparse.ArgumentParser, help: str = "anything vitkit.load reads: a vitkit, HF or "
                      "timm directory, .npz, .safetensors/.pth state dict, hf-hub:ORG/NAME") -> None:
    """The positional CHECKPOINT and its ``--set`` overrides, alike on every command that reads one."""
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help=help)
    _override_flags(parser)


def cmd_analyze(args: argparse.Namespace) -> int:
    """Attention rollout, mean attention distance, position-embedding similarity and filter PCA of a
    checkpoint on given images, a dataset sample, or scikit-learn's two sample photos."""
    device = select_device(args.device)
    model = load_checkpoint(args).to(device)
    config = model.config
    pictures, about = inputs.gather(args.images, args.dataset, args.data_dir, args.num_images, args.seed,
                                    config.provenance.classes)
    size = args.image_size or config.image_size
    mean = _per_channel(args.mean, config.in_chans) if args.mean else None
    std = _per_channel(args.std, config.in_chans) if args.std else None
    if args.max_patches:
        if args.image_size:
            raise ConfigError("--image-size and --max-patches: the budget sizes each image at its own aspect ratio")
        transform = naflex_transform(config, args.max_patches, mean, std)
    else:
        transform = checkpoint_transform(config, args.resize, size, mean, std)
    images, shown = inputs.prepare(pictures, transform)
    result = analyze(model, images, shown, args.out, batch_size=args.batch_size, head_fusion=args.head_fusion,
                     discard_ratio=args.discard_ratio, overlays=args.overlays, filters=args.filters,
                     title=str(args.checkpoint), dtype=resolve_precision(args.precision, device), readout=args.readout,
                     about=about)
    sizes = "each at its own aspect ratio" if args.max_patches else f"at {size[0]}x{size[1]}"
    print(f"analysed {len(images)} images {sizes}: {len(result.figures)} figures, report {result.out / REPORT_FILE}")
    return 0


def _per_channel(values: list[float], channels: int) -> list[float]:
    if len(values) == 1:
        return values * channels
    if len(values) != channels:
        raise ConfigError(f"--mean/--std: expected 1 or {channels} values for the normalisation, got {values}")
    return values


def _checked(kind: type, rule: Rule) -> Callable[[str], typing.Any]:
    """An argparse type: the text read as ``kind`` and held to ``rule``, one of the recipe's, so that a rule
    is stated once for the recipe field and for every flag of the same kind."""
    holds, expected = rule

    def parse(text: str) -> typing.Any:
        value = kind(text)
        if kind is int and not -2**63 <= value < 2**63:  # what torch and numpy take
            raise argparse.ArgumentTypeError(f"expected a 64-bit integer, got {text}")
        if not holds(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value: 'x'"
    return parse


_positive = _checked(int, at_least(1))
_count = _checked(int, at_least(0))
_fraction = _checked(float, fraction(open_top=True))
_positive_number = _checked(float, ((lambda value: 0 < value < math.inf), "a positive number"))
_finite_number = _checked(float, (math.isfinite, "a finite number"))
_regularizer = _checked(float, ((lambda value: 0 <= value < math.inf), "a finite number >= 0"))
MAX_SEEDS = 1000  # few-shot repeats: each fits every shot count again
_repeats = _checked(int, ((lambda value: 1 <= value <= MAX_SEEDS), f"an int in 1..{MAX_SEEDS}"))
# Patches per image of a NaFlex batch: every image is padded to this many, so it bounds the batch's memory
# (16384 patches of 16 px hold a 2048 x 2048 image; SigLIP 2 was trained with up to 1024).
MAX_PATCHES_LIMIT = 16384
_patch_budget = _checked(int, ((lambda value: 1 <= value <= MAX_PATCHES_LIMIT), f"an int in 1..{MAX_PATCHES_LIMIT}"))


def _json_object(text: str) -> dict:
    """A JSON object such as ``{"depth": 8}`` (``--model-args``)."""
    try:
        value = parse_json(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text!r}") from error
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 8}}', got {text!r}")
    return value


def _image_size(text: str) -> tuple[int, int]:
    """``224`` or ``384x512`` (height x width), in pixels, read as a recipe's ``image_size`` is."""
    try:
        return pair(image_size(text))
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected {IMAGE_SIZE_FORMS}, got {text!r}") from None


# ------------------------------------------------------------------------ train, finetune, eval, predict
# Short forms, and the names a timm user would type, of some recipe fields' flags.
FLAG_ALIASES = {"batch_size": ("-b",), "num_workers": ("-j",), "label_smoothing": ("--smoothing",),
                "optimizer": ("--opt",), "schedule": ("--sched",)}


def _recipe_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--field`` flag per recipe field, in the help group of its concern, typed by its annotation;
    unset flags leave the preset alone. ``model_args`` are given by ``--set`` or ``--model-args``."""
    hints = field_types()
    defaults = {item.name: item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
                for item in dataclasses.fields(Recipe)}
    for concern, helps in FIELD_HELP.items():
        group = parser.add_argument_group(f"recipe: {concern}")
        for name, help in helps.items():
            default, kind = defaults[name], hints[name]
            flag = ("--" + name.replace("_", "-"), *FLAG_ALIASES.get(name, ()))
            if name == "model_args":
                _override_flags(group, dest=name, json_alias=True, help=help)
            elif name == "image_size":
                group.add_argument(*flag, type=_image_size, default=argparse.SUPPRESS, metavar="HxW", help=help)
            elif typing.get_origin(kind) is typing.Literal:
                group.add_argument(*flag, choices=typing.get_args(kind), default=argparse.SUPPRESS, help=help)
            elif isinstance(default, bool):
                group.add_argument(*flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help)
            elif isinstance(default, tuple):
                group.add_argument(*flag, type=float, nargs=len(default), default=argparse.SUPPRESS, metavar="X",
                                   help=help)
            else:
                kind = type(default) if default is not None else _not_none(kind)
                group.add_argument(*flag, type=kind, default=argparse.SUPPRESS, metavar=kind.__name__.upper(),
                                   help=help)


def _not_none(kind: typing.Any) -> type:
    """What a flag of an ``X | None`` recipe field reads: an X (null is the field's default, off)."""
    return next(arg for arg in typing.get_args(kind) if arg is not type(None))


def recipe_from_args(args: argparse.Namespace):
    """The recipe a train/finetune command line describes; ``--resume`` starts from the run's own
    ``recipe.json`` so that the continued run is the same run."""
    from .train.run import RECIPE_FILE

    overrides = {k: v for k, v in vars(args).items() if k not in _NOT_RECIPE}
    if getattr(args, "checkpoint", None):
        overrides["init"] = args.checkpoint
    saved = Path(overrides.get("run_dir", "")) / RECIPE_FILE
    if args.resume and "run_dir" in overrides and saved.is_file():
        return Recipe.from_dict(merge(read_config_file(saved), overrides), str(saved))
    if args.resume:
        raise ConfigError("--resume needs --run-dir with the run to continue (a folder holding recipe.json)")
    return resolve(args.preset, args.config, overrides)


def cmd_train(args: argparse.Namespace) -> int:
    """Train a ViT (default: a small one on the embedded digits, about 20-35 s on 2 CPU cores; on another
    dataset, a small one sized from its images); ``vitkit finetune CHECKPOINT`` fine-tunes (section 3.2: the
    data's resolution unless asked, a new zero head unless the classes are the checkpoint's, SGD)."""
    from .train import run
    from .train.distributed import leave

    recipe, device = recipe_from_args(args), select_device(args.device)
    check_run_size(recipe, f"vitkit {args.command}", device)
    summary = run(recipe, resume=args.resume, device=args.device and str(device))
    leave()
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 alone reports
        return 0
    rows = [[key, f"{value:.4f}" if isinstance(value, float) else value] for key, value in summary.items()]
    print_table(["metric", "value"], rows)
    if "test/accuracy" in summary:
        print(f"{summary['test/split']} accuracy: {100 * summary['test/accuracy']:.2f}% "
              f"({summary['test/images']} images)")
    else:
        print(f"pre-trained encoder saved in {summary['run_dir']}/model; fine-tune it with `vitkit finetune`")
    return 0


def _preset_help(command: str) -> str:
    """``--preset``'s help: what a run starts from without one."""
    default = DEFAULT_PRESETS[command == "finetune"]
    return (f"named recipe to start from, listed below (default: the {default} preset's training settings, the "
            f"input's size, channels and patch from the data{' and the checkpoint' if command == 'finetune' else ''})")


def _presets_epilog() -> str:
    """The end of the training commands' help: every preset with its values, one paragraph each."""
    import textwrap

    def shown(value: object) -> str:
        return "(" + " ".join(f"{k}={v}" for k, v in value.items()) + ")" if isinstance(value, dict) else str(value)

    paragraphs = [textwrap.fill(f"{name}: " + ", ".join(f"{key}={shown(value)}" for key, value in values.items()),
                                width=100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
                  for name, values in RECIPE_PRESETS.items()]
    return "\n".join(["A recipe flag overrides the --config file, which overrides the --preset. Presets:", *paragraphs])


_NOT_RECIPE = {"command", "run", "preset", "config", "resume", "checkpoint", "debug", "device"}


def check_run_size(recipe: Recipe, command: str, device: torch.device) -> None:
    """Refuse a run that cannot fit before any data or weights are loaded: more loader processes than CPUs, or a
    peak memory (``vitkit.memory``) above what the machine has, named with the flags that would fit. A run sized
    from its data is checked once the data has said its size (``train.run.prepare``)."""
    check_workers(recipe.num_workers)
    if recipe.image_size is None:
        return
    size = pair(recipe.image_size)
    if recipe.init:
        config = source_config(recipe.init, {"image_size": size, **recipe.model_args})
    elif recipe.model:
        config = model_config(recipe.model, image_size=size, **recipe.model_args)
    else:  # the patch a new model takes at this size (train.sizing), so that the estimate counts its tokens
        args = {"patch_size": patch_for(size), **recipe.model_args}
        if "patch_size" not in recipe.model_args:  # the chosen patch, refused as sizing refuses it
            check_size(size, args["patch_size"], "--image-size")
        config = ViTConfig().replace(image_size=size, **args)
    check_run_memory(recipe, config, device, command)


def source_config(source: str, overrides: dict[str, typing.Any]) -> ViTConfig:
    """The config of the model a checkpoint (or a variant's name) describes with ``overrides``, before any
    weights are put into a model: what a size check needs to know."""
    from .checkpoints.inference import kept_overrides
    from .checkpoints.loading import read_checkpoint

    if not (Path(source).exists() or is_remote(source)):
        return model_config(source, **overrides)
    return read_checkpoint(source, overrides)[0].replace(**kept_overrides(overrides))


def inference_model(args: argparse.Namespace):
    """The model ``eval``/``predict`` run: a checkpoint on ``--device`` in ``--precision``, an ``.onnx``
    file run by ONNX Runtime as it was exported, or an OpenVINO ``.xml`` on the CPU in ``--precision``; with
    its device and compute dtype (the runtimes compute in their own precision: fp32 as far as autocast goes)."""
    device = select_device(args.device)
    runtime = {".onnx": "an ONNX", ".xml": "an OpenVINO"}.get(Path(args.checkpoint).suffix)
    if runtime and args.overrides:
        raise ConfigError(f"--set {', '.join(args.overrides)}: {runtime} model runs as it was exported")
    if Path(args.checkpoint).suffix == ".onnx":
        from .checkpoints.onnx import OnnxModel

        if args.precision not in ("fp32", "auto"):
            raise ConfigError(f"--precision {args.precision}: an ONNX model runs in the precision it was exported in")
        return OnnxModel(args.checkpoint, device), torch.device("cpu"), torch.float32
    if Path(args.checkpoint).suffix == ".xml":
        from .checkpoints.openvino import OpenVinoModel

        if args.precision == "fp16":
            raise ConfigError("--precision fp16: an OpenVINO model runs in fp32, bf16 or auto (bf16 where native)")
        dtype = resolve_precision(args.precision, torch.device("cpu"))
        return OpenVinoModel(args.checkpoint, dtype), torch.device("cpu"), torch.float32
    return load_checkpoint(args).to(device), device, resolve_precision(args.precision, device)


def say_whole(args: argparse.Namespace, split: str, images: int) -> None:
    """One line saying that the dataset, which names no split, is evaluated whole, where it is and no ``--split``
    asked for that."""
    if split == ALL and args.split is None:
        print(f"{args.dataset} names no test or validation split: every one of its {images} images is evaluated "
              f"(--split test evaluates the part a training run holds out)")


def cmd_eval(args: argparse.Namespace) -> int:
    """Top-1/top-5, per-class accuracy and a confusion-matrix PNG of a checkpoint on a dataset split."""
    from .data import SplitSpec, default_split, evaluation_loader, load_dataset
    from .data.survey import conversions, image_geometry
    from .evaluate.metrics import evaluate, write_report

    model, device, dtype = inference_model(args)
    config = model.config
    from_run = args.dataset is None
    _run_defaults(args)
    split = args.split or ("test" if from_run else default_split(args.dataset))  # a run's own: its held-out split
    dataset = load_dataset(args.dataset, split, args.data_dir, SplitSpec(args.val_fraction), args.corrupt)
    say_whole(args, split, len(dataset))
    check_eval_size(args, model, device, dtype, len(dataset))
    if config.num_classes != len(dataset.classes):
        raise ConfigError(f"{args.checkpoint} predicts {config.num_classes} classes but {args.dataset} has "
                          f"{len(dataset.classes)}")
    for conversion in [] if args.max_patches else conversions(image_geometry(dataset), config.in_chans,
                                                               config.image_size):
        print(f"{args.dataset}: {conversion}", file=sys.stderr)
    check_graph_inputs(model, args.checkpoint, args.max_patches)
    if args.max_patches:
        from .evaluate.preprocessing import naflex_loader

        loader = naflex_loader(dataset, config, args.max_patches, args.batch_size, args.num_workers, args.corrupt,
                               device)
    else:
        transform = checkpoint_transform(config, args.resize)
        loader = evaluation_loader(dataset, transform, args.batch_size, args.num_workers, args.corrupt,
                                   device=device)
    report = write_report(evaluate(model, loader, config.num_classes, device, dtype), dataset.classes, args.out,
                          split)
    print_table(["class", "accuracy"], [[name, "-" if acc is None else f"{100 * acc:.2f}%"]
                                        for name, acc in report["per_class"].items()])
    kept = f"report and confusion matrix in {args.out}" if args.out else "pass --out DIR to keep the report and " \
        "confusion matrix"
    print(f"{args.dataset} [{split}]: top-1 {100 * report['top1']:.2f}%  top-5 {100 * report['top5']:.2f}%  "
          f"({report['images']} images); {kept}")
    return 0


def check_eval_size(args: argparse.Namespace, model, device: torch.device, dtype: torch.dtype, images: int) -> None:
    """Refuse an evaluation that cannot fit before its first batch: more loader processes than CPUs, or a peak
    memory (``vitkit.memory``) above what the machine has for batches of ``--batch-size`` or all ``images``,
    named with the flags that would fit."""
    check_workers(args.num_workers)
    config = model.config
    native = isinstance(model, VisionTransformer)

    def measure(plan: Plan):
        return estimate(config, plan.batch, plan.image_size, workers=args.num_workers, dtype=dtype,
                        patches=args.max_patches, device=device.type)

    plan = Plan(min(args.batch_size, max(images, 1)), config.image_size, stride=config.effective_patch_size,
                image_flag="--set image_size={}" if native and not args.max_patches else None)
    check(plan, measure, f"vitkit {args.command}", device=device)


DEFAULT_VAL_FRACTION = 0.1  # eval's held-out fraction where neither --val-fraction nor a run gives one


def run_folder(checkpoint: str) -> Path | None:
    """The run a checkpoint was written by (its ``model``, ``best`` or ``checkpoints/step-N`` folder lies in
    a folder holding the run's recipe), or None."""
    from .train.run import RECIPE_FILE

    path = Path(checkpoint)
    return next((folder for folder in (path.parent, path.parent.parent) if (folder / RECIPE_FILE).is_file()), None)


def _run_defaults(args: argparse.Namespace) -> None:
    """What ``eval`` or ``fewshot`` was not told, from the checkpoint's run: the dataset it was trained on (with
    its data folder and, for eval, held-out fraction) and then the run folder as ``--out``; without a run,
    ``--dataset`` is needed."""
    from .train.run import RECIPE_FILE

    run_dir = run_folder(args.checkpoint)
    held_out = "val_fraction" in args  # eval's: fewshot holds nothing out
    if args.dataset is None:
        if run_dir is None:
            raise ConfigError(f"{args.checkpoint}: no run beside it records the dataset it was trained on; pass "
                              f"--dataset (digits, mnist, cifar10, npz:PATH, imagefolder:PATH, ...)")
        recipe = Recipe.from_dict(read_config_file(run_dir / RECIPE_FILE), str(run_dir / RECIPE_FILE))
        args.dataset, args.data_dir = recipe.dataset, args.data_dir or recipe.data_dir
        if held_out and args.val_fraction is None:
            args.val_fraction = recipe.val_fraction
        print(f"dataset {args.dataset}, as recorded by the run in {run_dir}", file=sys.stderr)
        if args.out is None:  # the run's own measurement; another dataset's would overwrite the run's reports
            args.out = run_dir
    if held_out and args.val_fraction is None:
        args.val_fraction = DEFAULT_VAL_FRACTION


FEWSHOT_FILE, BENCH_FILE = "fewshot.json", "bench.json"


def write_json(folder: str, name: str, data: object) -> Path:
    """``folder/name`` holding ``data`` as JSON, written atomically: what an ``--out DIR`` receives."""
    from .atomic import atomic_file

    path = Path(folder) / name
    with atomic_file(path) as handle:
        json.dump(data, handle, indent=1)
    return path


def cmd_fewshot(args: argparse.Namespace) -> int:
    """Few-shot linear evaluation (the paper's protocol), with ``--linear-probe`` the full probe, and with
    ``--knn`` k-NN classification (DINO's protocol) from the same frozen representations."""
    from .data import SplitSpec, default_split, evaluation_loader, load_splits
    from .evaluate.fewshot import VALIDATION_PER_CLASS, extract_features, fewshot_evaluate, linear_probe
    from .evaluate.knn import check_knn, knn_evaluate

    device = select_device(args.device)
    model = load_checkpoint(args).to(device)
    config = model.config
    _run_defaults(args)
    transform = checkpoint_transform(config, args.resize)
    split = args.split or default_split(args.dataset)
    drawn = split in (ALL, "train")  # support and query are drawn from the same images
    splits = load_splits(args.dataset, (split,) if drawn else ("train", split), args.data_dir, SplitSpec(0.0))
    if args.knn:  # before the features are computed: a bank too small for k is known from the split's size
        train = next(iter(splits.values()))
        check_knn(args.knn, min(args.shots) * len(train.classes) if args.shots else len(train), args.knn_temperature)
    features = {}
    for name, dataset in splits.items():
        loader = evaluation_loader(dataset, transform, args.batch_size, device=device)
        with autocast(device, resolve_precision(args.precision, device)):
            features[name] = extract_features(model, loader, device)
    if drawn:
        support, query, shots, validation = _drawn_support(args, split, *features[split])
    else:
        support, query, shots, validation = features["train"], features[split], args.shots or DEFAULT_SHOTS, \
            VALIDATION_PER_CLASS
    results = fewshot_evaluate(*support, *query, shots=shots, seeds=range(args.seeds), l2_regs=args.l2,
                               validation_per_class=validation)
    rows = [[r.shots, f"{100 * r.mean:.2f}%", f"{100 * r.std:.2f}", f"{r.selected_l2:g}"] for r in results]
    report: dict = {"checkpoint": args.checkpoint, "dataset": args.dataset, "split": split,
                    "fewshot": {r.shots: {"mean": r.mean, "std": r.std, "l2": r.selected_l2, "per_seed": r.selected}
                                for r in results}}
    if args.linear_probe:
        accuracy, l2 = linear_probe(*support, *query, l2_regs=args.l2)
        rows.append(["all", f"{100 * accuracy:.2f}%", "-", f"{l2:g}"])
        report["linear_probe"] = {"accuracy": accuracy, "l2": l2}
    print(f"{args.dataset}: linear classifier on frozen representations, {args.seeds} seeds")
    print_table(["shots", "test accuracy", "std", "l2"], rows)
    if args.knn:
        found = knn_evaluate(*support, *query, args.knn, args.knn_temperature, args.shots,
                             range(args.seeds))
        report["knn"] = {"temperature": args.knn_temperature, "results": [dataclasses.asdict(r) for r in found]}
        print(f"\n{args.dataset}: k-NN on frozen representations (cosine, votes weighted by exp(similarity / "
              f"{args.knn_temperature:g})), memory bank: " + (f"shots per class, {args.seeds} seeds" if args.shots
                                                             else "every training image"))
        print_table(["k", "shots", "top-1", "top-5", "std"], [
            [r.k, r.shots or "all", f"{100 * r.top1:.2f}%", "-" if r.top5 is None else f"{100 * r.top5:.2f}%",
             f"{100 * r.std:.2f}" if r.shots else "-"] for r in found])
    if args.out:
        print(f"numbers in {write_json(args.out, FEWSHOT_FILE, report)}")
    return 0


def _drawn_support(args: argparse.Namespace, split: str, features, labels) -> tuple[tuple, tuple, list[int], int]:
    """Support and query (features, labels) drawn from the one set of images of ``split`` (seed 0), said in one
    line; with the shot counts measured and the examples of each class that choose the regulariser."""
    from .evaluate.fewshot import split_support_query

    drawn = split_support_query(labels, args.shots, seed=0)
    print(f"{args.dataset} [{split}]: support drawn from {drawn.per_class} images of each class (seed 0: "
          f"{' '.join(map(str, drawn.shots))} shots and {drawn.validation_per_class} to choose the regulariser), "
          f"query: the other {len(drawn.query)} images")
    return ((features[drawn.support], labels[drawn.support]), (features[drawn.query], labels[drawn.query]),
            drawn.shots, drawn.validation_per_class)


def _data_splits(args: argparse.Namespace, corrupt: str) -> dict:
    from .data import SplitSpec, load_splits, split_names

    return load_splits(args.dataset, split_names(args.dataset), args.data_dir, SplitSpec(args.val_fraction), corrupt)


def cmd_data_info(args: argparse.Namespace) -> int:
    """Split sizes, classes and images per class of a dataset (nothing decoded)."""
    from .data.survey import describe

    report = describe(_data_splits(args, args.corrupt))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    splits = report["splits"]
    print_table(["split", "images", "classes"], [[name, split["images"], len(split["per_class"])]
                                                 for name, split in splits.items()])
    print()
    print_table(["class", *splits], [[name, *(split["per_class"].get(name, 0) for split in splits.values())]
                                     for name in report["classes"]])
    return 0


def cmd_data_verify(args: argparse.Namespace) -> int:
    """Decode every image of the dataset in parallel; list the unreadable ones (exit 1 if any)."""
    from .data import load_dataset
    from .data.survey import unreadable_images

    check_workers(args.num_workers)
    bad = unreadable_images(load_dataset(args.dataset, ALL, args.data_dir, corrupt="skip"), args.num_workers)
    for name in bad:
        print(name)
    print(f"{args.dataset}: {len(bad)} unreadable image(s)", file=sys.stderr)
    return 1 if bad else 0


def cmd_data_convert(args: argparse.Namespace) -> int:
    """Write a dataset as WebDataset shards (train/val/test-NNNNNN.tar and classes.txt)."""
    from .data.convert import parse_size, write_webdataset

    written = write_webdataset(_data_splits(args, "fail"), args.dst, parse_size(args.shard_size))
    print_table(["split", "images"], list(written.items()))
    print(f"shards in {args.dst}; train from them with --dataset webdataset:{args.dst}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    """Top-k labels with probabilities for each image file; with --features, each image's dense patch features
    and pooled embedding written to one file."""
    from .evaluate import predict
    from .evaluate.predict import feature_file, save_features

    if args.features:
        feature_file(args.features)
        if Path(args.checkpoint).suffix in (".onnx", ".xml"):
            raise ConfigError(f"--features: {args.checkpoint} is an exported graph that gives logits only; pass the "
                              "checkpoint it was exported from")
    model, device, dtype = inference_model(args)
    check_graph_inputs(model, args.checkpoint, args.max_patches)
    if args.max_patches:
        if args.keep_aspect:
            raise ConfigError("--keep-aspect and --max-patches: pick one way to keep each image's aspect ratio")
    predictions = predict(model, inputs.image_files(args.images), args.top_k, device, dtype, args.resize,
                          bool(args.features), args.keep_aspect, args.max_patches)
    if args.json:
        print(json.dumps([prediction_record(prediction) for prediction in predictions], indent=1))
    else:
        for prediction in predictions:
            ranked = ", ".join(f"{escape_name(label)} {100 * p:.1f}%"
                               for label, p in zip(prediction.labels, prediction.probabilities))
            if prediction.features is not None:
                ranked = f"features {'x'.join(map(str, prediction.features.shape))}" + (f"; {ranked}" if ranked else "")
            print(f"{prediction.path}: {ranked}")
    if args.features:
        print(f"dense features and embeddings in {save_features(predictions, args.features)}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def prediction_record(prediction) -> dict:
    """One image's line of ``predict --json``: its file, the top classes with their probabilities, and the shape
    of its dense features where they were asked for."""
    record = {"image": str(prediction.path),
              "top_k": [{"label": label, "probability": round(p, 6)}
                        for label, p in zip(prediction.labels, prediction.probabilities)]}
    if prediction.features is not None:
        record["features_shape"] = list(prediction.features.shape)
    return record


def cmd_bench(args: argparse.Namespace) -> int:
    """Inference and training-step throughput of a model in every runtime and precision available here."""
    from .benchmark import TABLE_HEADER, bench

    device = select_device(args.device)
    overrides = {**args.overrides, **({"image_size": args.image_size} if args.image_size else {})}
    check_bench_size(args, overrides, device)
    if Path(args.checkpoint).exists() or is_remote(args.checkpoint):
        model = load(args.checkpoint, **overrides)
    else:
        model = create_model(args.checkpoint, **overrides)
    rows, skipped = bench(model, args.batch_size, device, args.runtimes, args.precision, args.repeats,
                          peak_size=args.peak_size)
    height, width = model.config.image_size
    threads, load_now, records = torch.get_num_threads(), os.getloadavg()[0], [row.to_dict() for row in rows]
    if args.out:
        written = write_json(args.out, BENCH_FILE, {
            "model": args.checkpoint, "image_size": [height, width], "batch_size": args.batch_size,
            "device": str(device), "threads": threads, "load": load_now, "repeats": args.repeats,
            "rows": records, "skipped": skipped})
        print(f"numbers in {written}", file=sys.stderr)
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    print(f"{args.checkpoint} at {height}x{width}, batch {args.batch_size} on {device} "
          f"({threads} threads, load {load_now:.1f}); median of {args.repeats} interleaved "
          f"repeats; GEMM peak at n={args.peak_size}")
    print_table(TABLE_HEADER, [row.cells() for row in rows])
    for runtime, reason in skipped.items():
        print(f"skipped {runtime}: {reason}")
    return 0


SPLIT_CHOICES = (*SPLITS, ALL)
SPLIT_HELP = ("the images measured: a split, or all of them (default: the dataset's test split, else its validation "
              "split, else all of a dataset that names neither, such as a folder of class folders; a split the "
              "dataset lacks is held out of its training images as a training run holds it out)")


# Runtimes of `vitkit bench` that hold a copy of the weights of their own (the eager model and its training copy
# are counted apart; a compiled model shares the eager one's).
_COPYING_RUNTIMES = ("onnxruntime", "openvino", "timm", "timm-compile")


def check_bench_size(args: argparse.Namespace, overrides: dict, device: torch.device) -> None:
    """Refuse a benchmark that cannot fit before its model is built: the peak of a training step at the batch and
    size asked for, with a copy of the weights per runtime compared, against what the machine has."""
    config = source_config(args.checkpoint, overrides)
    size = pair(overrides.get("image_size", config.image_size))  # a checkpoint's table is resized after loading
    copies = 2 + sum(runtime in _COPYING_RUNTIMES for runtime in args.runtimes)

    def measure(plan: Plan):
        return estimate(config, plan.batch, plan.image_size, training=True, device=device.type,
                        weight_copies=copies)

    check(Plan(args.batch_size, size, stride=config.effective_patch_size), measure, "vitkit bench", device=device)


def _resize_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resize", choices=RESIZE_MODES, default="crop",
                        help="crop: scale to cover the size / the checkpoint's crop_pct, then centre-crop (aspect "
                             "kept); stretch: resize straight to the size")


def _max_patches_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-patches", type=_patch_budget, metavar="N",
                        help="NaFlex: run each image at its own aspect ratio, resized to the most patches within N "
                             "(SigLIP 2's rule), instead of resizing to the model's square size")


def check_graph_inputs(model: object, checkpoint: str, max_patches: int | None) -> None:
    """An exported graph takes image tensors or NaFlex batches, as it was exported; a PyTorch model takes both."""
    if isinstance(model, VisionTransformer) or bool(max_patches) == model.naflex:
        return
    if max_patches:
        raise ConfigError(f"--max-patches: {checkpoint} was exported for image tensors; export it again with "
                          f"`vitkit convert ... --naflex`, or use the PyTorch checkpoint")
    raise ConfigError(f"{checkpoint} was exported for NaFlex batches; pass --max-patches N (N patches an image)")


def _runtime_flags(parser: argparse.ArgumentParser, precision: bool = True) -> None:
    parser.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")
    if precision:
        parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                            help="compute precision (autocast); auto: bf16 where the hardware runs it natively")


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that refuses an unknown option with the usage of the (sub)command it was given to and
    that command's closest options (``vitkit train --learning-rate 1e-3``: did you mean --lr?)."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command_parser(parsed)
            command.error(f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(extras, command)}")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost subcommand's parser that ``parsed`` went through (``vitkit data info``: info's)."""
        parser: argparse.ArgumentParser = self
        while True:
            chosen = next((action.choices.get(getattr(parsed, action.dest, None)) for action in parser._actions
                           if isinstance(action, argparse._SubParsersAction)), None)
            if chosen is None:
                return parser
            parser = chosen


def _did_you_mean(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """``; did you mean --lr?`` for each unknown option among ``extras`` that is close to one of ``parser``'s:
    the same words with ``_`` for ``-``, their initials (learning-rate: lr), or a near spelling."""
    options = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
    hints = []
    for word in extras:
        if not word.startswith("--"):
            continue
        name = word[2:].split("=", 1)[0].replace("_", "-").lower()
        initials = "".join(part[0] for part in name.split("-") if part)
        close = [option for option in options if option[2:] in (name, initials)] or \
            difflib.get_close_matches(f"--{name}", options, n=3, cutoff=0.6)
        if close:
            hints.append(f"{word.split('=', 1)[0]}: did you mean {' or '.join(close)}?")
    return "".join(f"; {hint}" for hint in hints)


# What `vitkit COMMAND --help` says above and below the flags: one line, and examples for the main commands.
COMMAND_HELP: dict[str, tuple[str, str | None]] = {
    "vitkit": ("Vision Transformers: load any checkpoint, train, fine-tune, evaluate, analyse, export and benchmark.",
               "examples:\n"
               "  vitkit train                                  a small ViT on the embedded digits\n"
               "  vitkit info hf-hub:google/vit-base-patch16-224\n"
               "  vitkit eval runs/x/model --dataset mnist --data-dir data\n"
               "  vitkit COMMAND --help                         the flags of one command"),
    "models": ("List the named ViT variants with their layers, width, heads, parameters and GFLOPs.",
               "example:\n  vitkit models ViT-B/16 DINOv2-S/14 --image-size 384"),
    "info": ("Describe a checkpoint of any format: config, parameters, input size and numerics.",
             "example:\n  vitkit info hf-hub:timm/vit_small_patch16_224.augreg_in21k_ft_in1k --json"),
    "convert": ("Convert a checkpoint to another format, or export it to ONNX or OpenVINO (checked after writing).",
                "examples:\n"
                "  vitkit convert ViT-B_16.npz runs/vit-b --to native\n"
                "  vitkit convert runs/x/model model.onnx --to onnx --quantize int8\n"
                "  vitkit convert runs/x/model model.xml --to openvino"),
    "analyze": ("Attention rollout, attention distance, position similarity and filter figures, with an HTML page.",
                "examples:\n"
                "  vitkit analyze runs/x/model --out analysis\n"
                "  vitkit analyze runs/x/model --images cat.jpg photos/ --out analysis"),
    "train": ("Train a ViT from a recipe: a preset, a --config file and flags (no flags: digits).",
              "examples:\n"
              "  vitkit train\n"
              "  vitkit train --preset mnist --data-dir data --run-dir runs/mnist\n"
              "  vitkit train --resume --run-dir runs/mnist\n"
              "  torchrun --nproc_per_node=2 -m vitkit train --preset mnist"),
    "pretrain": ("Self-supervised pre-training by masked patch prediction (section 4.6); labels are not used.",
                 "example:\n  vitkit pretrain --dataset fashion-mnist --data-dir data --steps 1500 --run-dir runs/mpp"),
    "finetune": ("Fine-tune a checkpoint at the data's size: its head kept where the classes match, else a new one.",
                 "example:\n  vitkit finetune runs/fashion/model --dataset mnist --image-size 56 --steps 300"),
    "eval": ("Top-1/top-5 accuracy, per-class accuracy and a confusion matrix of a checkpoint on a dataset.",
             "examples:\n"
             "  vitkit eval runs/x/model --dataset mnist --data-dir data --out runs/x\n"
             "  vitkit eval model.onnx --dataset imagefolder:photos --split all"),
    "fewshot": ("Few-shot linear evaluation of frozen representations, with a linear probe and k-NN on request.",
                "example:\n  vitkit fewshot runs/x/model --dataset mnist --data-dir data --shots 1 5 10 25 --knn 20"),
    "data": ("Inspect, check and convert datasets.", None),
    "data info": ("Split sizes, classes and images per class of a dataset; nothing is decoded.", None),
    "data verify": ("Decode every image of a dataset once, in parallel, and list the unreadable ones (exit 1).", None),
    "data convert": ("Write a dataset as WebDataset shards.",
                     "example:\n  vitkit data convert imagefolder:/data/imagenet /data/in1k-wds --shard-size 256MB"),
    "predict": ("The most probable classes of image files, folders or glob patterns.",
                "examples:\n"
                "  vitkit predict runs/x/model cat.jpg photos/ --top-k 3\n"
                "  vitkit predict runs/x/model 'img/*.jpg' --json"),
    "bench": ("Inference and training-step throughput in every runtime and precision the machine has, against timm.",
              "example:\n  vitkit bench ViT-S/16 --batch-size 16 --runtimes eager onnxruntime timm"),
}


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give the parser and each subcommand (``data``'s too) its line of COMMAND_HELP and its examples, laid out
    as written."""
    commands = [("vitkit", parser)]
    for name, command in commands:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                commands += [(f"{name} {sub}".removeprefix("vitkit "), choice) for sub, choice in action.choices.items()]
        command.description, command.epilog = COMMAND_HELP[name]
        if name in ("train", "pretrain", "finetune"):  # every preset's values, after the examples
            command.epilog = f"{command.epilog}\n\n{_presets_epilog()}" if command.epilog else _presets_epilog()
        command.formatter_class = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vitkit")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="list the named ViT variants")
    models.add_argument("names", nargs="*", help="variants to show (default: all named ones)")
    models.add_argument("--image-size", type=_image_size, metavar="HxW",
                        help="e.g. 224 or 384x512 (default: the variant's)")
    models.add_argument("--num-classes", type=_count, help="default: the variant's (1000, or 0 for a bare tower)")
    models.set_defaults(run=cmd_models)

    info = sub.add_parser("info", help="describe a checkpoint")
    _checkpoint_flags(info)
    info.add_argument("--json", action="store_true", help="machine-readable output")
    _runtime_flags(info, precision=False)
    info.set_defaults(run=cmd_info)

    conv = sub.add_parser("convert", help="convert a checkpoint between formats")
    _checkpoint_flags(conv, help="vitkit/HF directory, .npz, timm/torchvision state dict, hf-hub:ORG/NAME, gs://...")
    conv.add_argument("dst", metavar="DST", help="the file or folder to write: .onnx, .xml (OpenVINO), .npz "
                      "(Google), .safetensors (timm), or a folder (vitkit's own unless --to says hf or timm)")
    conv.add_argument("--to", choices=FORMATS, help="the format (default: the one DST's extension names)")
    conv.add_argument("--quantize", choices=QUANTIZATIONS,
                      help="ONNX and OpenVINO: int8 matrix products (static with --calibration; ONNX without it: "
                           "dynamic, activations quantised on the fly)")
    conv.add_argument("--calibration", metavar="DATASET", help="int8: calibrate activation scales on this dataset's "
                      "train split, read through the checkpoint's evaluation preprocessing (needed for OpenVINO)")
    conv.add_argument("--calibration-size", type=_positive, default=CALIBRATION_IMAGES, metavar="N",
                      help=f"calibration images, drawn with a fixed seed (default: {CALIBRATION_IMAGES})")
    conv.add_argument("--data-dir", help="where --calibration lies (torchvision layout)")
    conv.add_argument("--naflex", action="store_true",
                      help="ONNX and OpenVINO: a graph taking NaFlex batches (patches, coords, mask, grids: images at "
                           "their own aspect ratio, run with --max-patches) instead of image tensors")
    _runtime_flags(conv, precision=False)
    conv.set_defaults(run=cmd_convert)
    analyze = sub.add_parser("analyze", help="attention rollout, attention distance, embedding figures and a report")
    _checkpoint_flags(analyze)
    source = analyze.add_mutually_exclusive_group()
    source.add_argument("--images", nargs="+", metavar="PATH",
                         help="image files, directories or quoted glob patterns; a file under a folder named like "
                              "one of the model's classes is labelled with it (default: scikit-learn's two sample "
                              "photos)")
    source.add_argument("--dataset", help=f"analyse a random sample of this dataset's test split instead "
                                          f"({DATASET_FORMS})")
    analyze.add_argument("--data-dir", help="where --dataset lies (torchvision layout)")
    analyze.add_argument("--num-images", type=_positive, default=64, help="size of the --dataset sample")
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--out", required=True, metavar="DIR", help="folder for figures, numbers and index.html")
    analyze.add_argument("--image-size", type=_image_size, metavar="HxW",
                         help="input size (default: the checkpoint's)")
    analyze.add_argument("--mean", type=_finite_number, nargs="+",
                         help="per-channel input mean (default: the checkpoint's normalisation's)")
    analyze.add_argument("--std", type=_positive_number, nargs="+",
                         help="per-channel input std (default: the checkpoint's; each flag falls back on its own)")
    analyze.add_argument("--batch-size", "-b", type=_positive, default=8)
    analyze.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean")
    analyze.add_argument("--discard-ratio", type=_fraction, default=0.0,
                         help="fraction of the weakest attention weights dropped before rollout")
    analyze.add_argument("--readout", choices=list(READOUTS),
                         help="the output the rollout is read from: token, the [class] row; mean, the mean of the "
                              "patch rows; probe, the attention pool's probe (default: where the model's head reads, "
                              "as vitkit.analysis.rollout: token under pool='token', mean under 'gap', probe under "
                              "'map'; prefix and register tokens are never on the image grid)")
    analyze.add_argument("--overlays", type=_count, default=8, help="how many rollout overlays to draw")
    analyze.add_argument("--filters", type=_positive, default=28, help="principal components of the patch filters")
    _resize_flag(analyze)
    _max_patches_flag(analyze)
    _runtime_flags(analyze)
    analyze.set_defaults(run=cmd_analyze)
    for name, helptext in (("train", "train a ViT (no arguments: digits, test accuracy)"),
                           ("pretrain", "self-supervised pre-training: masked patch prediction (section 4.6)"),
                           ("finetune", "fine-tune a checkpoint at a new resolution")):
        parser_ = sub.add_parser(name, help=helptext)
        if name == "finetune":
            parser_.add_argument("checkpoint", metavar="CHECKPOINT", help="anything vitkit.load reads")
        parser_.add_argument("--preset", choices=sorted(RECIPE_PRESETS), help=_preset_help(name))
        parser_.add_argument("--config", help="recipe file (YAML or JSON) applied over the preset")
        parser_.add_argument("--resume", action="store_true",
                             help="continue the run in --run-dir from its last checkpoint")
        _runtime_flags(parser_, precision=False)  # --precision is a recipe field
        _recipe_flags(parser_)
        parser_.set_defaults(run=cmd_train, **({"objective": "mpp"} if name == "pretrain" else {}))

    evaluate_ = sub.add_parser("eval", help="accuracy, per-class accuracy and confusion matrix of a checkpoint")
    _checkpoint_flags(evaluate_, help="anything vitkit.load reads, or an .onnx file")
    evaluate_.add_argument("--dataset", help=f"{DATASET_FORMS} (default: the dataset of the checkpoint's run)")
    evaluate_.add_argument("--data-dir")
    evaluate_.add_argument("--split", choices=SPLIT_CHOICES, help=SPLIT_HELP)
    evaluate_.add_argument("--val-fraction", type=_fraction, help=f"images held out where the dataset lacks the "
                           f"split (default: the run's, else {DEFAULT_VAL_FRACTION})")
    evaluate_.add_argument("--corrupt", default="fail", choices=CORRUPT)
    evaluate_.add_argument("--batch-size", "-b", type=_positive, default=256)
    evaluate_.add_argument("--num-workers", "-j", type=_count, default=0)
    evaluate_.add_argument("--out", metavar="DIR", help="folder for eval-<split>.json and confusion-<split>.png "
                           "(default: the checkpoint's run folder, else none)")
    _resize_flag(evaluate_)
    _max_patches_flag(evaluate_)
    _runtime_flags(evaluate_)
    evaluate_.set_defaults(run=cmd_eval)

    fewshot = sub.add_parser("fewshot", help="few-shot linear evaluation of frozen representations")
    _checkpoint_flags(fewshot)
    fewshot.add_argument("--dataset", help=f"{DATASET_FORMS} (default: the dataset of the checkpoint's run)")
    fewshot.add_argument("--data-dir")
    fewshot.add_argument("--split", choices=SPLIT_CHOICES, help=SPLIT_HELP + "; the support images come from the "
                         "train split, or are drawn from the images measured when that is train or all")
    fewshot.add_argument("--shots", type=_positive, nargs="+",
                         help=f"training images per class (default: {' '.join(map(str, DEFAULT_SHOTS))}); with "
                              f"--knn, also the k-NN memory banks, which are otherwise every training image")
    fewshot.add_argument("--seeds", type=_repeats, default=5, help="repeats with different shots")
    fewshot.add_argument("--l2", type=_regularizer, nargs="+", default=list(DEFAULT_L2_REGS),
                         help="regularisers tried; one is chosen on held-out training images")
    fewshot.add_argument("--linear-probe", action="store_true", help="also fit on every training image")
    fewshot.add_argument("--knn", type=_positive, nargs="+", metavar="K",
                         help="also k-NN classification with K neighbours (DINO's: cosine similarity, each "
                              "neighbour's vote weighted by exp(similarity / T)), for each K given")
    fewshot.add_argument("--knn-temperature", type=_positive_number, default=DEFAULT_TEMPERATURE, metavar="T",
                         help=f"T of the k-NN votes (default: {DEFAULT_TEMPERATURE:g}, DINO's): lower trusts the "
                              "nearest neighbours more")
    fewshot.add_argument("--batch-size", "-b", type=_positive, default=256)
    fewshot.add_argument("--out", metavar="DIR", help=f"folder that receives the numbers as {FEWSHOT_FILE} "
                         f"(default: the checkpoint's run folder, else none)")
    _resize_flag(fewshot)
    _runtime_flags(fewshot)
    fewshot.set_defaults(run=cmd_fewshot)

    data = sub.add_parser("data", help="inspect, check and convert datasets").add_subparsers(dest="data_command",
                                                                                          required=True)
    info_ = data.add_parser("info", help="split sizes, classes and images per class")
    verify = data.add_parser("verify", help="decode every image in parallel; list the unreadable ones")
    convert_ = data.add_parser("convert", help="write a dataset as WebDataset shards")
    for command, run_ in ((info_, cmd_data_info), (verify, cmd_data_verify), (convert_, cmd_data_convert)):
        command.add_argument("dataset", metavar="SRC" if command is convert_ else "DATASET",
                             help="imagefolder:PATH, webdataset:ROOT, hf:PATH, mnist, npz:PATH, ...")
        command.add_argument("--data-dir", help="where torchvision's datasets lie")
        command.add_argument("--val-fraction", type=_fraction, default=0.1,
                             help="validation images held out of train where the dataset has no val split")
        command.set_defaults(run=run_)
    info_.add_argument("--json", action="store_true", help="machine-readable output")
    info_.add_argument("--corrupt", default="fail", choices=CORRUPT,
                       help="skip: list shards' unusable samples instead of stopping at the first")
    verify.add_argument("--num-workers", "-j", type=_positive, default=usable_cpus(),
                        help="decoding processes, at most the CPUs this process may run on (default: all of them)")
    convert_.add_argument("dst", metavar="DST", help="a new folder for the shards")
    convert_.add_argument("--to", choices=["webdataset"], default="webdataset")
    convert_.add_argument("--shard-size", default="256MB",
                          help="image and label bytes a shard (tar headers add ~1 kB a file), e.g. 256MB, 1GB")

    predict_ = sub.add_parser("predict", help="top-k labels of image files")
    _checkpoint_flags(predict_, help="anything vitkit.load reads, or an .onnx file")
    predict_.add_argument("images", nargs="+", metavar="IMAGE",
                          help="image files, folders (every image below them) or quoted glob patterns ('img/*.jpg')")
    predict_.add_argument("--json", action="store_true", help="the predictions as a JSON list on stdout")
    predict_.add_argument("--top-k", type=_positive, default=5, metavar="K",
                          help="how many of the most probable classes to list for each image (default: 5)")
    predict_.add_argument("--features", metavar="OUT", help="also write each image's dense patch features (D, H/P, "
                          "W/P) and pooled embedding to OUT (.npz or .safetensors)")
    predict_.add_argument("--keep-aspect", action="store_true",
                          help="resize each image to its own aspect ratio, the shorter side to the model's, both "
                               "sides rounded to the patch size (no crop), instead of --resize")
    _resize_flag(predict_)
    _max_patches_flag(predict_)
    _runtime_flags(predict_)
    predict_.set_defaults(run=cmd_predict)

    from .benchmark import RUNTIMES

    bench_ = sub.add_parser("bench", help="throughput per runtime and precision, against the GEMM peak and timm")
    _checkpoint_flags(bench_, help="a checkpoint, or a named variant such as ViT-S/16 (random weights)")
    bench_.add_argument("--batch-size", "-b", type=_positive, default=8)
    bench_.add_argument("--image-size", type=_image_size, metavar="HxW", help="input size (default: the model's)")
    _runtime_flags(bench_, precision=False)
    bench_.add_argument("--precision", nargs="+", choices=("fp32", "bf16", "fp16", "int8"),
                        help="only these (default: fp32, the low precision the device runs natively, int8 ONNX)")
    bench_.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES))
    bench_.add_argument("--repeats", type=_positive, default=5)
    bench_.add_argument("--peak-size", type=_positive, default=2048, help="side of the GEMM that measures the peak")
    bench_.add_argument("--json", action="store_true", help="the rows as a JSON list")
    bench_.add_argument("--out", metavar="DIR", help=f"folder that receives the rows and their setting as {BENCH_FILE}")
    bench_.set_defaults(run=cmd_bench)

    debug = dict(action="store_true", help="show the traceback of an error (also: VITKIT_DEBUG=1)")
    parser.add_argument("--debug", **debug)
    for command in sub.choices.values():  # also after the command: vitkit train --debug
        command.add_argument("--debug", **debug, default=argparse.SUPPRESS)
    _describe(parser)
    return parser


# Exit statuses: 2 for a command line or recipe that cannot work (as argparse's own usage errors), 1 for
# a failure while running (a bad file, a full disk, a diverged run), 130 when interrupted by Ctrl-C.
USAGE_ERROR, RUNTIME_ERROR, INTERRUPTED = 2, 1, 130


def describe(error: BaseException) -> str:
    """One line naming what was wrong: an OS error as ``FILE: reason`` rather than ``[Errno 2] ...``."""
    if isinstance(error, OSError) and error.strerror:
        names = " -> ".join(os.fsdecode(name) if isinstance(name, bytes) else str(name)
                            for name in (error.filename, error.filename2) if name is not None)
        return f"{names}: {error.strerror}" if names else error.strerror
    text = str(error) or type(error).__name__
    if "\nOriginal Traceback" in text:  # raised in a DataLoader worker: torch put its traceback into the message
        text = text.rstrip().rsplit("\n", 1)[-1].split(": ", 1)[-1]
    return text


@contextlib.contextmanager
def library_messages() -> Iterator[None]:
    """While a command runs, the messages vitkit's modules log (``logging``, INFO and up) are plain lines on
    stderr, as the command's own; on a terminal they appear above any progress bar."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    logger = logging.getLogger("vitkit")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with logging_redirect_tqdm([logger]):
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; errors the user can act on are one line on stderr (``--debug`` or
    ``VITKIT_DEBUG=1`` adds the traceback), anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("VITKIT_DEBUG", "") not in ("", "0")
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        with library_messages():
            return run(args)
    except (VitkitError, OSError, ImportError) as error:
        if debug:
            traceback.print_exc()
        print(f"vitkit {args.command}: error: {describe(error)}", file=sys.stderr)
        return USAGE_ERROR if isinstance(error, ConfigError) else RUNTIME_ERROR
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"vitkit {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


def program() -> typing.NoReturn:
    """The ``vitkit`` program. A process that torchrun started ends at once when its command has
    returned (``os._exit``): the interpreter's teardown is skipped, since gloo's threads, torn down
    there, could still abort a run that had finished ("terminate called without an active exception")."""
    code = main()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    program()
