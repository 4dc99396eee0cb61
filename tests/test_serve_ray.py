"""``vitkit serve --ray`` on a one-node Ray cluster the test starts (``ray start --head``) and stops, reached through
``RAY_ADDRESS`` as a multi-node cluster is: answers equal to ``vitkit predict --json``, batched by ``@serve.batch``,
the application's refusals, and SIGTERM with requests in flight."""

import secrets
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="could not import ray.serve (pip install 'vitkit[ray]')")
httpx = pytest.importorskip("httpx")

from launch import child_env  # noqa: E402
from test_serve import Server, assert_same_answers, checkpoint, content_type, images, predicted  # noqa: E402, F401
from vitkit.cli import main  # noqa: E402

RAY = [str(Path(sys.executable).with_name("ray"))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory) -> dict:
    """The environment that reaches a one-node Ray cluster of 2 CPUs (its address and its authentication token,
    kept in a temporary file), stopped after the module's tests."""
    token = tmp_path_factory.mktemp("ray") / "auth_token"
    token.write_text(secrets.token_hex(32))
    port = free_port()
    env = {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    started = subprocess.run([*RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                              "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats"],
                             env=child_env(**env), capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        yield env
    finally:
        subprocess.run([*RAY, "stop", "--force"], env=child_env(**env), capture_output=True, timeout=120)


def test_ray_replica_answers_as_predict_batched_and_stops_on_sigterm(ray_cluster, checkpoint, images, capsys,
                                                                      monkeypatch):
    for name, value in ray_cluster.items():
        monkeypatch.setenv(name, value)
    expected = predicted(capsys, checkpoint, images, "--top-k", "3")
    running = Server(checkpoint, "--ray", "--replicas", 1, "--max-batch-size", 8, "--max-wait-ms", 1000,
                     port=free_port())
    try:
        with ThreadPoolExecutor(len(images)) as pool:  # together: they wait for each other and run batched
            answers = list(pool.map(lambda path: running.classify(path.read_bytes(), content_type(path), top_k=3),
                                    images))
        assert [answer.status_code for answer in answers] == [200] * len(images)
        assert_same_answers([answer.json() for answer in answers], expected)
        metrics = running.client.get("/metrics").text
        batches = float(next(line.split()[-1] for line in metrics.splitlines()
                             if line.startswith("vitkit_batch_images_count")))
        assert 1 <= batches < len(images)  # fewer runs than images (the warm-up ran before the app counted)
        missing = running.client.get("/v2/classify")
        assert missing.status_code == 404 and "no such path" in missing.json()["error"]
        refused = running.classify(b"not an image")
        assert refused.status_code == 400 and "error" in refused.json()
        with pytest.raises(httpx.TimeoutException):  # a client that gives up while its request waits for a batch
            httpx.post(f"{running.url}/v1/classify", content=images[0].read_bytes(),
                       headers={"Content-Type": "image/png"}, timeout=0.3)
        deadline = time.monotonic() + 30
        while "vitkit_queue_depth 0.0" not in running.client.get("/metrics").text:  # its place is given back
            assert time.monotonic() < deadline, "a request given up kept its place in the replica's queue"
            time.sleep(0.05)
        with ThreadPoolExecutor(4) as pool:  # SIGTERM while these wait out --max-wait-ms: each is answered
            in_flight = [pool.submit(running.classify, images[0].read_bytes()) for _ in range(4)]
            while "vitkit_queue_depth 4.0" not in running.client.get("/metrics").text:
                assert not any(future.done() for future in in_flight), "answered before the batch could fill"
            running.process.send_signal(signal.SIGTERM)
            assert [future.result().status_code for future in in_flight] == [200] * 4
    finally:
        status, stderr = running.stop()
    assert status == 0, stderr[-3000:]
    assert "stopped; the replicas answered the requests they held" in stderr


def test_replicas_without_ray_is_refused(checkpoint, capsys):
    assert main(["serve", str(checkpoint), "--replicas", "2"]) == 2
    assert "--replicas counts Ray Serve replicas: add --ray" in capsys.readouterr().err


def test_port_zero_on_a_named_cluster_is_refused(checkpoint, capsys, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert main(["serve", str(checkpoint), "--ray", "--port", "0"]) == 2
    assert "--port 0 on a Ray cluster" in capsys.readouterr().err
