"""The data loader alone, as training uses it: decode + the ``pretrain`` transform at 224 px of JPEGs of
realistic size (CIFAR-10 images upscaled to 256-500 px, quality 90), batch 64.

Measured in one run, over interleaved rounds (medians reported), so that the ratios hold on a shared machine:
- vitkit's loader over an image folder and over the same images in WebDataset shards, against
  torchvision's ``ImageFolder`` + ``DataLoader`` with the same workers and transform, and against the
  single-core decode + transform rate times the workers (the decode limit), measured again just before each
  loader (the ratio of each pair is reported too, the figure a machine whose speed drifts disturbs least),
  and against that many plain decoding processes at once (what the cores give together, no loader);
  the folder loader also with no worker (its own per-image work, in process) and with one (plus passing
  batches between processes), which tell where a shortfall from the limit comes from. One loader
  is alive at a time: its workers are started, its queue filled and drained, then ``--batches`` batches
  are timed, with the main process's CPU time;
- in one process, alternated: vitkit's per-image work against torchvision's, and the shards' against the same
  images read as files (what the shard format itself costs);
- the price of fresh memory: filling a new float batch against refilling one already touched;
- time to the first batch (listing, loader, workers, first batch) for a 10k-file and a 1M-file folder
  (hard links to the same JPEGs), each in a new process as a run would be: on the first run (the folder
  walked) and on later ones (its listing cached; medians of 5, the two sizes alternated);
- resident memory of the loader (main process + workers) at step 10, step 1,000 and step 2,000, in all and
  by kind.

    PYTHONPATH=src python benchmarks/bench_data.py [--workers 2] [--large 1000000] [--rss-steps 2000]

Writes ``benchmarks/results/data.json`` and ``data.md``; the folders live in a temporary directory that
is removed at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torchvision
from PIL import Image
from torch.utils.data import default_collate
from torchvision.transforms import v2

from vitkit.data import Transformed, build_transform, load_dataset, read_image, training_loader
from vitkit.data.convert import write_webdataset
from vitkit.data.folders import RACY_NS
from vitkit.data.loading import collate_training
from vitkit.data.shards import TrainingStream

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "data" / "cifar10-subset" / "cifar10_subset.npz"
RESULTS = ROOT / "benchmarks" / "results"
BATCH, SIZE = 64, (224, 224)


def make_jpegs(folder: Path, count: int) -> list[Path]:
    """``count`` CIFAR-10 training images upscaled to a random 256-500 px side, JPEG quality 90, one folder
    per class."""
    arrays = np.load(CIFAR, allow_pickle=False)
    rng = np.random.default_rng(0)
    files = []
    for index in range(count):
        label = int(arrays["y_train"][index])
        width, height = rng.integers(256, 501, size=2)
        image = Image.fromarray(arrays["x_train"][index]).resize((int(width), int(height)), Image.BICUBIC)
        path = folder / f"{label}" / f"{index:07d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, quality=90)
        files.append(path)
    return files


def linked_folder(files: list[Path], folder: Path, count: int) -> Path:
    """A folder of ``count`` hard links to ``files`` (cycled), in the same class folders."""
    for name in {f.parent.name for f in files}:
        (folder / name).mkdir(parents=True)
    for index in range(count):
        source = files[index % len(files)]
        os.link(source, folder / source.parent.name / f"{index:08d}.jpg")
    return folder


def preset():
    return build_transform("pretrain", SIZE, 3, "google")


def loader_rate(loader, workers: int, batches: int) -> tuple[float, float]:
    """Images/s over ``batches`` batches of ``loader`` alone, once its workers run and the queue it filled at
    the start is drained; and the main process's CPU seconds per second meanwhile. The workers stop after."""
    iterator = iter(loader)
    for _ in range(2 * max(workers, 1) + 1):
        next(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    images = sum(len(next(iterator)[0]) for _ in range(batches))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del iterator
    return images / wall, cpu / wall


def fresh_memory_ms(shape=(BATCH, 3, *SIZE), repeats: int = 5) -> dict[str, float]:
    """Milliseconds to fill a float batch in memory taken anew (each page touched for the first time) and in
    memory already touched: what a loader pays for every buffer it allocates per batch."""
    def mean_ms(fill) -> float:
        started = time.perf_counter()
        for _ in range(repeats):
            fill()
        return (time.perf_counter() - started) / repeats * 1000
    touched = torch.zeros(shape)
    return {"new": round(mean_ms(lambda: torch.empty(shape).fill_(1.0)), 1),
            "touched": round(mean_ms(lambda: touched.fill_(1.0)), 1)}


def vitkit_loader(dataset, workers: int, steps: int = 10_000):
    return training_loader(dataset, preset(), global_batch=BATCH, total_steps=steps, start_step=0, seed=0,
                           num_workers=workers)


def torchvision_loader(folder: Path, workers: int):
    """The plain torchvision way: ImageFolder decodes with PIL, the same v2 steps, a shuffling DataLoader."""
    ours = preset()
    transform = v2.Compose([v2.PILToTensor(), ours.per_image, ours.per_batch])
    dataset = torchvision.datasets.ImageFolder(str(folder), transform=transform)
    epochs = torch.utils.data.RandomSampler(dataset, num_samples=10**7)  # reshuffled epochs, one after another
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=epochs, num_workers=workers,
                                       persistent_workers=workers > 0)


