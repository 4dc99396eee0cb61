"""What every training benchmark records beside its result: the wall time, and the load average before
and after (the machine may be shared; a load above the number of cores inflates times, not accuracies)."""

from __future__ import annotations

import os
import time
from typing import Any

from vitkit.train import Recipe, run


def timed_run(recipe: Recipe) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train as ``recipe`` says: the run's summary, and its wall seconds and load averages."""
    load_before, started = os.getloadavg(), time.perf_counter()
    summary = run(recipe)
    return summary, {"wall_seconds": round(time.perf_counter() - started, 1), "loadavg_before": load_before,
                     "loadavg_after": os.getloadavg()}
