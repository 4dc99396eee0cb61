"""Run vitkit in fresh processes (one, or two under torchrun with gloo) as a user's shell would."""

import os
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
VITKIT, VITKIT_TORCHRUN = [sys.executable, "-m", "vitkit"], [*TORCHRUN, "-m", "vitkit"]


def child_env(**extra: str) -> dict:
    """The environment of a child process: vitkit importable, one thread, and ``extra``."""
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
            **extra}


def launch(command, *args) -> str:
    """Run ``command`` + ``args`` with vitkit importable and one thread per process; its stdout, once
    it has exited 0 (else the test fails with the tail of its stderr)."""
    result = subprocess.run([*command, *map(str, args)], env=child_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def start_until_ready(script: str, ready: Path, *args, env: dict | None = None, **popen) -> subprocess.Popen:
    """Start the Python ``script`` with ``args`` in another process; return once it has made the file ``ready``
    (the test fails if it exits first, with the tail of its stderr, or takes over 240 s)."""
    ready.unlink(missing_ok=True)
    process = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env or child_env(),
                               stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + 240
    while not ready.exists():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"{ready} never appeared: the process never got ready"
        time.sleep(0.01)
    return process
