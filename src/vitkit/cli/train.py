"""``vitkit train``, ``pretrain`` and ``finetune``: a recipe read off the command line (a preset, a ``--config``
file and one flag per recipe field), then trained."""

from __future__ import annotations

import argparse
import os
import textwrap

from ..train.distributed import leave
from ..train.launch import train
from ..declare import help_of
from ..declare_flags import FLAG_PREFIX
from ..train.presets import DEFAULT_PRESETS, DENSE_PRESETS, MODEL_ARGS_FLAG, RECIPE_PRESETS, add_recipe_flags, recipe_from_args
from ..train.recipes import Model
from .flags import override_flags, percent, print_table, runtime_flags

EXAMPLES: dict[str, tuple[str, str | None]] = {
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
}


def _preset_help(command: str) -> str:
    """``--preset``'s help: what a run starts from without one."""
    default = DEFAULT_PRESETS[command == "finetune"]
    return (f"named recipe to start from, listed below (default: the {default} preset's training settings, the "
            f"{' or '.join(sorted(set(DENSE_PRESETS.values())))} preset's for --objective segmentation or depth (by "
            f"--head), the input's size, channels and patch "
            f"from the data{' and the checkpoint' if command == 'finetune' else ''})")


def _presets_epilog() -> str:
    """The end of the training commands' help: every preset with its values, one paragraph each."""

    def shown(value: object) -> str:
        return "(" + " ".join(f"{k}={shown(v)}" for k, v in value.items()) + ")" if isinstance(value, dict) \
            else str(value)

    paragraphs = [textwrap.fill(f"{name}: " + ", ".join(f"{key}={shown(value)}" for key, value in values.items()),
                                width=100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
                  for name, values in RECIPE_PRESETS.items()]
    return "\n".join(["A recipe flag overrides the --config file, which overrides the --preset. Presets:", *paragraphs])


# Each command's help ends with every preset's values, after its examples.
HELP = {name: (line, f"{examples}\n\n{_presets_epilog()}") for name, (line, examples) in EXAMPLES.items()}


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train``, ``pretrain`` and ``finetune`` to ``sub``, the subparsers of ``vitkit``."""
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
        runtime_flags(parser_, precision=False)  # --precision is a recipe field
        groups = add_recipe_flags(parser_)
        override_flags(groups["model"], dest=MODEL_ARGS_FLAG, json_alias=True, help=help_of(Model, "args"))
        parser_.set_defaults(run=run, **({FLAG_PREFIX + "objective.kind": "mpp"} if name == "pretrain" else {}))


def run(args: argparse.Namespace) -> int:
    """Train a ViT (default: a small one on the embedded digits, about 20-35 s on 2 CPU cores; on another
    dataset, a small one sized from its images); ``vitkit finetune CHECKPOINT`` fine-tunes (section 3.2: the
    data's resolution unless asked, a new zero head unless the classes are the checkpoint's, SGD)."""
    summary = train(recipe_from_args(args), resume=args.resume, device=args.device, command=f"vitkit {args.command}")
    leave()
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 alone reports
        return 0
    rows = [[key, f"{value:.4f}" if isinstance(value, float) else value] for key, value in summary.items()]
    print_table(["metric", "value"], rows)
    if "test/accuracy" in summary:
        print(f"{summary['test/split']} accuracy: {100 * summary['test/accuracy']:.2f}% "
              f"({summary['test/images']} images)")
    elif "test/mIoU" in summary:
        print(f"{summary['test/split']} mIoU: {percent(summary['test/mIoU'])}, aAcc {percent(summary['test/aAcc'])} "
              f"({summary['test/images']} images)")
    elif "test/abs_rel" in summary:
        print(f"{summary['test/split']} depth: AbsRel {summary['test/abs_rel']:.4f}, RMSE {summary['test/rmse']:.4f} m, "
              f"delta<1.25 {percent(summary['test/a1'])} ({summary['test/images']} images)")
    else:
        print(f"pre-trained encoder saved in {summary['run_dir']}/model; fine-tune it with `vitkit finetune`")
    return 0
