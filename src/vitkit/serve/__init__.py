"""``vitkit serve``: a classifier behind an HTTP endpoint, with dynamic batching, a bounded queue and a graceful
stop (``app``: the Starlette application; ``batching``: the batcher; ``classifier``: the model side)."""

from .app import Limits, build_app
from .batching import Batcher, Overloaded
from .classifier import Classifier, Preprocessing

__all__ = ["Batcher", "Classifier", "Limits", "Overloaded", "Preprocessing", "build_app"]
