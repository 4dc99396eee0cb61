"""``vitkit serve --ray``: the same application as a Ray Serve deployment, for more than one process or machine.

Each replica loads the classifier, warms it up and answers through ``build_app``'s routes, batching with
``@serve.batch`` (``RayBatches``); Ray's proxy listens on the address given and spreads requests over the replicas.
The cluster is the one ``RAY_ADDRESS`` names (``auto``: the one this machine belongs to; ``ray://HEAD:10001``), or
a local one started for the server and stopped with it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray import serve

from .app import Limits, build_app
from .batching import Overloaded
from .classifier import Classifier, Preprocessing

APP_NAME = "vitkit"
STOP_TIMEOUT_S = 60  # how long a replica may take to answer the requests it holds when the server stops


class RayBatches:
    """``@serve.batch`` in the role of ``Batcher`` (``build_app``'s ``batching``): batches of up to ``max_batch_size``,
    the first request waiting at most ``max_wait_ms``, one batch at a time on a worker thread (the replica's event
    loop keeps accepting and decoding meanwhile); at most ``max_queue`` requests accepted and not yet in a running
    batch, decoding included, past which ``Overloaded``."""

    def __init__(self, run_batch: Callable[[list[Any]], Sequence[Any]], max_batch_size: int, max_wait_ms: float,
                 max_queue: int, on_batch: Callable[[int], None] | None = None) -> None:
        self.run_batch, self.on_batch, self.max_queue = run_batch, on_batch, max_queue
        self.depth = 0  # requests accepted and not yet in a running batch
        self.batched = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=max_wait_ms / 1000)(self._run)

    def start(self) -> None:
        """Nothing to start: Ray runs the batches on the replica's event loop."""

    def stop(self, timeout: float | None = None) -> None:
        """Nothing to stop: Ray answers the replica's requests before it ends."""

    async def submit(self, item: Any, prepare: Callable[[Any], Any] | None = None) -> Any:
        if self.depth >= self.max_queue:
            raise Overloaded(f"{self.depth} requests wait already in this replica (--max-queue {self.max_queue})")
        ticket = _Ticket(item)
        self.depth += 1
        try:
            if prepare is not None:
                ticket.item = await asyncio.get_running_loop().run_in_executor(None, prepare, item)
            return await self.batched(ticket)
        finally:  # a failed decode, or a request cancelled while it waited (Ray leaves it out of its batch)
            if ticket.waiting:
                ticket.waiting = False
                self.depth -= 1

    async def _run(self, tickets: list[_Ticket]) -> list[Any]:
        for ticket in tickets:
            ticket.waiting = False
        self.depth -= len(tickets)
        if self.on_batch is not None:
            self.on_batch(len(tickets))
        items = [ticket.item for ticket in tickets]
        return list(await asyncio.get_running_loop().run_in_executor(None, self.run_batch, items))


@dataclass
class _Ticket:
    """A request in a replica: its item, and whether it still counts as waiting for a batch."""

    item: Any
    waiting: bool = True


@dataclass(frozen=True)
class Model:
    """What each replica loads: ``Classifier``'s arguments."""

    checkpoint: str
    overrides: dict | None = None
    device: str | None = None
    precision: str = "fp32"
    adapter: str | None = None
    preprocessing: Preprocessing = Preprocessing()

    def load(self, max_batch_size: int) -> Classifier:
        return Classifier(self.checkpoint, self.overrides, self.device, self.precision, self.adapter,
                          self.preprocessing, max_batch_size)


@serve.deployment(graceful_shutdown_timeout_s=STOP_TIMEOUT_S)
@serve.ingress()
class ClassifierReplica:
    """One replica: the model loaded and warmed up before Ray routes a request to it, served by ``build_app``."""

    def __init__(self, model: Model, limits: Limits, threads: int | None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.classifier, self.limits = model.load(limits.max_batch_size), limits
        self.classifier.warm_up(limits.max_batch_size)

    def __serve_build_asgi_app__(self):
        return build_app(self.classifier, self.limits, batching=RayBatches)


def deployment(model: Model, limits: Limits, replicas: int = 1, threads: int | None = None):
    """The bound application: ``replicas`` replicas, each holding ``threads`` CPUs (1 by default) and one GPU when
    the device is CUDA; each replica takes up to a batch and its queue at once, and Ray's own queue in front of
    them holds at most ``max_queue`` more (past it Ray's proxy answers 503)."""
    gpus = 1 if (model.device or "").startswith("cuda") else 0
    return ClassifierReplica.options(
        num_replicas=replicas, max_ongoing_requests=limits.max_batch_size + limits.max_queue,
        max_queued_requests=limits.max_queue, ray_actor_options={"num_cpus": threads or 1, "num_gpus": gpus},
    ).bind(model, limits, threads)


def run(model: Model, limits: Limits, host: str, port: int, replicas: int = 1, threads: int | None = None,
        ready: Callable[[], None] | None = None) -> None:
    """Serve ``model`` on Ray at ``host``:``port`` until SIGTERM or SIGINT: the application deleted once its
    replicas have answered the requests they hold, then the local cluster stopped if this call started it."""
    address = os.environ.get("RAY_ADDRESS") or "local"
    # A local cluster's processes share this one's process group: a terminal's Ctrl-C reaches them too, and would
    # end them before the replicas have answered. They start with SIGINT ignored (kept across exec); this process
    # then handles it as the end of serving.
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ray.init(address=address, logging_level=logging.WARNING, include_dashboard=False)
    finally:
        signal.signal(signal.SIGINT, interrupt)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING",
                                                                              "enable_access_log": False})
        serve.run(deployment(model, limits, replicas, threads), name=APP_NAME, route_prefix="/",
                  logging_config={"log_level": "WARNING", "enable_access_log": False})
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if ready is not None:
            ready()
        stop.wait()
        serve.delete(APP_NAME)
        if address == "local":
            serve.shutdown()
    finally:
        ray.shutdown()
