"""Run vitkit in fresh processes (one, or two under torchrun with gloo) as a user's shell would."""

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
VITKIT, VITKIT_TORCHRUN = [sys.executable, "-m", "vitkit"], [*TORCHRUN, "-m", "vitkit"]


def launch(command, *args) -> str:
    """Run ``command`` + ``args`` with vitkit importable and one thread per process; its stdout, once
    it has exited 0 (else the test fails with the tail of its stderr)."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*command, *map(str, args)], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
