"""``vitkit transfer``: the paper's evaluation suite (Table 2) of a checkpoint: fine-tuned on each task found under
``--data-dir`` as appendix B.1.1 does, then the table row printed."""

from __future__ import annotations

import argparse
import textwrap

from ..declare_flags import add_flags, flag_values
from ..train.recipes import Peft
from ..transfer import BUDGETS, run_transfer
from ..transfer.table import TRAINED
from ..transfer.tasks import PEFT_PROTOCOL
from .flags import Overrides, override_pair, runtime_flags

HELP: dict[str, tuple[str, str | None]] = {
    "transfer": ("The paper's evaluation suite (Table 2): fine-tune on each task found under --data-dir as appendix "
                 "B.1.1 does, then print the table row (each dataset, VTAB-1k's group means and mean), and VTAB-1k's "
                 "mean of the group means, the PEFT papers' average.",
                 "examples:\n  vitkit transfer ViT-B_16.npz --suite paper --data-dir /data --out runs/suite\n"
                 "  vitkit transfer runs/x/model --suite mnist cifar10 --data-dir data --budget small --fewshot\n"
                 "  vitkit transfer ViT-B_16.npz --suite vtab1k --data-dir /data --peft lora --lora-rank 8\n"
                 "  vitkit transfer clip-dir --suite cifar10 pets --data-dir /data --zeroshot --no-finetune"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    transfer = sub.add_parser("transfer", help="the paper's evaluation suite: fine-tune on each task, print the table")
    transfer.add_argument("checkpoint", metavar="CHECKPOINT", help="anything vitkit.load reads")
    transfer.add_argument("--suite", nargs="+", required=True, metavar="SUITE|TASK",
                          help="paper (ImageNet, CIFAR-10/100, Pets, Flowers-102, VTAB-1k), vtab1k, or task names")
    transfer.add_argument("--data-dir", required=True, metavar="DIR", help="the folder holding the tasks' data, "
                          "each in its usual layout (cifar-10-batches-py/, oxford-iiit-pet/, vtab-1k/<task>/, ...)")
    transfer.add_argument("--budget", choices=tuple(BUDGETS), default="paper",
                          help="small: steps and resolution scaled down for a CPU (not the paper's protocol)")
    transfer.add_argument("--fewshot", action="store_true", help="also few-shot linear rows (appendix B.1.2)")
    transfer.add_argument("--no-finetune", action="store_true",
                          help="evaluate the checkpoint as it is (its head must have each task's classes); with "
                               "--zeroshot: the zero-shot row alone")
    transfer.add_argument("--zeroshot", action="store_true",
                          help="also a zero-shot row: each task's test split classified by the dataset's class names "
                               "and open_clip's 80 templates with the checkpoint's text tower (an image-text "
                               "checkpoint that vitkit zeroshot reads), as vitkit zeroshot --dataset does")
    transfer.add_argument("--real-labels", metavar="JSON", help="ImageNet's ReaL labels (default: imagenet/real.json "
                          "under --data-dir where it is there)")
    transfer.add_argument("--recipe", type=override_pair, action=Overrides, default={}, metavar="SECTION.FIELD=VALUE",
                          help="a recipe field of every fine-tuning run, e.g. schedule.accum_steps=8 (repeatable)")
    transfer.add_argument("--out", metavar="DIR", help="the suite's folder; the same one resumes a suite that was "
                          "stopped (default: a new one under runs/)")
    peft = add_flags(transfer, [("peft", Peft)], title="recipe: ")["peft"]
    peft.description = textwrap.fill(f"--peft METHOD fine-tunes every task with it, the checkpoint left as it is: "
                                     f"{PEFT_PROTOCOL}. The table's \"{TRAINED}\" row says each task's trained "
                                     f"share of the parameters.", width=100)
    runtime_flags(transfer, precision=False)
    transfer.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The paper's evaluation suite, run by ``vitkit.transfer.run_transfer``, which prints the table."""
    run_transfer(args.checkpoint, args.suite, args.data_dir, args.out, args.budget, args.fewshot, not args.no_finetune,
                 args.real_labels, args.device, args.recipe, flag_values(args).get("peft"), zeroshot=args.zeroshot)
    return 0
