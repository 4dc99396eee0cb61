"""What every training benchmark records beside its result: the wall time, and the load average before
and after (the machine may be shared; a load above the number of cores inflates times, not accuracies); and
the paths of a record, relative to the repository root so that no record names the machine it ran on."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from vitkit.train import Recipe, run

REPO = Path(__file__).resolve().parents[1]


def timed_run(recipe: Recipe) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train as ``recipe`` says: the run's summary, and its wall seconds and load averages."""
    load_before, started = os.getloadavg(), time.perf_counter()
    summary = run(recipe)
    return summary, {"wall_seconds": round(time.perf_counter() - started, 1), "loadavg_before": load_before,
                     "loadavg_after": os.getloadavg()}


def repo_relative(path: str | os.PathLike | None) -> str | None:
    """``path`` as a results file records it: relative to the repository root (the data root as
    ``../shared/data``, a run folder as ``runs/bench/NAME``); a relative path is taken from the current folder,
    the repository root where the benchmarks run. None (or an empty path) stays as it is."""
    return os.path.relpath(os.path.abspath(path), REPO) if path else path


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
