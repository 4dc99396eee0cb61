"""Deprecated: the names this module held now live in their own modules (``vitkit.train.trainer``: ``Trainer``,
``LoopConfig``; ``.ema``; ``.metrics_log``; ``.signals``; ``vitkit.runtime``); each is still found here, with a
``DeprecationWarning``, for one release."""

from __future__ import annotations

import warnings

from .. import errors, runtime
from . import ema, metrics_log, signals, trainer

MOVED = {"Trainer": trainer, "LoopConfig": trainer, "EMA": ema, "MetricsLog": metrics_log, "StopRequest": signals,
         "TRAINING_PRECISIONS": runtime, "autocast_dtype": runtime, "TrainingDiverged": errors}


def __getattr__(name: str):
    """The moved ``name`` from its new module, with a warning naming where to import it from."""
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = MOVED[name]
    warnings.warn(f"vitkit.train.loop.{name} is deprecated; import it from {home.__name__}", DeprecationWarning,
                  stacklevel=2)
    return getattr(home, name)