def single_core_rate(files: list[Path], batches: int = 4, queue=None) -> float:
    """All of the loader's work on one core, with no loader around it: decode, the per-image transform and the
    per-batch step into one float batch used over and over (no allocation: the strictest limit); sent to
    ``queue`` when run in a process of its own."""
    ours = preset()
    torch.set_num_threads(1)
    batch = torch.empty(BATCH, 3, *SIZE)
    started = time.perf_counter()
    for index in range(batches):
        chunk = files[index * BATCH:(index + 1) * BATCH]
        for row, path in zip(batch, chunk):
            ours.per_batch(ours.per_image(read_image(path)), out=row)
    rate = batches * BATCH / (time.perf_counter() - started)
    if queue is not None:
        queue.put(rate)
    return rate


def concurrent_rate(files: list[Path], processes: int) -> float:
    """Images/s of ``processes`` plain decoding processes at once (no loader): what the machine's cores give
    together, which the single-core rate times the workers assumes."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    started = [context.Process(target=single_core_rate, args=(files, 4, queue)) for _ in range(processes)]
    for process in started:
        process.start()
    rates = [queue.get(timeout=600) for _ in started]  # a process that died would leave it waiting
    for process in started:
        process.join()
    return sum(rates)


def alternated_ratio(ours, theirs, rounds: int) -> dict:
    """Images/s of two ways of doing the same work in this process, alternated round by round: the ratio a busy
    machine disturbs least."""
    samples = [(ours(), theirs()) for _ in range(rounds)]
    return {"ours_images_per_s": [round(a, 1) for a, _ in samples],
            "theirs_images_per_s": [round(b, 1) for _, b in samples],
            "median_ratio": round(float(np.median([a / b for a, b in samples])), 3)}


def batches_rate(make_batch, images: int = 128) -> float:
    started = time.perf_counter()
    for start in range(0, images, BATCH):
        make_batch(start)
    return images / (time.perf_counter() - started)


def in_process_ratio(folder: Path, rounds: int) -> dict:
    """vitkit's per-image work (decode, seeded transform, batch collation) against torchvision's ImageFolder
    item + default collation."""
    ours = preset()
    vitkit_items = Transformed(load_dataset(f"imagefolder:{folder}", "train"), ours)
    torchvision_items = torchvision_loader(folder, 0).dataset
    return alternated_ratio(
        lambda: batches_rate(lambda start: collate_training(
            ours, [vitkit_items[(i % len(vitkit_items), 0)] for i in range(start, start + BATCH)])),
        lambda: batches_rate(lambda start: default_collate(
            [torchvision_items[i % len(torchvision_items)] for i in range(start, start + BATCH)])), rounds)


def shards_in_process_ratio(folder: Path, shards: Path, rounds: int) -> dict:
    """The same images read from shards (tar members through webdataset, the shuffle buffer) against read from
    their files: what the shard format itself costs per image."""
    ours = preset()
    stream = iter(TrainingStream(load_dataset(f"webdataset:{shards}", "train"), ours, seed=0, micro_batch=BATCH,
                                 start_micro_batch=0))
    files = Transformed(load_dataset(f"imagefolder:{folder}", "train"), ours)
    read = itertools.count()
    return alternated_ratio(
        lambda: batches_rate(lambda start: collate_training(ours, [next(stream) for _ in range(BATCH)])),
        lambda: batches_rate(lambda start: collate_training(
            ours, [files[(next(read) % len(files), 0)] for _ in range(BATCH)])), rounds)


def first_batch_here(folder: Path, workers: int) -> float:
    """From naming the folder to holding the first batch, in this process; the workers' shutdown after is not
    counted."""
    started = time.perf_counter()
    iterator = iter(vitkit_loader(load_dataset(f"imagefolder:{folder}", "train"), workers))
    next(iterator)
    elapsed = time.perf_counter() - started
    del iterator
    return elapsed


def first_batch_seconds(folder: Path, workers: int) -> float:
    """``first_batch_here`` in a new process, as a run starts: only the listing cache carries over, not this
    process's memory (a walk of a million names leaves its heap large, which makes every later fork slower)."""
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import bench_data; "
            "print(bench_data.first_batch_here(Path(sys.argv[2]), int(sys.argv[3])))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(folder), str(workers)],
                          capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


