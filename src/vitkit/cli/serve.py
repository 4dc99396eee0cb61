"""``vitkit serve``: a checkpoint or an export behind an HTTP endpoint (uvicorn running ``vitkit.serve``'s
application), with dynamic batching, a bounded queue and a graceful stop on SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import torch

from ..declare import Float, Int
from ..errors import ConfigError
from ..declare_flags import reader
from .flags import checkpoint_flags, max_patches_flag, model_source, positive, positive_number, resize_flag, \
    runtime_flags

HELP: dict[str, tuple[str, str | None]] = {
    "serve": ("Serve a classifier over HTTP: POST an image to /v1/classify, with dynamic batching.",
              "examples:\n"
              "  vitkit serve runs/x/model --port 8000\n"
              "  curl --data-binary @cat.jpg -H 'Content-Type: image/jpeg' 'localhost:8000/v1/classify?top_k=3'\n"
              "  vitkit serve vit_s16.xml --precision auto --max-batch-size 32 --max-wait-ms 10"),
}

wait_ms = reader(Float(0, 10_000))
port = reader(Int(0, 65_535))


def register(sub: argparse._SubParsersAction) -> None:
    """Add the command to ``sub``, the subparsers of ``vitkit``."""
    parser = sub.add_parser("serve", help="a classifier behind an HTTP endpoint")
    checkpoint_flags(parser, help="anything vitkit.load reads, an .onnx file or an OpenVINO .xml")
    parser.add_argument("--host", default="127.0.0.1",
                       help="the address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every "
                            "interface)")
    parser.add_argument("--port", type=port, default=8000, help="the TCP port (default: 8000; 0: one the system picks)")
    parser.add_argument("--max-batch-size", type=positive, default=16, metavar="N",
                       help="the most images run together (default: 16; 1 turns batching off)")
    parser.add_argument("--max-wait-ms", type=wait_ms, default=5.0, metavar="M",
                       help="how long the first request of a batch waits for more (default: 5)")
    parser.add_argument("--max-queue", type=positive, default=64, metavar="Q",
                       help="the most requests waiting for a batch; past it the answer is 503 with Retry-After "
                            "(default: 64)")
    parser.add_argument("--max-body-mb", type=positive_number, default=20.0, metavar="B",
                       help="the largest upload in MiB; larger ones are refused with 413 (default: 20)")
    parser.add_argument("--threads", type=positive, metavar="T",
                       help="intra-op threads of the runtime (default: torch's, the CPUs it may use)")
    parser.add_argument("--keep-aspect", action="store_true",
                       help="resize each image to its own aspect ratio (as vitkit predict --keep-aspect)")
    resize_flag(parser)
    max_patches_flag(parser)
    runtime_flags(parser)
    cluster = parser.add_argument_group("past one process (Ray Serve; pip install 'vitkit[ray]')")
    cluster.add_argument("--ray", action="store_true",
                         help="serve as a Ray Serve deployment: on the cluster RAY_ADDRESS names (auto: the one this "
                              "machine belongs to), else on a local one started and stopped with the server")
    cluster.add_argument("--replicas", type=positive, metavar="R",
                         help="--ray: copies of the model, each with --threads CPUs (default 1) and one GPU when "
                              "--device is cuda (default: 1)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Bind the port, load and check the model, then serve until SIGTERM or SIGINT (exit 0)."""
    if args.replicas and not args.ray:
        raise ConfigError("--replicas counts Ray Serve replicas: add --ray")
    try:
        from ..serve import Classifier, Limits, Preprocessing, build_app
        from ..serve.server import listening_socket, serve
    except ImportError as error:
        raise ImportError(f"vitkit serve needs Starlette, uvicorn and prometheus_client: pip install "
                          f"'vitkit[serve]' ({error})") from None
    limits = Limits(args.max_batch_size, args.max_wait_ms, args.max_queue, args.max_body_mb)
    preprocessing = Preprocessing(args.resize, args.keep_aspect, args.max_patches)
    if args.ray:
        return run_on_ray(args, limits, preprocessing)
    sock = listening_socket(args.host, args.port)
    if args.threads:
        torch.set_num_threads(args.threads)  # ONNX Runtime and OpenVINO take as many as torch
    classifier = Classifier(args.checkpoint, args.overrides, args.device, args.precision, args.adapter,
                            preprocessing, args.max_batch_size)
    app = build_app(classifier, limits)
    host, port = sock.getsockname()[:2]
    print(f"vitkit serve: {model_source(args)} on http://{host}:{port} (POST /v1/classify; batches of up to "
          f"{limits.max_batch_size}, {limits.max_wait_ms:g} ms wait, queue {limits.max_queue}); Ctrl-C or SIGTERM "
          f"stops it", file=sys.stderr, flush=True)
    serve(app, sock)
    print("vitkit serve: stopped; every accepted request was answered", file=sys.stderr, flush=True)
    return 0


def run_on_ray(args: argparse.Namespace, limits, preprocessing) -> int:
    """``--ray``: the model checked here on the CPU as the plain server checks it (one-line refusals rather than a
    replica's traceback), then served by Ray Serve's proxy at ``--host``:``--port`` until SIGTERM or SIGINT. On a
    local cluster the address is tried first (a port in use is said at once; port 0 picks one)."""
    try:
        from ..serve.ray_serve import Model, run as run_ray
        from ..serve.server import listening_socket
    except ImportError as error:
        raise ImportError(f"vitkit serve --ray needs Ray Serve: pip install 'vitkit[ray]' ({error})") from None
    host, port = args.host, args.port
    if not os.environ.get("RAY_ADDRESS"):
        with listening_socket(host, port) as sock:
            port = sock.getsockname()[1]  # free now, for Ray's proxy
    elif port == 0:
        raise ConfigError("--port 0 on a Ray cluster (RAY_ADDRESS): name the port its proxies should listen on")
    model = Model(args.checkpoint, args.overrides, args.device, args.precision, args.adapter, preprocessing)
    replace(model, device="cpu").load(limits.max_batch_size)
    replicas = args.replicas or 1

    def ready() -> None:
        print(f"vitkit serve: {model_source(args)} on http://{host}:{port} (Ray Serve, {replicas} replica(s); POST "
              f"/v1/classify; batches of up to {limits.max_batch_size}, {limits.max_wait_ms:g} ms wait); Ctrl-C or "
              f"SIGTERM stops it", file=sys.stderr, flush=True)

    run_ray(model, limits, host, port, replicas, args.threads, ready)
    print("vitkit serve: stopped; the replicas answered the requests they held", file=sys.stderr, flush=True)
    return 0
