"""What the commands share: the types their flags read (each held to the rule a recipe field of the same kind
states), the flags that read a checkpoint, its overrides, the device and the input geometry, the defaults that
``eval`` and ``fewshot`` take from a checkpoint's run, and the aligned tables the commands print."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from ..checkpoints import load
from ..classnames import escape_name
from ..data import ALL, RESIZE_MODES, SPLITS
from ..data.splits import SUITE_SPLITS
from ..declare import Float, Int
from ..declare_flags import reader
from ..errors import parse_json
from ..evaluate.accuracy import DEFAULT_VAL_FRACTION
from ..models.config import pair
from ..runtime import PRECISIONS
from ..train.recipes import IMAGE_SIZE
from ..train.records import recorded_data


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """``rows`` under ``header`` in aligned columns; each cell one printable line (class names may hold anything:
    see ``classnames``)."""
    cells = [[escape_name(str(c)) for c in header]] + [[escape_name(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for index, row in enumerate(cells):
        print("  ".join(c.rjust(w) if index and c[:1].isdigit() else c.ljust(w) for c, w in zip(row, widths)))
        if index == 0:
            print("  ".join("-" * w for w in widths))


def load_checkpoint(args: argparse.Namespace):
    """The model of the command's CHECKPOINT with its ``--set`` overrides and ``--adapter``."""
    return load(args.checkpoint, adapter=args.adapter, **args.overrides)


def model_source(args: argparse.Namespace) -> str:
    """The model a command runs, as its messages and reports name it: CHECKPOINT, and the ``--adapter`` on it."""
    return args.checkpoint if args.adapter is None else f"{args.checkpoint} with adapter {args.adapter}"


def override_pair(text: str) -> dict[str, object]:
    """``key=value`` with a JSON value (``num_heads=4``, ``pool="gap"``; bare words are strings);
    ``image_size`` also takes ``H`` or ``HxW``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key == "image_size":
        return {key: image_size_type(value)}
    try:
        return {key: parse_json(value)}
    except json.JSONDecodeError:
        return {key: value}


class Overrides(argparse.Action):
    """Config overrides gathered in command-line order into one mapping: ``--set`` gives one key,
    ``--model-args`` a JSON object of them; a later value of a key wins."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest, None) or {}), **values})


def override_flags(parser: argparse.ArgumentParser, dest: str = "overrides", json_alias: bool = False,
                    help: str = "model config override, e.g. num_heads=4 for a packed qkv or ln_eps=1e-12 "
                                "(repeatable)") -> None:
    """``--set KEY=VALUE`` (and on the training commands its spellings ``--model-args JSON`` and
    ``--drop-path``): model config fields changed before the weights are loaded, or, for patch_size,
    image_size and num_classes, by surgery after."""
    default = argparse.SUPPRESS if json_alias else {}
    parser.add_argument("--set", type=override_pair, action=Overrides, dest=dest, default=default, metavar="KEY=VALUE",
                        help=help)
    if json_alias:
        parser.add_argument("--model-args", type=json_object, action=Overrides, dest=dest, default=default,
                            metavar="JSON", help='several --set at once, e.g. \'{"dim": 192, "depth": 12}\'')
        parser.add_argument("--drop-path", type=drop_path_rate, action=Overrides, dest=dest, default=default,
                            metavar="RATE", help="stochastic depth rate (timm's name for --set drop_path=RATE)")


def drop_path_rate(text: str) -> dict[str, float]:
    """``--drop-path RATE`` as the override it stands for."""
    return {"drop_path": unit_fraction(text)}


def checkpoint_flags(parser: argparse.ArgumentParser, help: str = "anything vitkit.load reads: a vitkit, HF or "
                      "timm directory, .npz, .safetensors/.pth state dict, hf-hub:ORG/NAME") -> None:
    """The positional CHECKPOINT, its ``--set`` overrides and ``--adapter``, alike on every command that reads one."""
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help=help)
    override_flags(parser)
    parser.add_argument("--adapter", metavar="DIR", help="an adapter folder (peft's LoRA/DoRA, or vitkit finetune "
                        "--peft's) applied to CHECKPOINT")


