"""The repository's tree: the results and the docs name no path of the machine they were made on, and no training
output (``run/``, ``runs/``) is tracked."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (ROOT / "benchmarks" / "results", ROOT / "docs")
# A machine's absolute path: /work/, /tmp/, /root/ or /home/ at the start of a line or of a quoted or code string,
# or after a space, "=" or "(" (a URL's path or an API route such as /v1/classify follows other characters).
MACHINE_PATH = re.compile(r"""(?<![^\s"'`=(])/(?:work|tmp|root|home)/""")
TRAINING_OUTPUTS = ("run", "runs")


def machine_paths(text: str) -> list[str]:
    """The lines of ``text`` that name an absolute path of a machine."""
    return [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]


def text_files(folder: Path):
    """The text files under ``folder`` (compiled Python and binary files such as figures are skipped)."""
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            yield path, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def test_results_and_docs_name_no_machine_path():
    found = [f"{path.relative_to(ROOT)}: {line}" for folder in SCANNED for path, text in text_files(folder)
             for line in machine_paths(text)]
    assert not found, "absolute machine paths (write them relative to the repository root):\n" + "\n".join(found)


@pytest.mark.parametrize("line", ['  "data_dir": "/work/shared/data",', "`PYTHONPATH=/tmp/before/src python x.py`",
                                  "cache in /root/.cache/vitkit", "/home/user/data", "--out=/tmp/x",
                                  "'/work/main/run'", "(/tmp/scratch)"])
def test_the_check_finds_a_machine_path(line):
    assert machine_paths(line) == [line.strip()]


@pytest.mark.parametrize("line", ['  "data_dir": "../shared/data",', "see https://example.com/tmp/notes and "
                                  "http://host/home/x", "POST /v1/classify", "runs/bench/work/tmp/x",
                                  "`src/vitkit/paths.py`", "/workspace is not /work", "~/tmp/x"])
def test_the_check_leaves_urls_routes_and_relative_paths(line):
    assert machine_paths(line) == []


def test_git_tracks_no_training_output():
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True)
    if inside.returncode or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "--", *(f"{name}/" for name in TRAINING_OUTPUTS)], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert not listed, f"training outputs tracked by git (remove them with git rm -r; .gitignore lists run/ and " \
                       f"runs/): {listed[:10]}"
