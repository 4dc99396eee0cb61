"""``vitkit zeroshot``: classify images by class names with an image-text checkpoint (CLIP, SigLIP, SigLIP 2,
TIPSv2)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..classnames import escape_name
from ..data import CORRUPT
from ..data.datasets import DATASET_FORMS, dataset_name
from ..errors import ConfigError
from ..evaluate.predict import prediction_record
from ..runtime import resolve_precision, select_device
from .flags import (SPLIT_CHOICES, SPLIT_HELP, count, override_flags, percent, positive, resize_flag, runtime_flags,
                    unit_fraction)

HELP: dict[str, tuple[str, str | None]] = {
    "zeroshot": ("Classify images by class names, with no training, with the text tower of an image-text checkpoint.",
                 "examples:\n"
                 "  vitkit zeroshot clip-dir --images cat.jpg photos/ --classes cat dog bird\n"
                 "  vitkit zeroshot siglip2-dir --images 'img/*.jpg' --classes-file names.txt --json\n"
                 "  vitkit zeroshot siglip-dir --images x.jpg --classes cat dog --multi-label  (sigmoids)\n"
                 "  vitkit zeroshot clip-dir --dataset cifar10 --data-dir data   (top-1/top-5 by its class names)\n"
                 "  vitkit zeroshot clip-dir --retrieval captions.tsv --out runs/r   (recall@1/5/10 both ways)"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    zeroshot = sub.add_parser("zeroshot", help="classify images by class names with CLIP, SigLIP or TIPSv2")
    zeroshot.add_argument("checkpoint", metavar="CHECKPOINT",
                          help="an HF CLIPModel, MetaClip2Model, SiglipModel, Siglip2Model or Tipsv2Model directory, "
                               "or an open_clip hub directory: CLIP, SigLIP, SigLIP 2, PE-core, MetaCLIP 2 (or "
                               "hf-hub:ORG/NAME of one)")
    override_flags(zeroshot, help="image tower config override, as vitkit predict takes it (repeatable)")
    inputs = zeroshot.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--images", nargs="+", metavar="IMAGE",
                        help="image files, folders (every image below them) or quoted glob patterns")
    inputs.add_argument("--dataset", help=f"top-1/top-5 on a labelled dataset, its classes named by its own class "
                        f"names unless --classes says otherwise: {DATASET_FORMS}")
    inputs.add_argument("--retrieval", metavar="TSV", help="image->text and text->image recall@1/5/10 over a "
                        "captions file: image path<TAB>caption a line, the path relative to the file's folder, an "
                        "image on as many lines as it has captions")
    names = zeroshot.add_mutually_exclusive_group()
    names.add_argument("--classes", nargs="+", metavar="NAME", help="the class names, verbatim (with --dataset: one "
                       "for each of its classes, in its order)")
    names.add_argument("--classes-file", metavar="FILE", help="a text file of class names, one a line")
    zeroshot.add_argument("--templates", nargs="+", metavar="T",
                          help="prompt templates with one {} where the class name goes ('a photo of a {}.'), or a "
                               "set: openai (open_clip's 80 OpenAI ImageNet templates, the default) or simple (the "
                               "class name alone)")
    zeroshot.add_argument("--top-k", type=positive, default=5, metavar="K",
                          help="how many of the most probable classes to list for each image (default: 5)")
    zeroshot.add_argument("--multi-label", action="store_true",
                          help="SigLIP: each class's own sigmoid(exp(scale) * cosine + bias) instead of a softmax "
                               "over the classes")
    zeroshot.add_argument("--tokenizer", metavar="DIR",
                          help="a folder holding the tokenizer files (tokenizer.json) where the checkpoint lacks them")
    zeroshot.add_argument("--json", action="store_true", help="the predictions as a JSON list on stdout (with "
                          "--dataset: the report)")
    zeroshot.add_argument("--data-dir")
    zeroshot.add_argument("--split", choices=SPLIT_CHOICES, help=SPLIT_HELP)
    zeroshot.add_argument("--val-fraction", type=unit_fraction, default=0.1,
                          help="images held out where the dataset lacks the split (default: 0.1)")
    zeroshot.add_argument("--corrupt", default="fail", choices=CORRUPT)
    zeroshot.add_argument("--batch-size", "-b", type=positive, default=64)
    zeroshot.add_argument("--num-workers", "-j", type=count, default=0)
    zeroshot.add_argument("--out", metavar="DIR", help="with --dataset: a folder for eval-<split>.json and "
                          "confusion-<split>.png; with --retrieval: for retrieval-<captions file stem>.json")
    resize_flag(zeroshot)
    runtime_flags(zeroshot)
    zeroshot.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Top-k class names with their probabilities for each image, or top-1/top-5 on a dataset."""
    from ..text import load_clip
    from ..text.zeroshot import (check_classes, check_multi_label, read_classes_file, resolve_templates,
                                 zeroshot_dataset, zeroshot_files)

    if args.retrieval:
        return run_retrieval(args)
    if args.dataset and args.multi_label:
        raise ConfigError("--multi-label: for --images; top-1/top-5 on --dataset rank the classes alike either way")
    unused = [flag for flag, value in (("--data-dir", args.data_dir), ("--split", args.split), ("--out", args.out))
              if value and args.images]
    if unused:
        raise ConfigError(f"{', '.join(unused)}: for --dataset; --images classifies the files named")
    classes = read_classes_file(args.classes_file) if args.classes_file else \
        None if args.dataset and not args.classes else check_classes(args.classes or [])
    templates = resolve_templates(args.templates)  # refused before the checkpoint is read
    model = load_clip(args.checkpoint, tokenizer=args.tokenizer, **args.overrides)
    if args.multi_label:
        check_multi_label(model)
    device = select_device(args.device)
    dtype = resolve_precision(args.precision, device)
    if args.dataset:
        report = zeroshot_dataset(model.to(device), args.dataset, args.split, classes=classes,
                                  templates=templates if args.templates else None, data_dir=args.data_dir,
                                  val_fraction=args.val_fraction, corrupt=args.corrupt, batch_size=args.batch_size,
                                  num_workers=args.num_workers, out=args.out, resize=args.resize, device=device,
                                  dtype=dtype, task=benchmark_task(args.dataset))
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            print(f"{args.dataset} [{report['split']}]: top-1 {percent(report['top1'])}  top-5 "
                  f"{percent(report['top5'])}  ({report['images']} images, {len(report['per_class'])} classes, "
                  f"{len(templates)} templates)")
        return 0
    predictions = zeroshot_files(model.to(device), args.images, classes, templates, args.top_k, args.multi_label,
                                 device, dtype, args.resize, args.batch_size)
    if args.json:
        print(json.dumps([prediction_record(prediction) for prediction in predictions], indent=1))
        return 0
    for prediction in predictions:
        ranked = ", ".join(f"{escape_name(label)} {100 * p:.1f}%"
                           for label, p in zip(prediction.labels, prediction.probabilities))
        print(f"{prediction.path}: {ranked}")
    return 0