positive = reader(Int(1))
count = reader(Int(0))
integer = reader(Int())  # a number whose range a command checks itself (against the model, say)
unit_fraction = reader(Float(0, 1, high_open=True))
positive_number = reader(Float(0, low_open=True))
finite_number = reader(Float())
regularizer = reader(Float(0))
MAX_SEEDS = 1000  # few-shot repeats: each fits every shot count again
seed_repeats = reader(Int(1, MAX_SEEDS))
# Patches per image of a NaFlex batch: every image is padded to this many, so it bounds the batch's memory
# (16384 patches of 16 px hold a 2048 x 2048 image; SigLIP 2 was trained with up to 1024).
MAX_PATCHES_LIMIT = 16384
patch_budget = reader(Int(1, MAX_PATCHES_LIMIT))


def json_object(text: str) -> dict:
    """A JSON object such as ``{"depth": 8}`` (``--model-args``)."""
    try:
        value = parse_json(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text!r}") from error
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 8}}', got {text!r}")
    return value


def image_size_type(text: str) -> tuple[int, int]:
    """``224`` or ``384x512`` (height x width), in pixels, read as a recipe's ``image_size`` is."""
    return pair(reader(IMAGE_SIZE)(text))


SPLIT_CHOICES = (*SPLITS, *SUITE_SPLITS, ALL)

SPLIT_HELP = ("the images measured: a split, or all of them (default: the dataset's test split, else its validation "
              "split, else all of a dataset that names neither, such as a folder of class folders; a split the "
              "dataset lacks is held out of its training images as a training run holds it out; trainval, "
              "train800, val200 and train800val200 are the published splits of Pets, Flowers-102 and VTAB-1k)")



def resize_flag(parser: argparse.ArgumentParser) -> None:
    """``--resize``: how an image is brought to the model's size."""
    parser.add_argument("--resize", choices=RESIZE_MODES, default="crop",
                        help="crop: scale to cover the size / the checkpoint's crop_pct, then centre-crop (aspect "
                             "kept); stretch: resize straight to the size")


def slide_flag(parser: argparse.ArgumentParser) -> None:
    """``--slide [STRIDE]``: a dense model's sliding-window inference (``evaluate.slide``)."""
    parser.add_argument("--slide", type=integer, nargs="?", const=True, metavar="STRIDE",
                        help="segmentation and depth models: resize each image keeping its aspect ratio (shorter "
                             "side the model's, longer at most 4x it) and average the outputs of windows of the "
                             "model's size stepping by STRIDE pixels (default 2/3 of the window), as DINOv2 and "
                             "mmseg evaluate ADE20K")


def max_patches_flag(parser: argparse.ArgumentParser) -> None:
    """``--max-patches N``: NaFlex, each image at its own aspect ratio within N patches."""
    parser.add_argument("--max-patches", type=patch_budget, metavar="N",
                        help="NaFlex: run each image at its own aspect ratio, resized to the most patches within N "
                             "(SigLIP 2's rule), instead of resizing to the model's square size")


def runtime_flags(parser: argparse.ArgumentParser, precision: bool = True) -> None:
    """``--device`` and, unless ``precision`` is off (a command whose recipe or flags say it), ``--precision``."""
    parser.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: the best available)")
    if precision:
        parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                            help="compute precision (autocast); auto: bf16 where the hardware runs it natively")


def run_defaults(args: argparse.Namespace) -> None:
    """What ``eval`` or ``fewshot`` was not told, from the run of the checkpoint, or of its ``--adapter``
    (``train.records``): the dataset it was trained on (with its data folder and, for eval, held-out fraction)
    and then the run folder as ``--out``; without a run, ``--dataset`` is needed."""
    held_out = "val_fraction" in args  # eval's: fewshot holds nothing out
    if args.dataset is None:  # an adapter's run trained the head the model has: its dataset, not the base's
        run = recorded_data(args.adapter or args.checkpoint)
        args.dataset, args.data_dir = run.dataset, args.data_dir or run.data_dir
        if held_out and args.val_fraction is None:
            args.val_fraction = run.val_fraction
        if args.out is None:  # the run's own measurement; another dataset's would overwrite the run's reports
            args.out = run.run_dir
    if held_out and args.val_fraction is None:
        args.val_fraction = DEFAULT_VAL_FRACTION


def percent(value: float | None) -> str:
    """A fraction as a percentage with two decimals, ``-`` where undefined (``null``)."""
    return "-" if value is None else f"{100 * value:.2f}%"
