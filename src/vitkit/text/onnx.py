"""The text tower of an image-text checkpoint exported to ONNX: token ids (batch, tokens) in, the text embeddings
(batch, E) out, unnormalised, as ``encode_text`` gives them. The tokenizer is not in the graph: ids come from the
checkpoint's own tokenizer (``vitkit.load_clip(CHECKPOINT).tokenize``, or the family's library), padded as that
tokenizer pads. The batch and the number of tokens (up to the context length) are dynamic. The export is checked
by ONNX Runtime against PyTorch on probe batches of another batch size and length than the traced one before it
is put in place, as the image tower's is (``checkpoints.onnx``)."""

from __future__ import annotations

import dataclasses
import io
import json
import warnings
from pathlib import Path

import torch

from ..atomic import move_into_place, staging_beside
from ..checkpoints.onnx import OPSET, OnnxExport, _require_runtime, checked_difference, session
from .clip import checkpoint_path, read_text_tower, text_transformer
from .model import TextConfig, TextTransformer

INPUT, OUTPUT = "ids", "embeddings"
CONFIG_KEY = "vitkit.text_config"
TOKENIZER_NOTE = ("not in the graph: token ids from the checkpoint's own tokenizer (vitkit.load_clip(CHECKPOINT)"
                  ".tokenize), padded as it pads")


def probe_ids(config: TextConfig) -> list[torch.Tensor]:
    """Fixed random ids an export is traced on (the first: two texts of the full context) and checked on (three
    texts of the full context, one of half of it), each row holding the end-of-text id the tower pools at where it
    pools one (``eos``), at a position of its own."""
    generator = torch.Generator().manual_seed(0)
    shapes = ((2, config.context_length), (3, config.context_length), (1, max(1, config.context_length // 2)))
    probes = []
    for batch, length in shapes:
        ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
        if config.pool == "eos":
            ids[torch.arange(batch), torch.randint(0, length, (batch,), generator=generator)] = config.eos_token_id
        probes.append(ids)
    return probes


def write_text_onnx(text: TextTransformer, path: str | Path, device: torch.device | str = "cpu",
                    metadata: dict[str, str] | None = None) -> OnnxExport:
    """Export the text tower ``text`` (traced on ``device``) to ``path`` with its config and ``metadata`` in the
    file's metadata, check it with ONNX Runtime against PyTorch, then put it in place."""
    onnx, _ = _require_runtime()
    path, device = Path(path), torch.device(device)
    text = text.to(device).eval()
    example, *checks = probe_ids(text.config)
    with torch.no_grad():
        probes = [(ids, text(ids.to(device)).float().cpu().numpy()) for ids in checks]
    traced = io.BytesIO()
    with warnings.catch_warnings():  # the tracer's notes on the length check, which holds at every length it takes
        warnings.simplefilter("ignore")
        torch.onnx.export(text, (example.to(device),), traced, dynamo=False, opset_version=OPSET, input_names=[INPUT],
                          output_names=[OUTPUT], dynamic_axes={INPUT: {0: "batch", 1: "tokens"}, OUTPUT: {0: "batch"}})
    graph = onnx.load_from_string(traced.getvalue())
    entries = {CONFIG_KEY: json.dumps(dataclasses.asdict(text.config)), "tokenizer": TOKENIZER_NOTE, **(metadata or {})}
    for key, value in entries.items():
        graph.metadata_props.add(key=key, value=value)
    with staging_beside(path) as tmp:
        exported = tmp / "text.onnx"
        onnx.save(graph, str(exported))
        run = session(exported, device)
        difference = checked_difference(lambda ids: run.run([OUTPUT], {INPUT: ids.numpy()})[0], probes, path,
                                        "ONNX Runtime", "embeddings")
        move_into_place((exported, path))
    return OnnxExport(path, OPSET, difference)


def export_text_onnx(checkpoint: str | Path, path: str | Path, device: torch.device | str = "cpu") -> OnnxExport:
    """The text tower of the image-text ``checkpoint`` (any ``vitkit.load_clip`` reads; its tokenizer files are not
    needed) written to ``path`` as ONNX by ``write_text_onnx``, with the stored ``logit_scale``, SigLIP's
    ``logit_bias`` (null for CLIP) and the family in the metadata."""
    source = checkpoint_path(checkpoint)
    tower = read_text_tower(source)
    bias = None if tower.logit_bias is None else tower.logit_bias.item()
    return write_text_onnx(text_transformer(tower, source), path, device,
                           {"logit_scale": json.dumps(tower.logit_scale.item()), "logit_bias": json.dumps(bias),
                            "family": tower.family})
