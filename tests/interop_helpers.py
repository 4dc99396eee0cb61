"""Shared by the interoperability tests: peer models with random weights and npz layout rewriting."""

from functools import partial

import numpy as np
import torch



def randomised(model, std=0.2):
    """Random non-zero weights everywhere, so no parameter can hide behind an init of zeros or ones."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model.eval()


def timm_model(**kwargs):
    """A small timm ViT; ``backbone=(layers)`` makes timm's own hybrid (ResNetV2, SAME StdConv, GN)."""
    from timm.layers import HybridEmbed
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.vision_transformer_hybrid import _resnetv2

    base = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2, num_classes=10)
    layers = kwargs.pop("backbone", None)
    if layers is not None:
        base["embed_layer"] = partial(HybridEmbed, backbone=_resnetv2(layers=layers))
    return randomised(VisionTransformer(**{**base, **kwargs}))


def google_layout(arrays, layout):
    """Rewrite a vit_jax (pre-Linen, unprefixed) dict of arrays into another of Google's layouts."""
    out = dict(arrays)
    if layout in ("linen", "big_vision"):
        renames = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
                   "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
        for old, new in renames.items():
            out = {key.replace(f"/{old}/", f"/{new}/"): value for key, value in out.items()}
    if layout == "big_vision":  # scan-stacked blocks, position table without the [class] slot
        table = out.pop("Transformer/posembed_input/pos_embedding")
        if "cls" in out:
            assert not table[:, 0].any(), "big_vision has no class position: the source must have zeros there"
            table = table[:, 1:]
        out["pos_embedding"] = table
        blocks = sorted({key.split("/")[1] for key in out if key.startswith("Transformer/encoderblock_")},
                        key=lambda b: int(b.split("_")[1]))
        for leaf in [key.split("/", 2)[2] for key in out if key.startswith(f"Transformer/{blocks[0]}/")]:
            out[f"Transformer/encoderblock/{leaf}"] = np.stack(
                [out.pop(f"Transformer/{block}/{leaf}") for block in blocks])
        out = {f"params/{key}": value for key, value in out.items()}
    if layout == "opt_target":
        out = {f"opt/target/{key}": value for key, value in out.items()}
    if layout == "bf16":  # JAX stores bfloat16 as raw 2-byte values
        out = {key: torch.from_numpy(value).bfloat16().view(torch.int16).numpy().view("V2")
               for key, value in out.items()}
    return out


def round_to_bf16(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    return model


def assert_timms_outputs(model, theirs, x):
    """vitkit ``model``'s tokens, pre-logits and logits on ``x`` equal timm model ``theirs``' (1e-5); timm's tokens
    are returned, for a check that they are not all small."""
    with torch.no_grad():
        features = theirs.forward_features(x)
        ours = model.forward_features(x)
        torch.testing.assert_close(ours, features, atol=1e-5, rtol=0)
        torch.testing.assert_close(model.forward_head(ours, pre_logits=True),
                                   theirs.forward_head(features, pre_logits=True), atol=1e-5, rtol=0)
        torch.testing.assert_close(model(x), theirs(x), atol=1e-5, rtol=0)
    return features


def assert_runs_as_pytorch(run, model, **tolerance) -> None:
    """``run`` (an exported graph's runtime) gives ``model``'s outputs on batches of several sizes and shapes."""
    for batch, size in ((1, (32, 32)), (3, (16, 48)), (2, (48, 16))):
        images = torch.rand(batch, 3, *size)
        with torch.no_grad():
            expected = model(images)
        assert expected.abs().max() > 0.5
        torch.testing.assert_close(run(images), expected, **tolerance)


def exported_runtimes(model, folder, tolerance=1e-4) -> list:
    """``model`` exported to ONNX (and OpenVINO where installed) in ``folder``, each export's own check within
    ``tolerance``; the runtimes that run the files."""
    import importlib.util

    from vitkit.checkpoints import export
    from vitkit.checkpoints.onnx import OnnxModel

    assert export(model, folder / "m.onnx", "onnx").max_difference <= tolerance
    runs = [OnnxModel(folder / "m.onnx")]
    if importlib.util.find_spec("openvino"):
        from vitkit.checkpoints.openvino import OpenVinoModel

        assert export(model, folder / "m.xml", "openvino").max_difference <= tolerance
        runs.append(OpenVinoModel(folder / "m.xml"))
    return runs
