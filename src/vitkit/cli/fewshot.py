"""``vitkit fewshot``: few-shot linear evaluation of a checkpoint's frozen representations, with the full linear
probe and k-NN on request."""

from __future__ import annotations

import argparse

from ..checkpoints.runnable import load_on_device, refuse_dense
from ..data.datasets import DATASET_FORMS
from ..evaluate.accuracy import check_model_memory
from ..evaluate.fewshot import DEFAULT_L2_REGS, DEFAULT_SHOTS
from ..evaluate.knn import DEFAULT_TEMPERATURE
from ..evaluate.probes import FEWSHOT_FILE, probe_dataset
from .flags import (SPLIT_CHOICES, SPLIT_HELP, checkpoint_flags, model_source, positive, positive_number, print_table,
                    regularizer, resize_flag, run_defaults, runtime_flags, seed_repeats)

HELP: dict[str, tuple[str, str | None]] = {
    "fewshot": ("Few-shot linear evaluation of frozen representations, with a linear probe and k-NN on request.",
                "example:\n  vitkit fewshot runs/x/model --dataset mnist --data-dir data --shots 1 5 10 25 --knn 20"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    fewshot = sub.add_parser("fewshot", help="few-shot linear evaluation of frozen representations")
    checkpoint_flags(fewshot)
    fewshot.add_argument("--dataset", help=f"{DATASET_FORMS} (default: the dataset of the checkpoint's run)")
    fewshot.add_argument("--data-dir")
    fewshot.add_argument("--split", choices=SPLIT_CHOICES, help=SPLIT_HELP + "; the support images come from the "
                         "train split, or are drawn from the images measured when that is train or all")
    fewshot.add_argument("--shots", type=positive, nargs="+",
                         help=f"training images per class (default: {' '.join(map(str, DEFAULT_SHOTS))}); with "
                              f"--knn, also the k-NN memory banks, which are otherwise every training image")
    fewshot.add_argument("--seeds", type=seed_repeats, default=5, help="repeats with different shots")
    fewshot.add_argument("--l2", type=regularizer, nargs="+", default=list(DEFAULT_L2_REGS),
                         help="regularisers tried; one is chosen on held-out training images")
    fewshot.add_argument("--linear-probe", action="store_true", help="also fit on every training image")
    fewshot.add_argument("--knn", type=positive, nargs="+", metavar="K",
                         help="also k-NN classification with K neighbours (DINO's: cosine similarity, each "
                              "neighbour's vote weighted by exp(similarity / T)), for each K given")
    fewshot.add_argument("--knn-temperature", type=positive_number, default=DEFAULT_TEMPERATURE, metavar="T",
                         help=f"T of the k-NN votes (default: {DEFAULT_TEMPERATURE:g}, DINO's): lower trusts the "
                              "nearest neighbours more")
    fewshot.add_argument("--batch-size", "-b", type=positive, default=256)
    fewshot.add_argument("--out", metavar="DIR", help=f"folder that receives the numbers as {FEWSHOT_FILE} "
                         f"(default: the checkpoint's run folder, else none)")
    resize_flag(fewshot)
    runtime_flags(fewshot)
    fewshot.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Few-shot linear evaluation (the paper's protocol), with ``--linear-probe`` the full probe, and with
    ``--knn`` k-NN classification (DINO's protocol) from the same frozen representations."""
    check_model_memory(args.checkpoint, args.overrides, args.device, args.precision, adapter=args.adapter,
                       command="vitkit fewshot")
    model, device, dtype = load_on_device(args.checkpoint, args.overrides, args.device, args.precision,
                                          adapter=args.adapter)
    refuse_dense(model.config, model_source(args), "vitkit fewshot")
    run_defaults(args)
    done = probe_dataset(model, args.dataset, args.split, data_dir=args.data_dir, shots=args.shots, seeds=args.seeds,
                         l2_regs=args.l2, full_probe=args.linear_probe, knn=args.knn,
                         knn_temperature=args.knn_temperature, batch_size=args.batch_size, resize=args.resize,
                         device=device, dtype=dtype, source=model_source(args), out=args.out)
    if done.drawn:
        drawn = done.drawn
        print(f"{args.dataset} [{done.split}]: support drawn from {drawn.per_class} images of each class (seed 0: "
              f"{' '.join(map(str, drawn.shots))} shots and {drawn.validation_per_class} to choose the regulariser), "
              f"query: the other {len(drawn.query)} images")
    rows = [[r.shots, f"{100 * r.mean:.2f}%", f"{100 * r.std:.2f}", f"{r.selected_l2:g}"] for r in done.fewshot]
    if done.linear_probe:
        accuracy, l2 = done.linear_probe
        rows.append(["all", f"{100 * accuracy:.2f}%", "-", f"{l2:g}"])
    print(f"{args.dataset}: linear classifier on frozen representations, {args.seeds} seeds")
    print_table(["shots", "test accuracy", "std", "l2"], rows)
    if done.knn is not None:
        print(f"\n{args.dataset}: k-NN on frozen representations (cosine, votes weighted by exp(similarity / "
              f"{args.knn_temperature:g})), memory bank: " + (f"shots per class, {args.seeds} seeds" if args.shots
                                                             else "every training image"))
        print_table(["k", "shots", "top-1", "top-5", "std"], [
            [r.k, r.shots or "all", f"{100 * r.top1:.2f}%", "-" if r.top5 is None else f"{100 * r.top5:.2f}%",
             f"{100 * r.std:.2f}" if r.shots else "-"] for r in done.knn])
    if done.written:
        print(f"numbers in {done.written}")
    return 0
