"""The README's rollout figure: a DINOv2-S/14 with 4 registers, RANDOM weights (no trained checkpoint can be
downloaded here), on scikit-learn's temple photo. Registers and [class] are kept out of the 16x16 grid; the
map is the [class] token's rolled-out attention. Run: PYTHONPATH=src python scripts/readme_dinov2_rollout.py"""

from pathlib import Path

import torch

import vitkit
from vitkit.analysis import attention_maps, attention_rollout
from vitkit.analysis.inputs import prepare, sample_photos
from vitkit.analysis.plots import rollout_overlay, save_figure
from vitkit.evaluate.preprocessing import checkpoint_transform

OUT = Path(__file__).resolve().parents[1] / "docs" / "figures" / "dinov2_s14_reg4_random_rollout.png"

torch.manual_seed(0)
model = vitkit.create_model("DINOv2-S/14-reg4", image_size=224).eval()
images, pictures = prepare(sample_photos()[:1], checkpoint_transform(model.config))  # DINOv2: ImageNet statistics
attn = attention_maps(model, images)
heat = attention_rollout(attn, (16, 16))[0]
figure = rollout_overlay(pictures[0], heat, "DINOv2-S/14-reg4, random weights (untrained)")
OUT.parent.mkdir(parents=True, exist_ok=True)
save_figure(figure, OUT)
print(f"wrote {OUT} ({OUT.stat().st_size // 1024} kB)")
