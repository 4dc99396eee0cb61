import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# CI sets VITKIT_REQUIRE_PEERS=1: there a missing peer library (timm, transformers, ...) or missing real data
# is a broken setup, so the parity and real-data tests fail instead of skipping quietly.
REQUIRE_PEERS = os.environ.get("VITKIT_REQUIRE_PEERS") == "1"
MISSING_PEER = ("could not import", "real datasets not found")


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The cache (shard indexes, downloads) of the tests and of the runs they launch stays out of ~/.cache."""
    os.environ["VITKIT_CACHE"] = str(tmp_path_factory.mktemp("vitkit-cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _fail_if_peer_missing(report) -> None:
    if REQUIRE_PEERS and report.skipped and any(text in str(report.longrepr) for text in MISSING_PEER):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome, report.longrepr = "failed", f"VITKIT_REQUIRE_PEERS=1 and {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    _fail_if_peer_missing((yield).get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that skips itself at import (``pytest.importorskip`` at its top) fails too."""
    _fail_if_peer_missing((yield).get_result())
