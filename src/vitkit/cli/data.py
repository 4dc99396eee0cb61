"""``vitkit data info``, ``verify`` and ``convert``: a dataset's splits and classes, its unreadable images, its
images written as WebDataset shards."""

from __future__ import annotations

import argparse
import json
import sys

from ..data import CORRUPT
from ..data.convert import convert_dataset
from ..data import SplitSpec, dataset_info
from ..data.datasets import verify_dataset
from ..memory import check_workers, usable_cpus
from .flags import positive, print_table, unit_fraction

HELP: dict[str, tuple[str, str | None]] = {
    "data": ("Inspect, check and convert datasets.", None),
    "data info": ("Split sizes, classes and images per class of a dataset; nothing is decoded.", None),
    "data verify": ("Decode every image of a dataset once, in parallel, and list the unreadable ones (exit 1).", None),
    "data convert": ("Write a dataset as WebDataset shards.",
                     "example:\n  vitkit data convert imagefolder:/data/imagenet /data/in1k-wds --shard-size 256MB"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``data`` and its subcommands to ``sub``, the subparsers of ``vitkit``."""
    data = sub.add_parser("data", help="inspect, check and convert datasets").add_subparsers(dest="data_command",
                                                                                          required=True)
    info_ = data.add_parser("info", help="split sizes, classes and images per class")
    verify = data.add_parser("verify", help="decode every image in parallel; list the unreadable ones")
    convert_ = data.add_parser("convert", help="write a dataset as WebDataset shards")
    for command, run_ in ((info_, run_info), (verify, run_verify), (convert_, run_convert)):
        command.add_argument("dataset", metavar="SRC" if command is convert_ else "DATASET",
                             help="imagefolder:PATH, webdataset:ROOT, hf:PATH, mnist, npz:PATH, ...")
        command.add_argument("--data-dir", help="where torchvision's datasets lie")
        command.add_argument("--val-fraction", type=unit_fraction, default=0.1,
                             help="validation images held out of train where the dataset has no val split")
        command.set_defaults(run=run_)
    info_.add_argument("--json", action="store_true", help="machine-readable output")
    info_.add_argument("--corrupt", default="fail", choices=CORRUPT,
                       help="skip: list shards' unusable samples instead of stopping at the first")
    verify.add_argument("--num-workers", "-j", type=positive, default=usable_cpus(),
                        help="decoding processes, at most the CPUs this process may run on (default: all of them)")
    convert_.add_argument("dst", metavar="DST", help="a new folder for the shards")
    convert_.add_argument("--to", choices=["webdataset"], default="webdataset")
    convert_.add_argument("--shard-size", default="256MB",
                          help="image and label bytes a shard (tar headers add ~1 kB a file), e.g. 256MB, 1GB")


def run_info(args: argparse.Namespace) -> int:
    """Split sizes, classes and images per class of a dataset (nothing decoded)."""
    report = dataset_info(args.dataset, args.data_dir, SplitSpec(args.val_fraction), args.corrupt)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    splits = report["splits"]
    if "task" in report:  # per-pixel labels: no image belongs to one class
        print_table(["split", "images"], [[name, split["images"]] for name, split in splits.items()])
        print(f"{report['task']}: {len(report['classes'])} classes" if report["classes"] else report["task"])
        if report["classes"]:
            print(", ".join(report["classes"]))
        return 0
    print_table(["split", "images", "classes"], [[name, split["images"], len(split["per_class"])]
                                                 for name, split in splits.items()])
    print()
    print_table(["class", *splits], [[name, *(split["per_class"].get(name, 0) for split in splits.values())]
                                     for name in report["classes"]])
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Decode every image of the dataset in parallel; list the unreadable ones (exit 1 if any)."""
    check_workers(args.num_workers)
    bad = verify_dataset(args.dataset, args.data_dir, args.num_workers)
    for name in bad:
        print(name)
    print(f"{args.dataset}: {len(bad)} unreadable image(s)", file=sys.stderr)
    return 1 if bad else 0


def run_convert(args: argparse.Namespace) -> int:
    """Write a dataset as WebDataset shards (train/val/test-NNNNNN.tar and classes.txt)."""
    written = convert_dataset(args.dataset, args.dst, args.shard_size, args.data_dir, args.val_fraction)
    print_table(["split", "images"], list(written.items()))
    print(f"shards in {args.dst}; train from them with --dataset webdataset:{args.dst}")
    return 0
