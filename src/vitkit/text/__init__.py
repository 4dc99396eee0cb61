"""Text towers of image-text checkpoints (CLIP, SigLIP, SigLIP 2, TIPSv2), their tokenizers, zero-shot
classification and image-text retrieval: ``load_clip`` gives the image tower vitkit reads beside the text tower the
same checkpoint holds."""

from .clip import ImageTextModel, load_clip
from .model import TextConfig, TextTransformer
from .retrieval import evaluate_retrieval, read_captions
from .zeroshot import (ZeroShotClassifier, class_embeddings, class_probabilities, resolve_templates, zeroshot_dataset,
                       zeroshot_files)

__all__ = ["ImageTextModel", "TextConfig", "TextTransformer", "ZeroShotClassifier", "load_clip", "class_embeddings",
           "class_probabilities", "evaluate_retrieval", "read_captions", "resolve_templates", "zeroshot_dataset",
           "zeroshot_files"]