def run_retrieval(args: argparse.Namespace) -> int:
    """Image->text and text->image recall@1/5/10 over the captions file ``--retrieval``."""
    from ..text import load_clip
    from ..text.retrieval import RECALL_AT, evaluate_retrieval

    unused = [flag for flag, value in (("--classes", args.classes), ("--classes-file", args.classes_file),
                                       ("--templates", args.templates), ("--multi-label", args.multi_label),
                                       ("--data-dir", args.data_dir), ("--split", args.split)) if value]
    if unused:
        raise ConfigError(f"{', '.join(unused)}: not for --retrieval, which ranks the captions of its file as written")
    model = load_clip(args.checkpoint, tokenizer=args.tokenizer, **args.overrides)
    device = select_device(args.device)
    report = evaluate_retrieval(model.to(device), args.retrieval, args.batch_size, args.resize, args.out, device,
                       resolve_precision(args.precision, device))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{args.retrieval}: {report['images']} images, {report['texts']} captions")
    for direction, key in (("image->text", "image_to_text"), ("text->image", "text_to_image")):
        print(f"{direction}  " + "  ".join(f"R@{k} {percent(report[key][f'recall@{k}'])}" for k in RECALL_AT))
    if args.out:
        print(f"report in {args.out}")
    return 0


def benchmark_task(dataset: str) -> str | None:
    """The suite's task a dataset spec holds, whose clip-benchmark prompts ``--dataset`` uses by default: the named
    datasets and ``pets:``, ``flowers102:``, ``imagenet:`` by kind, ``vtab:DIR`` by its folder's name (VTAB-1k's
    task, or the VPT code base's folder name for it); None for any other dataset."""
    from ..transfer.tasks import TASKS, VTAB_FOLDERS, VTAB_PREFIX

    kind, colon, path = dataset_name(dataset).partition(":")
    if kind == "vtab" and colon:
        folder = Path(path.rstrip("/")).name
        name = {short: task for task, short in VTAB_FOLDERS.items()}.get(folder, folder)
        return VTAB_PREFIX + name if VTAB_PREFIX + name in TASKS else None
    return kind if kind in TASKS else None
