"""``vitkit analyze``: attention rollout, attention distance and embedding figures of a checkpoint, with a page."""

from __future__ import annotations

import argparse

from ..analysis.attention import HEAD_FUSIONS, READOUTS
from ..analysis.report import REPORT_FILE
from ..data.datasets import DATASET_FORMS
from ..errors import ConfigError
from ..evaluate.analyze import analyze_checkpoint
from .flags import (checkpoint_flags, count, finite_number, image_size_type, max_patches_flag, positive,
                    positive_number, resize_flag, runtime_flags, unit_fraction)

HELP: dict[str, tuple[str, str | None]] = {
    "analyze": ("Attention rollout, attention distance, position similarity and filter figures, with an HTML page.",
                "examples:\n"
                "  vitkit analyze runs/x/model --out analysis\n"
                "  vitkit analyze runs/x/model --images cat.jpg photos/ --out analysis\n"
                "  vitkit analyze clip-dir --images dog.jpg --text 'a dog' 'grass' --out analysis"),
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    analyze = sub.add_parser("analyze", help="attention rollout, attention distance, embedding figures and a report")
    checkpoint_flags(analyze)
    source = analyze.add_mutually_exclusive_group()
    source.add_argument("--images", nargs="+", metavar="PATH",
                         help="image files, directories or quoted glob patterns; a file under a folder named like "
                              "one of the model's classes is labelled with it (default: scikit-learn's two sample "
                              "photos)")
    source.add_argument("--dataset", help=f"analyse a random sample of this dataset's test split instead "
                                          f"({DATASET_FORMS})")
    analyze.add_argument("--data-dir", help="where --dataset lies (torchvision layout)")
    analyze.add_argument("--num-images", type=positive, default=64, help="size of the --dataset sample")
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--out", required=True, metavar="DIR", help="folder for figures, numbers and index.html")
    analyze.add_argument("--image-size", type=image_size_type, metavar="HxW",
                         help="input size (default: the checkpoint's)")
    analyze.add_argument("--mean", type=finite_number, nargs="+",
                         help="per-channel input mean (default: the checkpoint's normalisation's)")
    analyze.add_argument("--std", type=positive_number, nargs="+",
                         help="per-channel input std (default: the checkpoint's; each flag falls back on its own)")
    analyze.add_argument("--batch-size", "-b", type=positive, default=8)
    analyze.add_argument("--head-fusion", choices=HEAD_FUSIONS, default="mean")
    analyze.add_argument("--discard-ratio", type=unit_fraction, default=0.0,
                         help="fraction of the weakest attention weights dropped before rollout")
    analyze.add_argument("--readout", choices=list(READOUTS),
                         help="the output the rollout is read from: token, the [class] row; mean, the mean of the "
                              "patch rows; probe, the attention pool's probe (default: where the model's head reads, "
                              "as vitkit.analysis.rollout: token under pool='token', mean under 'gap', probe under "
                              "'map'; prefix and register tokens are never on the image grid)")
    analyze.add_argument("--overlays", type=count, default=8, help="how many rollout overlays to draw")
    analyze.add_argument("--filters", type=positive, default=28, help="principal components of the patch filters")
    analyze.add_argument("--text", nargs="+", metavar="PROMPT",
                         help="an image-text checkpoint (CLIP, SigLIP, ...): also a map per image and prompt of the "
                              "cosine of each patch's embedding (its final state through the image tower's final "
                              "norm and projection) with the prompt's text embedding, the prompt taken verbatim")
    analyze.add_argument("--tokenizer", metavar="DIR",
                         help="with --text: a folder holding the tokenizer files the checkpoint lacks")
    resize_flag(analyze)
    max_patches_flag(analyze)
    runtime_flags(analyze)
    analyze.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Attention rollout, mean attention distance, position-embedding similarity and filter PCA of a
    checkpoint on given images, a dataset sample, or scikit-learn's two sample photos."""
    if args.tokenizer and not args.text:
        raise ConfigError("--tokenizer: for --text, whose prompts it tokenizes")
    image_text = None
    if args.text and not args.adapter:  # with an adapter, refused by analyze_checkpoint
        from ..text import load_clip

        image_text = load_clip(args.checkpoint, args.tokenizer, **args.overrides)
    done = analyze_checkpoint(args.checkpoint, args.out, images=args.images, dataset=args.dataset,
                              data_dir=args.data_dir, num_images=args.num_images, seed=args.seed,
                              image_size=args.image_size, mean=args.mean, std=args.std, resize=args.resize,
                              max_patches=args.max_patches, device=args.device, precision=args.precision,
                              overrides=args.overrides, adapter=args.adapter, batch_size=args.batch_size,
                              head_fusion=args.head_fusion, discard_ratio=args.discard_ratio, overlays=args.overlays,
                              filters=args.filters, readout=args.readout, texts=args.text or (),
                              image_text=image_text)
    sizes = f"at {done.size[0]}x{done.size[1]}" if done.size else "each at its own aspect ratio"
    print(f"analysed {done.images} images {sizes}: {len(done.analysis.figures)} figures, report "
          f"{done.analysis.out / REPORT_FILE}")
    return 0
