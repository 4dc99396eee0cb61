"""What the PEFT benchmarks (peft_cost.py, peft_vtab_small.py) write beside their figures: the machine (CPU model,
flags and cores from /proc/cpuinfo, threads, torch, load before and after, date, wall time), and the record as
benchmarks/results/NAME.json with its report as NAME.md."""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vitkit.atomic import atomic_file

from bench_rope import cpu

RESULTS = Path(__file__).resolve().parent / "results"


def machine(threads: int, load_before: tuple[float, float, float], started: float, **loads) -> dict:
    """The machine a benchmark ran on and how busy it was: ``load_before`` (``os.getloadavg()`` at the start), any
    other ``loads`` taken on the way, the load now, and the wall seconds since ``started`` (``perf_counter``)."""
    return {**cpu(), "threads": threads, "torch": torch.__version__, "loadavg_before": load_before, **loads,
            "loadavg_after": os.getloadavg(), "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
            "wall_seconds": round(time.perf_counter() - started, 1)}


def write(name: str, record: dict, report: Callable[[dict], str]) -> str:
    """``record`` into results/NAME.json and ``report(record)`` into results/NAME.md, each whole or not at all."""
    with atomic_file(RESULTS / f"{name}.json") as handle:
        json.dump(record, handle, indent=1)
    text = report(record)
    with atomic_file(RESULTS / f"{name}.md") as handle:
        handle.write(text)
    return text