RSS_KINDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")  # all; anonymous; file pages mapped; shared memory


def rss_mb(pid: int) -> dict[str, float]:
    """Resident memory of a process and its children (the DataLoader workers), from /proc, in all and by kind
    (pages of a mapped file, such as the folder listing, count once in each process that touched them)."""
    def own(p: int) -> dict[str, int]:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{p}/status").read_text().splitlines())
        return {kind: int(fields[kind].split()[0]) for kind in RSS_KINDS}
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    processes = [own(p) for p in (pid, *children)]
    return {kind: round(sum(p[kind] for p in processes) / 1024, 1) for kind in RSS_KINDS}


def rss_over_steps(dataset, workers: int, steps: int) -> dict[str, dict[str, float]]:
    """Resident memory at step 10, at step 1,000 and at ``steps`` (which shows whether a rise has stopped)."""
    loader = training_loader(dataset, build_transform("pretrain", (64, 64), 3, "google"), global_batch=16,
                             total_steps=steps, start_step=0, seed=0, num_workers=workers)
    marks = {}
    for step, _ in enumerate(loader, start=1):
        if step in (10, 1000, steps):
            marks[f"step_{step}"] = rss_mb(os.getpid())
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--unique", type=int, default=1000, help="distinct JPEGs written")
    parser.add_argument("--batches", type=int, default=12, help="batches timed per loader and round")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds; medians are reported")
    parser.add_argument("--large", type=int, default=1_000_000, help="files of the large folder (hard links)")
    parser.add_argument("--rss-steps", type=int, default=2000)
    args = parser.parse_args()
    workers = args.workers
    result = {"workers": workers, "batch": BATCH, "image_size": SIZE[0], "cpu_count": os.cpu_count(),
              "loadavg_before": os.getloadavg()}
    scratch = Path(tempfile.mkdtemp(prefix="vitkit-bench-data-"))
    os.environ["VITKIT_CACHE"] = str(scratch / "cache")  # the index of shards about to be deleted
    try:
        files = make_jpegs(scratch / "jpegs", args.unique)
        result["jpeg_kb_mean"] = round(sum(f.stat().st_size for f in files) / len(files) / 1024, 1)
        folder = scratch / "jpegs"
        shards = scratch / "shards"
        total = sum(f.stat().st_size for f in files)  # 8 shards a worker
        write_webdataset({"train": load_dataset(f"imagefolder:{folder}", "train")}, shards, total // (8 * workers))

        listed = load_dataset(f"imagefolder:{folder}", "train")
        sharded = load_dataset(f"webdataset:{shards}", "train")
        loaders = {"vitkit_folder": (lambda: vitkit_loader(listed, workers), workers),
                   "vitkit_shards": (lambda: vitkit_loader(sharded, workers), workers),
                   "torchvision_imagefolder": (lambda: torchvision_loader(folder, workers), workers),
                   # where a shortfall comes from: the loader's own work in one process, then one worker's
                   # passing of batches between processes, then the cores the workers really get
                   "vitkit_folder_in_process": (lambda: vitkit_loader(listed, 0), 0),
                   "vitkit_folder_1_worker": (lambda: vitkit_loader(listed, 1), 1)}
        samples = {name: [] for name in [*loaders, "single_core", "concurrent_processes"]}
        main_cpu = {name: [] for name in loaders}
        paired = {name: [] for name in loaders}  # each loader's rate over the limit measured just before it
        for _ in range(args.rounds):  # interleaved, so that every loader meets the same load
            samples["concurrent_processes"].append(concurrent_rate(files, workers))
            for name, (make, count) in loaders.items():
                samples["single_core"].append(single_core_rate(files))
                rate, cpu = loader_rate(make(), count, args.batches)
                samples[name].append(rate)
                main_cpu[name].append(cpu)
                paired[name].append(rate / (samples["single_core"][-1] * workers))
        median = {name: float(np.median(values)) for name, values in samples.items()}
        single = median.pop("single_core")
        result["concurrent_processes_images_per_s"] = round(median.pop("concurrent_processes"), 1)
        result["vs_decode_limit_paired"] = {name: round(float(np.median(ratios)), 3) for name, ratios in paired.items()}
        result["single_core_images_per_s"] = round(single, 1)
        result["decode_limit_images_per_s"] = round(single * workers, 1)
        result["images_per_s"] = rates = {name: round(value, 1) for name, value in median.items()}
        result["rounds"] = {name: [round(v, 1) for v in values] for name, values in samples.items()}
        result["main_process_cpu"] = {name: round(float(np.median(v)), 2) for name, v in main_cpu.items()}
        result["vs_torchvision"] = round(rates["vitkit_folder"] / rates["torchvision_imagefolder"], 3)
        result["in_process_vs_torchvision"] = in_process_ratio(folder, args.rounds + 1)
        result["in_process_shards_vs_folder"] = shards_in_process_ratio(folder, shards, args.rounds + 1)
        result["vs_decode_limit"] = {k: round(v / result["decode_limit_images_per_s"], 3) for k, v in rates.items()}
        result["fresh_memory_ms"] = fresh_memory_ms()

        small = linked_folder(files, scratch / "small", 10_000)
        started = time.perf_counter()
        large = linked_folder(files, scratch / "large", args.large)
        result["hard_links_s"] = round(time.perf_counter() - started, 1)
        time.sleep(RACY_NS / 1e9)  # as a folder made before the run: its listing may be cached
        folders = (("10k", small), (f"{args.large // 1000}k", large))
        first = {label: first_batch_seconds(path, workers) for label, path in folders}  # walks, caches the listing
        later = {label: [] for label, _ in folders}
        for _ in range(5):  # alternated, so that both sizes meet the same load
            for label, path in folders:
                later[label].append(first_batch_seconds(path, workers))
        for label, _ in folders:
            result[f"first_batch_s_{label}"] = {"first_run": round(first[label], 3),
                                                "cached": round(float(np.median(later[label])), 3)}
            result[f"first_batch_cached_runs_{label}"] = [round(seconds, 3) for seconds in later[label]]
        result["first_batch_ratio"] = {
            kind: round(result[f"first_batch_s_{args.large // 1000}k"][kind] / result["first_batch_s_10k"][kind], 2)
            for kind in ("first_run", "cached")}
        result["rss_mb_large_folder"] = rss_over_steps(load_dataset(f"imagefolder:{large}", "train"), workers,
                                                    args.rss_steps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["loadavg_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "data.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "data.md").write_text(markdown(result, args.large))
    print(json.dumps(result, indent=1))


def markdown(result: dict, large: int) -> str:
    rates, limit, cpu = result["images_per_s"], result["decode_limit_images_per_s"], result["main_process_cpu"]
    paired = result["vs_decode_limit_paired"]
    rows = [f"| {name} | {value:.0f} | {value / limit:.2f}x | {paired[name]:.2f}x | {cpu[name]:.2f} |"
            for name, value in rates.items()]
    small, big = result["first_batch_s_10k"], result[f"first_batch_s_{large // 1000}k"]
    return "\n".join([
        f"# Data loader: decode + `pretrain` transform at 224 px, batch {result['batch']}, "
        f"{result['workers']} workers",
        "",
        f"JPEGs: CIFAR-10 upscaled to 256-500 px, quality 90 ({result['jpeg_kb_mean']} kB on average). "
        f"Load average {result['loadavg_before'][0]:.1f} at the start, {result['loadavg_after'][0]:.1f} at the end, "
        f"{result['cpu_count']} cores. One loader alive at a time; medians of "
        f"{len(result['rounds']['concurrent_processes'])} interleaved rounds.",
        "",
        "| loader | images/s | of the decode limit | of the limit measured just before (median) "
        "| main process CPU (cores) |",
        "|---|---:|---:|---:|---:|",
        *rows,
        f"| decode limit (1 core x {result['workers']}) | {limit:.0f} | 1.00x | | |",
        f"| {result['workers']} plain decoding processes at once | {result['concurrent_processes_images_per_s']:.0f} "
        f"| {result['concurrent_processes_images_per_s'] / limit:.2f}x | | |",
        "",
        "In process and with one worker against the single core: the loader's own overhead, then the cost of "
        "passing batches between processes; plain processes at once: what the machine's cores give together.",
        "",
        f"vitkit folder / torchvision ImageFolder: {result['vs_torchvision']:.2f}x through the loaders; "
        f"{result['in_process_vs_torchvision']['median_ratio']:.2f}x for the same work in one process "
        f"(median of {len(result['in_process_vs_torchvision']['ours_images_per_s'])} alternated repeats).",
        f"vitkit shards / the same images read as files, images/s in one process: "
        f"{result['in_process_shards_vs_folder']['median_ratio']:.2f}x (median of "
        f"{len(result['in_process_shards_vs_folder']['ours_images_per_s'])} alternated repeats; below 1, what "
        f"reading tar members costs more than opening files).",
        f"Filling a {BATCH} x 3 x 224 x 224 float batch: {result['fresh_memory_ms']['new']} ms in new memory, "
        f"{result['fresh_memory_ms']['touched']} ms in memory already touched.",
        "",
        "Time to the first batch, each in a new process as a run starts (cached: median of 5, sizes alternated):",
        "",
        "| time to the first batch | 10k files | " + f"{large:,} files | ratio |",
        "|---|---:|---:|---:|",
        *[f"| {kind.replace('_', ' ')} | {small[kind]} s | {big[kind]} s | {result['first_batch_ratio'][kind]} |"
          for kind in ("first_run", "cached")],
        "",
        f"Resident memory (main + workers, MB), {large:,}-file folder, by kind (anonymous, pages of mapped files,"
        f" shared memory) in /proc's names:",
        "",
        "| step | " + " | ".join(RSS_KINDS) + " |",
        "|---|" + "---:|" * len(RSS_KINDS),
        *[f"| {mark[len('step_'):]} | " + " | ".join(str(kinds[kind]) for kind in RSS_KINDS) + " |"
          for mark, kinds in result["rss_mb_large_folder"].items()],
        "",
    ])


if __name__ == "__main__":
    main()
