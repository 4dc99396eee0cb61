"""The model side of the server: a checkpoint or an exported graph loaded as ``vitkit predict`` loads it, uploads
decoded and preprocessed exactly as ``predict`` reads files, and batches of them run to class probabilities."""

from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass

import torch

from ..checkpoints.runnable import check_graph_inputs, load_inference, refuse_dense
from ..data.images import read_image
from ..errors import ConfigError
from ..evaluate.accuracy import check_eval_size, check_model_memory
from ..evaluate.predict import class_names, image_transform, most_probable
from ..models.naflex import patch_batch
from ..runtime import autocast


@dataclass(frozen=True)
class Preprocessing:
    """How an upload becomes the model's input: ``predict``'s ``--resize``, ``--keep-aspect``, ``--max-patches``."""

    resize: str = "crop"
    keep_aspect: bool = False
    max_patches: int | None = None


class Classifier:
    """A classifier ready to serve: ``prepare(bytes)`` gives one image's model input (any thread), ``run(inputs)``
    each input's class probabilities (the model's thread), ``ranked(probabilities, k)`` the top ``k`` as
    ``predict --json`` lists them, with the class index."""

    def __init__(self, checkpoint: str, overrides: dict | None = None, device: str | None = None,
                 precision: str = "fp32", adapter: str | None = None,
                 preprocessing: Preprocessing = Preprocessing(), max_batch_size: int = 1) -> None:
        check_model_memory(checkpoint, overrides, device, precision, adapter=adapter, command="vitkit serve")
        self.model, self.device, self.dtype = load_inference(checkpoint, overrides, device, precision,
                                                             adapter=adapter)
        config = self.model.config
        if not config.num_classes:
            raise ConfigError(f"{checkpoint}: the model has no classification head (num_classes=0); "
                              "vitkit serve answers with classes")
        refuse_dense(config, checkpoint, "vitkit serve")
        self.preprocessing = preprocessing
        if preprocessing.max_patches and preprocessing.keep_aspect:
            raise ConfigError("--keep-aspect and --max-patches: pick one way to keep each image's aspect ratio")
        check_graph_inputs(self.model, checkpoint, preprocessing.max_patches)
        check_eval_size(self.model, max_batch_size, max_batch_size, 0, preprocessing.max_patches, self.device,
                        self.dtype, command="vitkit serve")
        self.names = class_names(self.model)
        self.model.eval()
        self.warm_for = 0  # the largest batch run so far

    def prepare(self, data: bytes) -> torch.Tensor:
        """The upload ``data`` decoded (``read_image``: a ``DatasetError`` for anything unreadable) and brought to
        the model's input as ``predict`` brings a file."""
        pixels = read_image(io.BytesIO(data), name="the upload")
        steps = self.preprocessing
        return image_transform(self.model, pixels, steps.resize, steps.keep_aspect, steps.max_patches)(pixels)

    def warm_up(self, batch_size: int) -> None:
        """One batch of ``batch_size`` blank images of the model's size: the runtime's first-call work (kernel
        choice, an OpenVINO compile) done before the first request; nothing when a batch as large has run."""
        if self.warm_for >= batch_size:
            return
        config = self.model.config
        blank = torch.zeros(config.in_chans, *config.image_size)
        if self.preprocessing.max_patches:  # an image as many patches as the budget holds, in whole patches
            side = config.patch_size * int(self.preprocessing.max_patches ** 0.5)
            blank = torch.zeros(config.in_chans, side, side)
        self.run([blank] * batch_size)

    @torch.no_grad()
    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each input's class probabilities (float32), the inputs batched by size (a NaFlex batch takes every
        size at once)."""
        if self.preprocessing.max_patches:
            groups = {None: list(range(len(inputs)))}
        else:
            groups = defaultdict(list)
            for index, image in enumerate(inputs):
                groups[tuple(image.shape)].append(index)
        results: list[torch.Tensor | None] = [None] * len(inputs)
        for indices in groups.values():
            images = [inputs[i] for i in indices]
            if self.preprocessing.max_patches:
                batch = patch_batch(images, self.model.config.patch_size, self.preprocessing.max_patches)
                batch = batch.to(self.device)
            else:
                batch = torch.stack(images).to(self.device)
            with autocast(self.device, self.dtype):
                logits = self.model(batch)
            probabilities = logits.float().softmax(dim=-1).cpu()
            for row, index in zip(probabilities, indices):
                results[index] = row
        self.warm_for = max(self.warm_for, len(inputs))
        return results

    def ranked(self, probabilities: torch.Tensor, k: int) -> list[dict]:
        """The ``k`` most probable classes (every class where ``k`` is at least their number), most probable first,
        each as ``{"index", "label", "probability"}`` (rounded to 6 places, as ``predict --json``)."""
        return [{"index": index, "label": self.names[index], "probability": round(value, 6)}
                for index, value in zip(*most_probable(probabilities, k))]
