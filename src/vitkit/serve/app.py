"""The HTTP face of the server, a Starlette application: ``POST /v1/classify``, ``GET /health``, ``GET /metrics``
(Prometheus' text format). Every refusal is JSON ``{"error": "..."}`` with its status; nothing an upload holds can
end the process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import DatasetError, InputError
from .batching import Batcher, Overloaded
from .classifier import Classifier

RETRY_AFTER_S = 1  # what a refused client is told to wait before it tries again
IMAGE_TYPES = ("image/", "application/octet-stream")  # a raw body; the decoder decides what it holds
MULTIPART = "multipart/form-data"


@dataclass(frozen=True)
class Limits:
    """``--max-batch-size``, ``--max-wait-ms``, ``--max-queue``, ``--max-body-mb``."""

    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    max_queue: int = 64
    max_body_mb: float = 20.0

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (several servers in one process stay apart)."""

    def __init__(self, max_batch_size: int) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("vitkit_requests", "HTTP requests answered, by path and status",
                                ["path", "status"], registry=self.registry)
        self.latency = Histogram("vitkit_request_latency_seconds", "time from a classify request's arrival to its "
                                 "answer", registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        sizes = sorted({1, *(2**k for k in range(max_batch_size.bit_length() + 1) if 2**k <= max_batch_size),
                        max_batch_size})
        self.batch = Histogram("vitkit_batch_images", "images in each batch the model ran", buckets=sizes,
                               registry=self.registry)
        self.queue = Gauge("vitkit_queue_depth", "requests accepted and not yet in a running batch",
                           registry=self.registry)


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class TooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (``TooLarge``) as soon as it is known to exceed ``limit`` bytes: from its
    Content-Length before anything is read, or while a body without one streams in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is {int(declared):,} bytes, more than --max-body-mb allows ({limit:,} bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is more than --max-body-mb allows ({limit:,} bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


async def uploaded_image(request: Request, body: bytes) -> bytes:
    """The image bytes of a classify request: the raw body (an image content type), or the multipart field
    ``file``; ``HTTPException`` 415/400 otherwise."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind.startswith(IMAGE_TYPES):
        return body
    if kind != MULTIPART:
        got = f"Content-Type {kind!r}" if kind else "no Content-Type"
        raise HTTPException(415, f"expected the image as the body (Content-Type image/png, image/jpeg, ...) or as "
                                 f"the multipart field 'file'; got {got}")

    async def replay() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=1, max_fields=16)
    except Exception as problem:  # the multipart parser's refusals carry no common base
        raise HTTPException(400, f"unreadable multipart body ({problem})") from None
    try:
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise HTTPException(400, "the multipart body has no file field named 'file'")
        return await upload.read()
    finally:
        await form.close()


def top_k_of(request: Request) -> int:
    text = request.query_params.get("top_k", "5")
    if not text.isdigit() or int(text) < 1:
        raise HTTPException(400, f"top_k: expected a whole number of at least 1, got {text!r}")
    return int(text)


def build_app(classifier: Classifier, limits: Limits = Limits(), batching: type = Batcher) -> Starlette:
    """The application serving ``classifier`` with dynamic batching within ``limits``, by ``batching``: a class
    made as ``Batcher`` is, with its ``submit``, ``depth``, ``start`` and ``stop`` (``ray_serve.RayBatches`` in a
    Ray replica). Its lifespan warms the model up on a worker thread and then starts the batcher (``/health``
    answers 503 until then; requests accepted meanwhile wait in the queue) and, at the end, answers every accepted
    request before the batcher stops."""
    metrics = Metrics(limits.max_batch_size)
    batcher = batching(classifier.run, limits.max_batch_size, limits.max_wait_ms, limits.max_queue,
                       on_batch=metrics.batch.observe)
    ready = threading.Event()

    async def classify(request: Request) -> Response:
        started = time.perf_counter()
        try:
            top_k = top_k_of(request)
            body = await read_body(request, limits.max_body_bytes)
            image = await uploaded_image(request, body)
            probabilities = await batcher.submit(image, classifier.prepare)  # decoded off the model's thread
        except TooLarge as problem:
            return error(413, str(problem))
        except (DatasetError, InputError) as problem:
            return error(400, str(problem))
        except Overloaded as problem:
            return error(503, f"busy: {problem}; retry after {RETRY_AFTER_S} s", {"Retry-After": str(RETRY_AFTER_S)})
        finally:
            metrics.queue.set(batcher.depth)
        metrics.latency.observe(time.perf_counter() - started)
        return JSONResponse({"top_k": classifier.ranked(probabilities, top_k)})

    async def health(request: Request) -> Response:
        if not ready.is_set():
            return error(503, "warming up")
        return JSONResponse({"status": "ok", "batch_queue": batcher.depth})

    async def show_metrics(request: Request) -> Response:
        metrics.queue.set(batcher.depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, problem: HTTPException) -> Response:
        detail = problem.detail
        if problem.status_code == 404:
            detail = f"no such path {request.url.path!r}; the server answers /v1/classify, /health and /metrics"
        elif problem.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        return error(problem.status_code, detail, problem.headers)

    async def server_error(request: Request, problem: Exception) -> Response:
        return error(500, f"the model failed on this request ({type(problem).__name__}: {problem})")

    def warm_up() -> None:
        try:
            classifier.warm_up(limits.max_batch_size)
            ready.set()
        finally:  # a model that fails its warm-up answers each request with its failure, not with silence
            batcher.start()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        warming = asyncio.get_running_loop().run_in_executor(None, warm_up)  # /health: 503 until it is done
        yield
        await asyncio.gather(warming, return_exceptions=True)
        batcher.stop()

    app = Starlette(routes=[Route("/v1/classify", classify, methods=["POST"]), Route("/health", health),
                            Route("/metrics", show_metrics)],
                    exception_handlers={HTTPException: http_error, Exception: server_error}, lifespan=lifespan)
    app.add_middleware(CountRequests, counter=metrics.requests)
    app.state.batcher, app.state.ready, app.state.metrics = batcher, ready, metrics
    return app


class CountRequests:
    """ASGI middleware counting each HTTP answer by path (the three the server has, else ``other``) and status."""

    PATHS = ("/v1/classify", "/health", "/metrics")

    def __init__(self, app, counter: Counter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in self.PATHS else "other"

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                self.counter.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
