"""``vitkit serve`` against a real server on loopback (a child process, as a user starts it): answers equal to
``vitkit predict --json``, batching, the bounded queue, hostile uploads, the graceful stop; the batcher and the
application's warm-up in-process."""

import asyncio
import json
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from launch import VITKIT, child_env  # noqa: E402
from vitkit.cli import main  # noqa: E402
from vitkit.models import Provenance, ViTConfig, VisionTransformer  # noqa: E402
from vitkit.serve import Batcher, Classifier, Limits, Overloaded, build_app  # noqa: E402

CLASSES = ("ant", "bee", "cat", "dog", "eel")


def small_model(**changes) -> VisionTransformer:
    config = ViTConfig(image_size=16, patch_size=4, dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=len(CLASSES),
                       provenance=Provenance(classes=CLASSES, normalization="imagenet"), **changes)
    model = VisionTransformer(config).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would make every probability equal
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("serve") / "model"
    small_model().save(path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    """PNG and JPEG photos-like images of several sizes and modes."""
    folder = tmp_path_factory.mktemp("images")
    generator = np.random.default_rng(0)
    paths = []
    for index, (height, width, mode, suffix) in enumerate([(16, 16, "RGB", "png"), (40, 24, "RGB", "jpg"),
                                                           (21, 33, "L", "png"), (64, 64, "RGB", "png"),
                                                           (30, 50, "RGBA", "png"), (17, 17, "RGB", "jpg")]):
        pixels = generator.integers(0, 256, (height, width, len(mode)), dtype=np.uint8)
        path = folder / f"image{index}.{suffix}"
        Image.fromarray(pixels[..., 0] if mode == "L" else pixels, mode).save(path)
        paths.append(path)
    return paths


class Server:
    """``vitkit serve`` in a child process on a port the system picks, ready once /health answers 200."""

    def __init__(self, *args, port: int = 0) -> None:
        self.process = subprocess.Popen([*VITKIT, "serve", *map(str, args), "--port", str(port)], env=child_env(),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            while not (found := re.search(r" on (http://[\d.]+:\d+) ", lines[-1] if lines else "")):
                lines.append(self.process.stderr.readline())
                assert lines[-1], "".join(lines)[-3000:]  # it ended before it listened
            self.url = found.group(1)
            self.client = httpx.Client(base_url=self.url, timeout=60)
            deadline = time.monotonic() + 120
            while self.client.get("/health").status_code != 200:
                assert time.monotonic() < deadline and self.process.poll() is None, "the server never got ready"
                time.sleep(0.05)
        except BaseException:
            self.process.kill()
            raise

    def classify(self, data: bytes, content_type: str = "image/png", **params) -> httpx.Response:
        with httpx.Client(base_url=self.url, timeout=60) as client:  # one connection each: threads may share none
            return client.post("/v1/classify", content=data, headers={"Content-Type": content_type}, params=params)

    def stop(self) -> tuple[int, str]:
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, stderr = self.process.communicate(timeout=60)
        return self.process.returncode, stderr


@pytest.fixture
def server(request, checkpoint):
    started = []

    def start(*args, model=checkpoint) -> Server:
        started.append(Server(model, *args))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def predicted(capsys, model, paths, *flags) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", str(model), *map(str, paths), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def content_type(path: Path) -> str:
    return "image/jpeg" if path.suffix == ".jpg" else "image/png"


def assert_same_answers(served: list[dict], expected: list[dict]) -> None:
    for answer, reference in zip(served, expected, strict=True):
        assert [entry["label"] for entry in answer["top_k"]] == [entry["label"] for entry in reference["top_k"]]
        np.testing.assert_allclose([entry["probability"] for entry in answer["top_k"]],
                                   [entry["probability"] for entry in reference["top_k"]], atol=1.01e-6, rtol=0)
        # (both rounded to 6 places: a batch's last bits may round the other way, one unit in the last place)
        assert all(CLASSES[entry["index"]] == entry["label"] for entry in answer["top_k"])


def test_concurrent_answers_equal_predict_and_are_batched(server, checkpoint, images, capsys):
    running = server("--max-batch-size", 8, "--max-wait-ms", 200)
    expected = predicted(capsys, checkpoint, images, "--top-k", "3")
    with ThreadPoolExecutor(len(images)) as pool:  # together: they wait for each other and run as one batch
        answers = list(pool.map(lambda path: running.classify(path.read_bytes(), content_type(path), top_k=3), images))
    assert [answer.status_code for answer in answers] == [200] * len(images)
    assert_same_answers([answer.json() for answer in answers], expected)
    every = running.classify(images[0].read_bytes(), top_k=len(CLASSES) + 4).json()["top_k"]  # K past the classes
    assert sorted(entry["label"] for entry in every) == sorted(CLASSES)
    assert [entry["probability"] for entry in every] == sorted((e["probability"] for e in every), reverse=True)
    with images[1].open("rb") as handle:  # the multipart field 'file' gives the same answer as the raw body
        multipart = running.client.post("/v1/classify", files={"file": ("x.jpg", handle, "image/jpeg")},
                                        params={"top_k": 3})
    assert_same_answers([multipart.json()], expected[1:2])
    metrics = running.client.get("/metrics").text
    assert re.search(r'^vitkit_requests_total\{path="/v1/classify",status="200"\} 8\.0$', metrics, re.M)
    batches = float(re.search(r"^vitkit_batch_images_count (\S+)$", metrics, re.M).group(1))
    assert 3 <= batches <= 5  # the concurrent six in at most three batches, then two alone
    assert re.search(r"^vitkit_batch_images_bucket\{le=\"8\.0\"\} ", metrics, re.M)
    assert re.search(r"^vitkit_queue_depth 0\.0$", metrics, re.M)
    assert "vitkit_request_latency_seconds_bucket" in metrics


def test_keep_aspect_batches_images_of_each_size_apart(server, checkpoint, images, capsys):
    running = server("--keep-aspect", "--max-batch-size", 8, "--max-wait-ms", 200)
    expected = predicted(capsys, checkpoint, images, "--keep-aspect")
    with ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(lambda path: running.classify(path.read_bytes(), content_type(path)), images))
    assert_same_answers([answer.json() for answer in answers], expected)


def test_an_onnx_export_serves_what_predict_gives(server, checkpoint, images, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    exported = tmp_path / "model.onnx"
    assert main(["convert", str(checkpoint), str(exported)]) == 0
    running = server(model=exported)
    answers = [running.classify(path.read_bytes(), content_type(path)).json() for path in images]
    assert_same_answers(answers, predicted(capsys, exported, images))


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width`` x ``height`` pixels (a decompression bomb's first bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def test_hostile_uploads_are_refused_in_json_and_the_server_keeps_serving(server, images):
    running = server("--max-body-mb", "0.05")
    good = images[0].read_bytes()
    cases = {
        "text": (running.classify(b"hello", "text/plain"), 415, "Content-Type 'text/plain'"),
        "no type": (running.client.post("/v1/classify", content=good), 415, "got no Content-Type"),
        "not an image": (running.classify(b"GIF89a not really" * 10), 400, "the upload: not a readable image"),
        "truncated": (running.classify(good[: len(good) // 2]), 400, "the upload: not a readable image"),
        "bomb": (running.classify(png_claiming(30_000, 30_000)), 400, "decompression bomb"),
        "too large": (running.classify(b"\0" * 60_000), 413, "more than --max-body-mb allows (52,428 bytes)"),
        "too large, streamed": (running.client.post("/v1/classify", content=iter([b"\0" * 20_000] * 3),
                                                    headers={"Content-Type": "image/png"}), 413, "--max-body-mb"),
        "multipart without file": (running.client.post("/v1/classify", data={"other": "x"},
                                                       files={"image": ("x.png", good)}), 400, "no file field"),
        "bad top_k": (running.classify(good, top_k="many"), 400, "top_k: expected a whole number"),
        "zero top_k": (running.classify(good, top_k=0), 400, "top_k"),
        "wrong method": (running.client.get("/v1/classify"), 405, "GET is not allowed on /v1/classify"),
        "unknown path": (running.client.post("/v2/detect", content=good), 404, "no such path '/v2/detect'"),
    }
    for name, (answer, status, words) in cases.items():
        assert answer.status_code == status, (name, answer.text)
        assert words in answer.json()["error"], (name, answer.json())
    assert running.classify(good).status_code == 200
    assert running.process.poll() is None
    metrics = running.client.get("/metrics").text
    assert re.search(r'^vitkit_requests_total\{path="/v1/classify",status="400"\} 6\.0$', metrics, re.M)
    assert re.search(r'^vitkit_requests_total\{path="other",status="404"\} 1\.0$', metrics, re.M)


def test_a_burst_past_the_queue_is_refused_at_once_with_retry_after(server, tmp_path, images):
    slow = tmp_path / "slow"  # ViT-S/16 at 224 px: tens of milliseconds an image on a CPU thread
    VisionTransformer(ViTConfig(dim=384, depth=12, num_heads=6, mlp_dim=1536, num_classes=3,
                                provenance=Provenance(classes=("a", "b", "c")))).save(slow)
    running = server("--max-batch-size", 1, "--max-queue", 2, "--max-wait-ms", 0, model=slow)
    data = images[3].read_bytes()
    began = time.monotonic()
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: running.classify(data), range(12)))
    codes = sorted(answer.status_code for answer in answers)
    assert 200 in codes and 503 in codes and set(codes) == {200, 503}, codes
    refused = [answer for answer in answers if answer.status_code == 503]
    assert all(answer.headers["Retry-After"] == "1" and "--max-queue 2" in answer.json()["error"] for answer in refused)
    assert time.monotonic() - began < 30


def test_sigterm_answers_every_accepted_request_then_exits_0_and_frees_the_port(server, images):
    running = server("--max-batch-size", 8, "--max-wait-ms", 3000)
    data = images[0].read_bytes()
    with ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(running.classify, data) for _ in range(3)]
        deadline = time.monotonic() + 30  # all three accepted: waiting out --max-wait-ms in a half-filled batch
        while "vitkit_queue_depth 3.0" not in running.client.get("/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        running.process.send_signal(signal.SIGTERM)
        answers = [future.result() for future in pending]
    assert [answer.status_code for answer in answers] == [200] * 3
    code, stderr = running.stop()
    assert code == 0, stderr
    assert "every accepted request was answered" in stderr and "Traceback" not in stderr
    host, port = running.url.removeprefix("http://").split(":")
    with socket.socket() as probe:  # the port is free again, for a server (SO_REUSEADDR: past TIME_WAIT)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, int(port)))
        probe.listen()


def start_failure(*args) -> tuple[int, str]:
    result = subprocess.run([*VITKIT, "serve", *map(str, args)], env=child_env(), capture_output=True, text=True,
                            timeout=120)
    return result.returncode, result.stderr


def test_refusals_at_start_are_one_line(checkpoint, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = start_failure(checkpoint, "--port", port)
    assert code == 1 and stderr.count("\n") == 1, stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use; stop the process using it" in stderr
    headless = tmp_path / "headless"
    VisionTransformer(ViTConfig(image_size=16, patch_size=4, dim=32, depth=1, num_heads=4, mlp_dim=64,
                                num_classes=0)).save(headless)
    code, stderr = start_failure(headless, "--port", 0)
    assert code == 2 and stderr.count("\n") == 1 and "no classification head" in stderr, stderr
    code, stderr = start_failure(checkpoint, "--max-batch-size", 0)
    assert code == 2 and "--max-batch-size: expected" in stderr, stderr
    code, stderr = start_failure(tmp_path / "missing", "--port", 0)
    assert code in (1, 2) and stderr.count("\n") == 1 and "missing" in stderr, stderr


# ----------------------------------------------------------------------------------------------- in-process
def test_batcher_fills_batches_waits_at_most_max_wait_and_drains_on_stop():
    sizes, release = [], threading.Event()

    def run_batch(items):
        release.wait(10)
        sizes.append(len(items))
        return [2 * item for item in items]

    async def scenario():
        batcher = Batcher(run_batch, max_batch_size=4, max_wait_ms=50, max_queue=6, on_batch=lambda n: None)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(0))  # runs alone after 50 ms, then blocks on `release`
        await asyncio.sleep(0.2)
        queued = [asyncio.ensure_future(batcher.submit(k)) for k in range(1, 7)]  # 6 wait: the queue is full
        await asyncio.sleep(0.05)
        assert batcher.depth == 6
        with pytest.raises(Overloaded, match="6 requests wait already"):
            await batcher.submit(99)
        release.set()
        results = await asyncio.gather(first, *queued)
        lone = time.monotonic()
        assert await batcher.submit(7) == 14
        waited = time.monotonic() - lone
        batcher.stop()
        with pytest.raises(Overloaded, match="stopping"):
            await batcher.submit(8)
        return results, waited

    results, waited = asyncio.run(scenario())
    assert results == [0, 2, 4, 6, 8, 10, 12]
    assert sizes == [1, 4, 2, 1]  # a lone item, then a full batch of 4, the remaining 2, the last lone one
    assert 0.04 <= waited < 1


def test_requests_being_decoded_count_against_the_queue():
    """A burst is bounded before its images are decoded: a request counts from its acceptance, and a failed
    preparation gives its place back."""
    decoding = threading.Event()

    def prepare(item):
        decoding.wait(10)
        if item == "bad":
            raise ValueError("not an image")
        return item

    async def scenario():
        batcher = Batcher(lambda items: items, max_batch_size=8, max_wait_ms=0, max_queue=2)
        batcher.start()
        held = [asyncio.ensure_future(batcher.submit(item, prepare)) for item in ("bad", "good")]
        await asyncio.sleep(0.05)
        assert batcher.depth == 2
        with pytest.raises(Overloaded, match="2 requests wait already"):
            await batcher.submit("third", prepare)
        decoding.set()
        outcomes = await asyncio.gather(*held, return_exceptions=True)
        assert batcher.depth == 0
        batcher.stop()
        return outcomes

    failed, answered = asyncio.run(scenario())
    assert isinstance(failed, ValueError) and answered == "good"


def test_health_is_503_until_the_model_is_warmed_up(checkpoint, images):
    from starlette.testclient import TestClient

    classifier = Classifier(str(checkpoint))
    warming, warm_up = threading.Event(), classifier.warm_up
    classifier.warm_up = lambda size: (warming.wait(10), warm_up(size))
    with TestClient(build_app(classifier, Limits(max_batch_size=2))) as client:
        assert client.get("/health").status_code == 503 and client.get("/health").json() == {"error": "warming up"}
        warming.set()
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        answer = client.post("/v1/classify", content=images[0].read_bytes(), headers={"Content-Type": "image/png"})
        assert answer.status_code == 200 and len(answer.json()["top_k"]) == 5
