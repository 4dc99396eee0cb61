"""One loader at a time (the others not alive), 2 workers, over 600 JPEGs of bench_data's kind: vitkit's folder
loader against torchvision's ImageFolder loader, and the main process's CPU time per second of loading.
Where bench_data keeps five loaders alive and times 8 batches a turn, this probe times 12 batches of one
loader alone, so it tells a change in the loader's own path apart from the machine's noise.

    PYTHONPATH=src python benchmarks/bench_loader_probe.py

Prints one line per loader and round (images/s, main-process CPU as a fraction of a core); copy them into
``benchmarks/results/loader_probe.md`` with the commit they were taken at.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import bench_data

from vitkit.data import load_dataset


def rate(loader, workers: int, batches: int = 12) -> tuple[float, float]:
    """Images/s once the prefetched batches are taken, and the main process's CPU seconds per second."""
    iterator = iter(loader)
    for _ in range(2 * workers):
        next(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    images = sum(len(next(iterator)[0]) for _ in range(batches))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return images / wall, cpu / wall


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="vitkit-loader-probe-")) / "jpegs"
    bench_data.make_jpegs(folder, 600)
    listed = load_dataset(f"imagefolder:{folder}", "train")
    for workers in (1, 2, 2, 1):
        for name, loader in (("vitkit", bench_data.vitkit_loader(listed, workers)),
                             ("torchvision", bench_data.torchvision_loader(folder, workers))):
            images_per_s, main_cpu = rate(loader, workers)
            print(f"{name} {workers} worker(s): {images_per_s:.0f} img/s, main process CPU {main_cpu:.2f} of a core",
                  flush=True)


if __name__ == "__main__":
    main()
