"""The shard index cache of an ``hf:`` parquet file: entry size, index pass and cached load, this tree against
another commit's, measured in one run (the machine may be shared: compare the ratios, not the seconds).

    PYTHONPATH=src python benchmarks/bench_shard_index.py --before COMMIT [--rows 1000000] [--repeats 5]

Writes benchmarks/results/shard_index.md. Each tree runs in its own process, in turn, on the same file.
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
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        before = scratch / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "src"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        (scratch / "hub").mkdir()
        write_parquet(scratch / "hub" / "train.parquet", args.rows)
        load = os.getloadavg()
        found = {name: measure(tree, scratch / "hub", args.repeats, scratch / f"cache-{name}")
                 for name, tree in (("before", before), ("after", REPO))}
    median = {name: statistics.median(result["cached_s"]) for name, result in found.items()}
    rows = found["after"]["rows"]
    lines = [f"# Shard index cache of one {rows:,}-row hf: parquet file",
             "", f"`PYTHONPATH=src python benchmarks/bench_shard_index.py --before {args.before} --rows {args.rows}`"
             f" (before: that commit's src; after: this tree), load average {load[0]:.1f} at the start, "
             f"{os.getloadavg()[0]:.1f} at the end.", "",
             "| | before | after | after / before |", "|---|---:|---:|---:|"]
    for label, before_value, after_value, unit in (
            ("cache entry", found["before"]["entry_bytes"] / 1e6, found["after"]["entry_bytes"] / 1e6, "MB"),
            ("index pass (first load)", found["before"]["index_s"], found["after"]["index_s"], "s"),
            (f"cached load (median of {args.repeats})", median["before"], median["after"], "s")):
        lines.append(f"| {label} | {before_value:.3f} {unit} | {after_value:.3f} {unit} | "
                     f"{after_value / before_value:.3f} |")
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shard_index.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
