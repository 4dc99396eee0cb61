"""The docs' dense-features figure: the first three principal components of the patch features of a tiny
DINOv3-shaped ViT with RANDOM weights (no trained checkpoint can be downloaded here) on scikit-learn's temple
photo, at the photo's own aspect ratio (448 px shorter side, a 28x42 grid), as RGB. With random weights the
components follow colour and local texture only; a trained DINOv3 separates objects and parts.

    PYTHONPATH=src python scripts/dense_features_figure.py

Writes docs/figures/dense-features-random.png."""

from pathlib import Path

import torch

import vitkit
from vitkit.analysis import feature_colours, patch_features
from vitkit.analysis.inputs import prepare, sample_photos
from vitkit.analysis.plots import features_figure, save_figure
from vitkit.evaluate.predict import aspect_size
from vitkit.evaluate.preprocessing import checkpoint_transform
from vitkit.models.config import Provenance

OUT = Path(__file__).resolve().parents[1] / "docs" / "figures" / "dense-features-random.png"
# DINOv3's options (rotary embeddings on centred coordinates, period base 100, rotate-half pairs, 4 registers,
# no position table, eps 1e-5), a tiny width and depth; LayerScale at 1 so the random blocks do mix the tokens.
CONFIG = vitkit.ViTConfig(image_size=224, patch_size=16, dim=192, depth=6, num_heads=3, mlp_dim=768, num_classes=0,
                          qkv_bias=False, reg_tokens=4, pos_embed="none", rope="axial", rope_grid="centered",
                          rope_theta=100.0, rope_half=True, ln_eps=1e-5, layer_scale=1.0, pool="gap",
                          provenance=Provenance(normalization="imagenet"))


def main() -> None:
    torch.manual_seed(0)
    model = vitkit.create_model(CONFIG).eval()
    photo = sample_photos()[0]  # the temple, 427x640
    size = aspect_size(*photo.shape[:2], 448, CONFIG.patch_size)
    images, pictures = prepare([photo], checkpoint_transform(CONFIG, "stretch", size))
    with torch.no_grad():
        colours = feature_colours(patch_features(model, images)[0])
    figure = features_figure(pictures[0], colours,
                             "Dense features of a tiny DINOv3-shaped ViT with RANDOM weights (untrained)")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_figure(figure, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} kB)")


if __name__ == "__main__":
    main()
