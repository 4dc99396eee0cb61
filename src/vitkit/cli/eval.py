"""``vitkit eval``: accuracy, per-class accuracy and a confusion matrix of a checkpoint (or an exported graph) on
a dataset split."""

from __future__ import annotations

import argparse

from ..checkpoints.runnable import load_inference
from ..data import CORRUPT
from ..data.datasets import DATASET_FORMS, split_names
from ..evaluate.accuracy import DEFAULT_VAL_FRACTION, check_model_memory, evaluate_dataset
from .flags import (SPLIT_CHOICES, SPLIT_HELP, checkpoint_flags, count, max_patches_flag, model_source, percent,
                    positive, positive_number, print_table, resize_flag, run_defaults, runtime_flags, slide_flag,
                    unit_fraction)

HELP: dict[str, tuple[str, str | None]] = {
    "eval": ("Top-1/top-5 accuracy, per-class accuracy and a confusion matrix of a checkpoint on a dataset.",
             "examples:\n"
             "  vitkit eval runs/x/model --dataset mnist --data-dir data --out runs/x\n"
             "  vitkit eval model.onnx --dataset imagefolder:photos --split all"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    evaluate_ = sub.add_parser("eval", help="accuracy, per-class accuracy and confusion matrix of a checkpoint")
    checkpoint_flags(evaluate_, help="anything vitkit.load reads, or an .onnx file")
    evaluate_.add_argument("--dataset", help=f"{DATASET_FORMS} (default: the dataset of the checkpoint's run)")
    evaluate_.add_argument("--data-dir")
    evaluate_.add_argument("--split", choices=SPLIT_CHOICES, help=SPLIT_HELP)
    evaluate_.add_argument("--val-fraction", type=unit_fraction, help=f"images held out where the dataset lacks the "
                           f"split (default: the run's, else {DEFAULT_VAL_FRACTION})")
    evaluate_.add_argument("--corrupt", default="fail", choices=CORRUPT)
    evaluate_.add_argument("--real-labels", metavar="JSON", help="ImageNet's reassessed labels (real.json of "
                           "google-research/reassessed-imagenet): ReaL top-1 beside top-1")
    evaluate_.add_argument("--batch-size", "-b", type=positive, default=256)
    evaluate_.add_argument("--num-workers", "-j", type=count, default=0)
    evaluate_.add_argument("--out", metavar="DIR", help="folder for eval-<split>.json and confusion-<split>.png "
                           "(default: the checkpoint's run folder, else none)")
    evaluate_.add_argument("--scales", type=positive_number, nargs="+", default=(1.0,), metavar="S",
                           help="segmentation and depth models: average the outputs of the image resized by each "
                                "factor (test-time augmentation; DINOv2's +ms: 1 1.32 1.73 2.28 3 --flip)")
    evaluate_.add_argument("--flip", action="store_true", help="segmentation and depth models: average in the "
                           "outputs of the mirrored images too")
    slide_flag(evaluate_)
    resize_flag(evaluate_)
    max_patches_flag(evaluate_)
    runtime_flags(evaluate_)
    evaluate_.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Top-1/top-5, per-class accuracy and a confusion-matrix PNG of a checkpoint on a dataset split."""
    check_model_memory(args.checkpoint, args.overrides, args.device, args.precision, adapter=args.adapter,
                       command="vitkit eval")
    model, device, dtype = load_inference(args.checkpoint, args.overrides, args.device, args.precision,
                                          adapter=args.adapter)
    from_run = args.dataset is None
    run_defaults(args)
    held = from_run and "test" in split_names(args.dataset)  # a run's held-out test split, where the data has one
    done = evaluate_dataset(model, args.dataset, args.split or ("test" if held else None),
                            data_dir=args.data_dir, val_fraction=args.val_fraction, corrupt=args.corrupt,
                            batch_size=args.batch_size, num_workers=args.num_workers, out=args.out,
                            resize=args.resize, max_patches=args.max_patches, device=device, dtype=dtype,
                            source=model_source(args), command=f"vitkit {args.command}", real_labels=args.real_labels,
                            scales=tuple(args.scales), flip=args.flip, slide=args.slide)
    report = done.report
    if done.whole:
        print(f"{args.dataset} names no test or validation split: every one of its {report['images']} images is "
              f"evaluated (--split test evaluates the part a training run holds out)")
    kept = f"report in {args.out}" if args.out else "pass --out DIR to keep the report"
    if report.get("task") == "segmentation":
        print_table(["class", "IoU", "accuracy"], [[name, percent(iou), percent(report["Acc"][name])]
                                                   for name, iou in report["IoU"].items()])
        print(f"{args.dataset} [{done.split}]: mIoU {percent(report['mIoU'])}  aAcc {percent(report['aAcc'])}  "
              f"({report['images']} images); {kept}")
        return 0
    if report.get("task") == "depth":
        print(f"{args.dataset} [{done.split}]: AbsRel {report['abs_rel']:.4f}  RMSE {report['rmse']:.4f} m  "
              f"delta<1.25 {percent(report['a1'])}  ({report['images']} images); {kept}")
        return 0
    print_table(["class", "accuracy"], [[name, percent(acc)] for name, acc in report["per_class"].items()])
    kept = f"report and confusion matrix in {args.out}" if args.out else "pass --out DIR to keep the report and " \
        "confusion matrix"
    print(f"{args.dataset} [{done.split}]: top-1 {100 * report['top1']:.2f}%  top-5 {100 * report['top5']:.2f}%  "
          f"({report['images']} images)" + (f"  ReaL top-1 {100 * report['real_top1']:.2f}% "
                                            f"({report['real_images']} images with labels)"
                                            if "real_top1" in report else "") + f"; {kept}")
    return 0

