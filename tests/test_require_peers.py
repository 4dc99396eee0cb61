"""CI's VITKIT_REQUIRE_PEERS=1 turns a missing peer library or missing real data into a failure."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PROBES = {
    "test_probe_module": "import pytest\npytest.importorskip('no_such_peer_library')\ndef test_x():\n    pass\n",
    "test_probe_function": "import pytest\ndef test_x():\n    pytest.importorskip('no_such_peer_library')\n",
    "test_probe_other_skip": "import pytest\ndef test_x():\n    pytest.skip('no display')\n",
}


@pytest.mark.parametrize("required", [False, True])
def test_missing_peers_fail_only_when_required(pytester, monkeypatch, required):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(**PROBES)
    monkeypatch.setenv("VITKIT_REQUIRE_PEERS", "1" if required else "0")
    result = pytester.runpytest("-q", "--continue-on-collection-errors")
    if required:  # the unrelated skip stays a skip
        result.assert_outcomes(failed=1, errors=1, skipped=1)
    else:
        result.assert_outcomes(skipped=3)
