"""The shard index cache of an ``hf:`` parquet file: entry size, index pass and cached load of the current code,
and with ``--before COMMIT`` of that commit's code beside it, measured in one run (the machine may be shared:
compare the ratios, not the seconds).

    PYTHONPATH=src python benchmarks/bench_shard_index.py [--rows 1000000] [--repeats 5] [--before COMMIT]

Writes benchmarks/results/shard_index.md. Each version runs in its own process, in turn, on the same file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"

# Run inside a tree's process: one index pass, then cached loads; prints seconds and the entry's bytes.
MEASURE = """
import json, os, sys, time
from pathlib import Path
from vitkit.data import load_dataset
root, repeats = sys.argv[1], int(sys.argv[2])
started = time.perf_counter()
split = load_dataset("hf:" + root, "train")
indexed = time.perf_counter() - started
cached = []
for _ in range(repeats):
    started = time.perf_counter()
    again = load_dataset("hf:" + root, "train")
    cached.append(time.perf_counter() - started)
assert len(again) == len(split) and again.class_counts == split.class_counts
entries = list((Path(os.environ["VITKIT_CACHE"]) / "shard-index").iterdir())
print(json.dumps({"index_s": indexed, "cached_s": cached, "entry_bytes": sum(e.stat().st_size for e in entries),
                  "rows": len(split)}))
"""


def write_parquet(path: Path, rows: int) -> None:
    """``rows`` rows of ImageNet-like labels and a placeholder image (the index pass reads labels only)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    labels = np.random.default_rng(0).integers(0, 1000, rows)
    images = pa.array([b"\x89PNG"] * rows, pa.binary())
    pq.write_table(pa.table({"image": images, "label": pa.array(labels, pa.int64())}), path)


def measure(tree: Path, root: Path, repeats: int, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "VITKIT_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(root), str(repeats)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a commit whose code to time beside the current code (optional)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        trees = {"vitkit": REPO}
        if args.before:
            trees = {args.before: extract_src(args.before, scratch / "before"), **trees}
        (scratch / "hub").mkdir()
        write_parquet(scratch / "hub" / "train.parquet", args.rows)
        load = os.getloadavg()
        found = {name: measure(tree, scratch / "hub", args.repeats, scratch / f"cache-{index}")
                 for index, (name, tree) in enumerate(trees.items())}
    text = report(found, args, load, os.getloadavg())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shard_index.md").write_text(text)
    print(text)


def extract_src(commit: str, into: Path) -> Path:
    """``commit``'s ``src`` folder written under ``into`` (which is returned), to run that version's code."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def report(found: dict, args: argparse.Namespace, load_start: tuple, load_end: tuple) -> str:
    """The markdown table: one column per version timed, and their ratio when there are two."""
    names = list(found)
    rows = found[names[-1]]["rows"]
    command = "PYTHONPATH=src python benchmarks/bench_shard_index.py --rows " + str(args.rows)
    if args.before:
        command += f" --before {args.before}"
    header = "| | " + " | ".join(names) + (f" | {names[1]} / {names[0]} |" if len(names) == 2 else " |")
    lines = [f"# Shard index cache of one {rows:,}-row hf: parquet file", "",
             f"`{command}`, load average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end.", "",
             header, "|---|" + "---:|" * (len(names) + (len(names) == 2))]
    for label, key, unit in (("cache entry", "entry_bytes", "MB"), ("index pass (first load)", "index_s", "s"),
                             (f"cached load (median of {args.repeats})", "cached_s", "s")):
        values = [found[name][key] / 1e6 if unit == "MB" else found[name][key] for name in names]
        values = [statistics.median(value) if isinstance(value, list) else value for value in values]
        cells = [f"{value:.3f} {unit}" for value in values] + ([f"{values[1] / values[0]:.3f}"] if len(values) == 2
                                                                 else [])
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
