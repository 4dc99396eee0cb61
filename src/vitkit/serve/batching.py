"""Dynamic batching: requests from the event loop wait at most ``max_wait_ms`` to be run together, up to
``max_batch_size`` at a time, on one model thread; at most ``max_queue`` are accepted and not yet in a running
batch, their preparation (decoding) included (past that, ``Overloaded`` at once rather than an unbounded wait)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class Overloaded(Exception):
    """The queue is full (or the batcher has stopped): the request was not accepted."""


@dataclass
class _Waiting:
    item: Any
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Runs ``run_batch(items) -> results`` (one result per item, in order) on a thread of its own over the
    requests ``submit`` accepts. A batch starts when ``max_batch_size`` items wait, or when the oldest waiting item
    has waited ``max_wait_ms``; ``on_batch(size)`` is told each batch's size. ``stop`` refuses new requests, runs
    every one already accepted without waiting further, and ends the thread."""

    def __init__(self, run_batch: Callable[[list[Any]], Sequence[Any]], max_batch_size: int, max_wait_ms: float,
                 max_queue: int, on_batch: Callable[[int], None] | None = None) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch_size {max_batch_size} and max_queue {max_queue} must be at least 1, "
                             f"max_wait_ms {max_wait_ms} at least 0")
        self.run_batch, self.on_batch = run_batch, on_batch
        self.max_batch_size, self.max_wait_s, self.max_queue = max_batch_size, max_wait_ms / 1000, max_queue
        self._waiting: deque[_Waiting] = deque()
        self._accepted = 0  # requests accepted and not yet in a running batch: preparing, or waiting
        self._changed = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def depth(self) -> int:
        """Requests accepted and not yet in a running batch (being prepared, or waiting for a batch)."""
        return self._accepted

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="vitkit-batcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    async def submit(self, item: Any, prepare: Callable[[Any], Any] | None = None) -> Any:
        """The result of ``item`` (of ``prepare(item)``, run on a worker thread, where given) once its batch has
        run (the batch's exception if it failed, ``prepare``'s if that failed); ``Overloaded`` at once when
        ``max_queue`` requests are accepted already or the batcher is stopping."""
        loop = asyncio.get_running_loop()
        with self._changed:
            if self._stopping:
                raise Overloaded("the server is stopping")
            if self._accepted >= self.max_queue:
                raise Overloaded(f"{self._accepted} requests wait already (--max-queue {self.max_queue})")
            self._accepted += 1
        try:
            if prepare is not None:
                item = await loop.run_in_executor(None, prepare, item)
        except BaseException:
            with self._changed:
                self._accepted -= 1
                self._changed.notify()
            raise
        waiting = _Waiting(item, loop.create_future(), loop)
        with self._changed:
            self._waiting.append(waiting)
            self._changed.notify()
        return await waiting.future

    def _next_batch(self) -> list[_Waiting] | None:
        """The next batch, once it is full or its oldest item has waited long enough (at once when stopping);
        None when stopped with no request left."""
        with self._changed:
            while True:
                if self._waiting:
                    left = self._waiting[0].arrived + self.max_wait_s - time.monotonic()
                    if len(self._waiting) >= self.max_batch_size or left <= 0 or self._stopping:
                        batch = [self._waiting.popleft() for _ in range(min(self.max_batch_size, len(self._waiting)))]
                        self._accepted -= len(batch)
                        return batch
                    self._changed.wait(left)
                elif self._stopping and not self._accepted:
                    return None
                else:
                    self._changed.wait()

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            if self.on_batch is not None:
                self.on_batch(len(batch))
            try:
                results = list(self.run_batch([waiting.item for waiting in batch]))
                if len(results) != len(batch):
                    raise RuntimeError(f"run_batch gave {len(results)} results for {len(batch)} items")
            except Exception as error:  # every request of the batch is answered with the failure
                results = [error] * len(batch)
            for waiting, result in zip(batch, results):
                waiting.loop.call_soon_threadsafe(_settle, waiting.future, result)


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():  # the client went away and its request was cancelled
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
