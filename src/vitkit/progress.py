"""Progress of long loops: a bar on a terminal; in logs, CI and tests, plain logged lines or nothing.

The bars are tqdm's: one small pure-Python package that timm, transformers and huggingface_hub already
install beside vitkit, which can hand log records to the line above a live bar (``logging_redirect_tqdm``).
A bar is drawn only when stderr is a terminal, so that redirected output stays line by line.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

from tqdm import tqdm

Item = TypeVar("Item")


def on_terminal(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def track(items: Iterable[Item], description: str, total: int | None = None, unit: str = "batch",
          stream: TextIO | None = None) -> Iterator[Item]:
    """``items``, drawn as a bar while they are consumed on a terminal; untouched elsewhere."""
    if not on_terminal(stream):
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        with contextlib.suppress(TypeError):  # a DataLoader over a stream has no length
            total = len(items)
    with tqdm(items, desc=description, total=total, unit=unit, file=stream or sys.stderr, leave=False,
              dynamic_ncols=True) as bar:
        yield from bar


class StepProgress:
    """Progress of a run to step ``total``: on a terminal a bar with the last reported metrics; elsewhere
    each report is one line logged to ``logger``. ``quiet`` (the other ranks of a distributed run) shows nothing."""

    def __init__(self, total: int, done: int, logger: logging.Logger, quiet: bool = False,
                 stream: TextIO | None = None):
        self.total, self.first, self.started = total, done, time.perf_counter()
        self.logger, self.quiet = logger, quiet
        self.bar = (tqdm(total=total, initial=done, desc="train", unit="step", file=stream or sys.stderr,
                         dynamic_ncols=True) if on_terminal(stream) and not quiet else None)

    def advance(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def report(self, step: int, values: dict[str, float], images_per_s: float) -> None:
        """The metrics ``values`` at ``step`` (the last part of each name shown) and the recent speed."""
        if self.quiet:
            return
        metrics = " ".join(f"{name.split('/')[-1]} {value:.4g}" for name, value in values.items())
        if self.bar is not None:
            self.advance(step)
            self.bar.set_postfix_str(f"{metrics} | {images_per_s:,.0f} img/s")
            return
        eta = (time.perf_counter() - self.started) / max(step - self.first, 1) * (self.total - step)
        hours, seconds = divmod(int(max(0.0, eta)), 3600)
        eta_text = f"{hours:02d}:{seconds // 60:02d}:{seconds % 60:02d}"  # hours past a day counted on
        self.logger.info(f"step {step}/{self.total} {100 * step / self.total:3.0f}% | {metrics} | "
                         f"{images_per_s:,.0f} img/s | ETA {eta_text}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
