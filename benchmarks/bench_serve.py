"""Serving throughput and latency: ``vitkit serve`` with dynamic batching against ``--max-batch-size 1`` and against
a plain FastAPI endpoint that calls the same model once per request, in one run on one machine, for the PyTorch
checkpoint and for its OpenVINO export (results: benchmarks/results/serve_cpu.md and .json).

    PYTHONPATH=src python benchmarks/bench_serve.py [--clients 16] [--seconds 30] [--threads 2]

Every server runs ViT-S/16 (random weights: speed does not depend on them) in a process of its own with the same
intra-op threads and precision (``auto``: bf16 where the CPU has it natively, which OpenVINO uses and PyTorch's
autocast uses too), on loopback; the load is ``--clients`` concurrent clients (one asyncio process, httpx, a
connection each), each posting the same 224 px JPEG and waiting for its answer before the next, for ``--seconds``
after a warm-up. Throughput is answers per second; latency from the request's start to its answer. The FastAPI
endpoint is what a first server looks like: ``def classify(file: UploadFile)``, FastAPI running it in its thread
pool, decoding and preprocessing as ``vitkit serve`` does, one image per model call. The model's own cost (the
goal: p99 within 2x of a batch's compute time) is measured in-process before the servers start: the median of 10
calls on one image and on a batch of ``--max-batch-size``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

from vitkit.atomic import atomic_file
from vitkit.models import Provenance, ViTConfig, VisionTransformer

from timing import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = Path("runs/bench/serve")
SRC = str(Path(__file__).resolve().parents[1] / "src")

PLAIN_SERVER = textwrap.dedent('''
    import sys
    import uvicorn
    from fastapi import FastAPI, UploadFile
    from vitkit.serve import Classifier

    classifier = Classifier(sys.argv[1], precision=sys.argv[3])
    classifier.warm_up(1)
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/v1/classify")
    def classify(file: UploadFile):
        probabilities = classifier.run([classifier.prepare(file.file.read())])[0]
        return {"top_k": classifier.ranked(probabilities, 5)}

    print(f"plain FastAPI on http://127.0.0.1:{sys.argv[2]} ", file=sys.stderr, flush=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
''')


def photo(path: Path) -> bytes:
    """A 224 px JPEG with a photo's statistics (smooth regions and edges), made here."""
    from PIL import Image, ImageFilter

    noise = np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)
    image = Image.fromarray(noise).resize((224, 224), Image.BICUBIC).filter(ImageFilter.GaussianBlur(2))
    image.save(path, quality=90)
    return path.read_bytes()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(command: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    environment = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen(command, env=environment, stderr=subprocess.PIPE, text=True)
    while not (found := re.search(r" on (http://[\d.]+:\d+) ", line := process.stderr.readline())):
        if not line:
            raise SystemExit(f"{' '.join(command)} ended before it listened")
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(found.group(1) + "/health").status_code == 200:
                return process, found.group(1)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{command} never became healthy")


async def load(url: str, data: bytes, clients: int, seconds: float, warm_s: float) -> dict:
    """``clients`` closed-loop clients for ``warm_s`` + ``seconds``; the answers of the last ``seconds`` counted."""
    import httpx

    latencies, statuses = [], {}
    begin = time.perf_counter()
    counted_from, end = begin + warm_s, begin + warm_s + seconds

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as session:
            while (now := time.perf_counter()) < end:
                answer = await session.post("/v1/classify", files={"file": ("photo.jpg", data, "image/jpeg")})
                done = time.perf_counter()
                if now >= counted_from and done <= end:
                    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                    if answer.status_code == 200:
                        latencies.append(done - now)

    await asyncio.gather(*(client() for _ in range(clients)))
    latencies.sort()
    return {"answers_per_s": round(len(latencies) / seconds, 2), "answered": len(latencies), "statuses": statuses,
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
            "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
            "mean_ms": round(1000 * statistics.fmean(latencies), 1)}


def batch_compute_ms(model: Path, precision: str, batch: int, threads: int) -> float:
    from vitkit.serve import Classifier

    torch.set_num_threads(threads)
    classifier = Classifier(str(model), precision=precision)
    images = [torch.randn(3, 224, 224)] * batch
    classifier.run(images)
    times = []
    for _ in range(10):
        started = time.perf_counter()
        classifier.run(images)
        times.append(time.perf_counter() - started)
    return round(1000 * statistics.median(times), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--warm-seconds", type=float, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-wait-ms", type=float, default=5)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--runtimes", nargs="+", default=["pytorch", "openvino"], choices=["pytorch", "openvino"])
    args = parser.parse_args()
    from vitkit.cli import main as vitkit_main
    from vitkit.runtime import resolve_precision

    RUNS.mkdir(parents=True, exist_ok=True)
    checkpoint = RUNS / "vit_s16"
    torch.manual_seed(0)
    VisionTransformer(ViTConfig(dim=384, depth=12, num_heads=6, mlp_dim=1536, num_classes=1000,
                                provenance=Provenance(normalization="imagenet"))).save(checkpoint)
    sources = {"pytorch": checkpoint}
    if "openvino" in args.runtimes:
        sources["openvino"] = RUNS / "vit_s16.xml"
        assert vitkit_main(["convert", str(checkpoint), str(sources["openvino"]), "--to", "openvino"]) == 0
    data = photo(RUNS / "photo.jpg")
    dtype = str(resolve_precision(args.precision, torch.device("cpu"))).removeprefix("torch.")
    rows, costs = [], {}
    for runtime in args.runtimes:
        model = sources[runtime]
        costs[runtime] = {"single_image_ms": batch_compute_ms(model, args.precision, 1, args.threads),
                          "batch_ms": batch_compute_ms(model, args.precision, args.max_batch_size, args.threads)}
        print(f"{runtime}: {costs[runtime]}", flush=True)
        vitkit = [sys.executable, "-m", "vitkit", "serve", str(model), "--threads", str(args.threads), "--precision",
                  args.precision, "--port", "0"]
        servers = {
            f"vitkit serve, batches of up to {args.max_batch_size}, {args.max_wait_ms:g} ms wait":
                [*vitkit, "--max-batch-size", str(args.max_batch_size), "--max-wait-ms", str(args.max_wait_ms),
                 "--max-queue", str(4 * args.clients)],
            "vitkit serve --max-batch-size 1": [*vitkit, "--max-batch-size", "1", "--max-queue", str(4 * args.clients)],
            "plain FastAPI endpoint, one model call a request": [sys.executable, "-c", PLAIN_SERVER, str(model),
                                                                 str(free_port()), args.precision],
        }
        for name, command in servers.items():
            process, url = start(command, args.threads)
            before = os.getloadavg()[0]
            try:
                measured = asyncio.run(load(url, data, args.clients, args.seconds, args.warm_seconds))
            finally:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:  # the plain endpoint's thread pool may still be running requests
                    process.kill()
                    process.wait()
            rows.append({"runtime": runtime, "server": name, **measured, "load_before": round(before, 2),
                         "load_after": round(os.getloadavg()[0], 2)})
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(20)  # the load average settles between servers
    import fastapi
    import starlette
    import uvicorn

    cpu = cpu_model()
    record = {"date": datetime.date.today().isoformat(), "cpu": cpu, "cores": os.cpu_count(),
              "torch": torch.__version__, "starlette": starlette.__version__, "uvicorn": uvicorn.__version__,
              "fastapi": fastapi.__version__, "threads": args.threads, "clients": args.clients,
              "seconds": args.seconds, "precision": args.precision, "computes_in": dtype, "model_cost": costs,
              "max_batch_size": args.max_batch_size, "rows": rows,
              "command": "PYTHONPATH=src python benchmarks/bench_serve.py " + " ".join(sys.argv[1:])}
    with atomic_file(RESULTS / "serve_cpu.json") as handle:
        json.dump(record, handle, indent=1)
    lines = ["# Serving ViT-S/16 on a CPU: dynamic batching against one image a call", "",
             f"`{record['command']}` on {record['date']}: {cpu}, {record['cores']} cores, {args.threads} intra-op "
             f"threads in every server, precision {args.precision} ({dtype} on this CPU), torch {record['torch']}, "
             f"Starlette {record['starlette']}, uvicorn {record['uvicorn']}, FastAPI {record['fastapi']}. "
             f"{args.clients} concurrent clients on loopback, each posting a 224 px JPEG and waiting for the answer, "
             f"for {args.seconds:g} s after {args.warm_seconds:g} s of warm-up. The model alone (median of 10 calls): "
             + "; ".join(f"{runtime} {cost['single_image_ms']} ms an image, {cost['batch_ms']} ms a batch of "
                         f"{args.max_batch_size} ({1000 * args.max_batch_size / cost['batch_ms']:.1f} images/s "
                         f"against {1000 / cost['single_image_ms']:.1f} one by one)"
                         for runtime, cost in costs.items()) + ".", "",
             "| runtime | server | answers/s | vs plain FastAPI | p50 latency | p99 latency | p99 / batch compute "
             "| statuses | load before -> after |",
             "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for row in rows:
        plain = next(r for r in rows if r["runtime"] == row["runtime"] and "FastAPI" in r["server"])
        lines.append(f"| {row['runtime']} | {row['server']} | {row['answers_per_s']:.1f} | "
                     f"{row['answers_per_s'] / plain['answers_per_s']:.2f}x | {row['p50_ms']:.0f} ms | "
                     f"{row['p99_ms']:.0f} ms | {row['p99_ms'] / costs[row['runtime']]['batch_ms']:.2f}x | "
                     f"{row['statuses']} | {row['load_before']:.2f} -> {row['load_after']:.2f} |")
    with atomic_file(RESULTS / "serve_cpu.md") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
