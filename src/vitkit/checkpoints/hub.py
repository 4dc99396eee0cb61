"""Checkpoints named by where they live online, fetched once into the user's cache.

``hf-hub:ORG/NAME[@REVISION]`` goes through ``huggingface_hub`` (its cache, its offline mode, its
token); ``gs://vit_models/...`` (Google's bucket of the paper's and AugReg's ``.npz`` files) is
downloaded over HTTPS from the bucket's public address (``$VITKIT_GS_URL`` points at a mirror) into
``vitkit.cache.cache_dir()``.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from ..atomic import atomic_file
from ..cache import cache_dir
from ..errors import CheckpointError
from ..paths import id_segments, resolved, within

HF_PREFIX = "hf-hub:"
GS_PREFIX = "gs://"
GS_PUBLIC_URL = "https://storage.googleapis.com"
HF_FILES = ["config.json", "preprocessor_config.json", "*.safetensors", "pytorch_model.bin", "*.npz"]


def is_remote(name: str) -> bool:
    return name.startswith((HF_PREFIX, GS_PREFIX))


def resolve(name: str, also: tuple[str, ...] = ()) -> Path:
    """The local path of a remote checkpoint, downloading it first unless it is cached; ``also``: patterns of the
    hub repository's files fetched beside the weights and configs (a text tower's tokenizer files)."""
    if name.startswith(HF_PREFIX):
        return _from_hf_hub(name.removeprefix(HF_PREFIX), also)
    return _from_bucket(name.removeprefix(GS_PREFIX))


def _from_hf_hub(repo: str, also: tuple[str, ...] = ()) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError as error:
        raise CheckpointError("hf-hub: ids need the huggingface_hub package (pip install 'vitkit[hub]')") from error
    repo_id, _, revision = repo.partition("@")
    id_segments(repo_id, HF_PREFIX, CheckpointError)
    if revision:
        id_segments(revision, f"{HF_PREFIX}{repo_id}@", CheckpointError)
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=[*HF_FILES, *also]))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        raise CheckpointError(f"{HF_PREFIX}{repo}: not in the local cache and not downloadable ({error})") from error


def _from_bucket(blob: str) -> Path:
    """The cached copy of bucket object ``blob``; its name is parsed strictly and its copy kept inside the cache
    (a link planted there is not followed out of it)."""
    id_segments(blob, GS_PREFIX, CheckpointError)
    local = within(resolved(cache_dir() / "gs"), blob, CheckpointError, f"{GS_PREFIX}{blob}: the cached copy")
    if local.exists():
        return local
    url = f"{os.environ.get('VITKIT_GS_URL', GS_PUBLIC_URL).rstrip('/')}/{blob}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response, atomic_file(local, "wb") as handle:
            shutil.copyfileobj(response, handle)
    except (urllib.error.URLError, OSError) as error:
        raise CheckpointError(f"{GS_PREFIX}{blob}: not in {local.parent} and the download from {url} "
                              f"failed ({error})") from error
    return local
