"""What a training step of ViT-B/16 costs under each fine-tuning method: parameters trained, the bytes of
weights, gradients and AdamW state counted off the real tensors, the process's peak resident memory, the step
time, and vitkit.memory.estimate's figure beside them.

    PYTHONPATH=src python benchmarks/peft_cost.py [--methods full lora lora-qv vpt-deep adaptformer] [--batch 8]
        [--rounds 8] [--threads 2]

Memory: every method runs in a fresh process (``--one``), so that the peak resident memory (``ru_maxrss`` of
``getrusage(RUSAGE_SELF)``) is that method's alone. It builds ``vitkit.create_model("ViT-B/16", num_classes=10)``,
adapts it (``vitkit.checkpoints.adapters.adapt`` at the methods' defaults: LoRA r=8 on qkv, fc1, fc2; VPT-deep 10
prompts; AdaptFormer width 64; ``lora-qv`` is LoRA r=8 on the q and v rows), builds vitkit's AdamW
(``make_optimizer``), runs one step on random 224 px images, counts the tensors (parameters, ``p.grad``,
``optimizer.state``), runs a second step, counting what autograd saves for the backward pass, and reads its peak.
Time: then this process holds every method's model at once, warms each up with one step, and times ``--rounds``
rounds of one step per method in turn, so that load from other processes falls on all of them alike.

Writes benchmarks/results/peft_cost.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

import vitkit
from vitkit.checkpoints.adapters import AdapterSpec, adapt, parameter_counts
from vitkit.memory import MiB, estimate
from vitkit.train.optim import make_optimizer

import peft_records as records

MODEL, CLASSES = "ViT-B/16", 10
METHODS = ("full", "lora", "lora-qv", "vpt-deep", "adaptformer")
SETTINGS = {"full": "every weight", "linear": "the head", "bitfit": "biases", "vpt-shallow": "10 prompts at the input",
            "vpt-deep": "10 prompts per block", "lora": "r=8, alpha 8, on qkv, fc1, fc2",
            "lora-qv": "r=8, alpha 8, on the q and v rows of qkv (`--peft-targets q,v`)",
            "dora": "r=8, alpha 8, on qkv, fc1, fc2", "adaptformer": "width 64, scale 0.1"}


def spec(method: str) -> AdapterSpec:
    """The adapter of a row: a method at its defaults, or ``lora-qv``: LoRA on the q and v rows."""
    return AdapterSpec("lora", targets=("q", "v")) if method == "lora-qv" else AdapterSpec(method)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class Setup:
    """One method's model (adapted as ``adapt`` does; ``full``: every weight trained), its AdamW and a batch."""

    def __init__(self, method: str, batch: int):
        torch.manual_seed(0)
        self.method, self.model = method, vitkit.create_model(MODEL, num_classes=CLASSES)
        self.base = self.model.config
        if method == "full":
            self.trained, self.total = parameter_counts(self.model)
        else:
            self.trained, self.total = adapt(self.model, spec(method))
        self.model.train()
        self.optimizer = make_optimizer(self.model, "adamw", lr=1e-4, weight_decay=0.05)
        self.images = torch.randn(batch, 3, *self.base.image_size)
        self.labels = torch.randint(0, CLASSES, (batch,))

    def step(self) -> float:
        """One training step (zero the gradients, forward, cross-entropy, backward, AdamW); its seconds."""
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(self.model(self.images), self.labels).backward()
        self.optimizer.step()
        return time.perf_counter() - start


def shares() -> dict[str, dict[str, int]]:
    """Trained and all parameters of every method (default settings), counted on the meta device."""
    found = {}
    for method in SETTINGS:
        with torch.device("meta"):
            model = vitkit.create_model(MODEL, num_classes=CLASSES)
            trained, total = parameter_counts(model) if method == "full" else adapt(model, spec(method))
        found[method] = {"trained": trained, "total": total}
    return found


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def one(method: str, batch: int) -> dict:
    """One method's memory, measured in this process (a fresh one: its peak resident memory is this method's)."""
    setup = Setup(method, batch)
    before = peak_rss()
    setup.step()  # after it, the gradients of the step and the optimiser's state exist
    params = list(setup.model.parameters())
    counted = {"weights": tensor_bytes(params), "gradients": tensor_bytes(p.grad for p in params),
               "optimiser": tensor_bytes(value for state in setup.optimizer.state.values() for value in state.values())}
    weights = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:  # what autograd keeps for the backward pass, weights aside
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        setup.step()  # a step with the optimiser's state already there
    figure = estimate(setup.base, batch, training=True, optimizer="adamw",
                      trained=None if method == "full" else setup.trained, frozen_blocks=method == "linear")
    return {"method": method, "trained": setup.trained, "total": setup.total, "bytes": counted,
            "weights_grads_optimiser_bytes": sum(counted.values()), "saved_activation_bytes": sum(saved.values()),
            "peak_rss_bytes": peak_rss(),
            "peak_rss_before_steps_bytes": before, "estimate": {"total": figure.total, "parts": figure.parts}}


def timed_rounds(methods: list[str], batch: int, rounds: int) -> dict[str, list[float]]:
    """Seconds of ``rounds`` steps per method, the methods' steps in turn, after one warm-up step each."""
    setups = [Setup(method, batch) for method in methods]
    for setup in setups:
        setup.step()
    seconds: dict[str, list[float]] = {method: [] for method in methods}
    for round_ in range(rounds):
        for setup in setups:
            seconds[setup.method].append(setup.step())
        print(f"round {round_ + 1}: " + ", ".join(f"{m} {s[-1]:.2f} s" for m, s in seconds.items()), file=sys.stderr)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(SETTINGS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8, help="timed steps per method, the methods in turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # measure this method's memory here and print its record
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(one(args.one, args.batch)))
        return
    load_before, started = os.getloadavg(), time.perf_counter()
    rows = {}
    for method in args.methods:
        done = subprocess.run([sys.executable, __file__, "--one", method, "--batch", str(args.batch), "--threads",
                               str(args.threads)], check=True, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        rows[method] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{method}: peak RSS {rows[method]['peak_rss_bytes'] / MiB:.0f} MiB", file=sys.stderr)
    load_timed = os.getloadavg()
    for method, seconds in timed_rounds(args.methods, args.batch, args.rounds).items():
        rows[method] |= {"step_seconds": seconds, "median_step_seconds": statistics.median(seconds),
                         "min_step_seconds": min(seconds)}
    machine = records.machine(args.threads, load_before, started, loadavg_before_timing=load_timed)
    command = "PYTHONPATH=src python benchmarks/peft_cost.py " + " ".join(sys.argv[1:])
    record = {"model": MODEL, "classes": CLASSES, "batch": args.batch, "image_size": 224, "rounds": args.rounds,
              "command": command.strip(), "machine": machine, "rows": rows, "every_method": shares()}
    print(records.write("peft_cost", record, report))


def report(record: dict) -> str:
    machine, rows = record["machine"], record["rows"]
    full = rows.get("full")
    lines = [f"# Fine-tuning cost of {record['model']} per method", "",
             f"Machine: {machine['model']} ({', '.join(machine['flags'])}), {machine['cores']} cores, "
             f"{machine['threads']} torch threads, torch {machine['torch']}, fp32; load "
             f"{machine['loadavg_before'][0]:.1f} at the start, {machine['loadavg_before_timing'][0]:.1f} when the "
             f"timing began, {machine['loadavg_after'][0]:.1f} at the end (other processes shared the machine); "
             f"measured {machine['date']} with `{record['command']}` ({machine['wall_seconds'] / 60:.0f} min wall; "
             f"record: `peft_cost.json`).", "",
             f"{record['model']} at {record['image_size']} px with a {record['classes']}-class head, batch "
             f"{record['batch']} of random images, AdamW (vitkit's `make_optimizer`: fused kernel, weight decay on "
             f"the weight matrices). A step is: zero the gradients, forward, cross-entropy, backward, AdamW step.", "",
             "- Weights, gradients, AdamW state: the summed sizes of the real tensors after one step (every "
             "parameter, every `p.grad`, every tensor in `optimizer.state`), in a fresh process per method.",
             "- Activations: what autograd saved for the backward pass in that process's second step (the storages "
             "of the tensors its saved-tensor hooks saw, the weights left out).",
             "- Peak RSS: that process's `ru_maxrss` (`resource.getrusage(RUSAGE_SELF)`) after two steps: Python, "
             "torch and vitkit imported, the model, the batch, the activations, the gradients and the state; freed "
             "activations are reused by the gradients and the state, so the peaks differ by less than the tensors.",
             "- Estimate: `vitkit.memory.estimate(config, batch, training=True, optimizer='adamw', trained=N)`, the "
             "figure `vitkit finetune` checks against the memory available.",
             f"- Step time: one process holding every method's model, one warm-up step each, then {record['rounds']} "
             f"rounds of one step per method in turn; median and fastest step. Other processes took the cores in "
             f"bursts, which slow whichever steps they hit; the fastest step is the closest to the step's own cost.",
             "",
             "| method | settings | trained parameters | share | weights MiB | gradients MiB | AdamW state MiB | "
             "weights + grads + state MiB | vs full | activations MiB | peak RSS MiB | estimate MiB | median step s | "
             "fastest s | speed vs full (median, fastest) |", "|---|---|" + "---:|" * 13]
    for method, row in rows.items():
        counted, total = row["bytes"], row["weights_grads_optimiser_bytes"]
        memory_ratio = f"{total / full['weights_grads_optimiser_bytes']:.0%}" if full else "-"
        speed = (f"{full['median_step_seconds'] / row['median_step_seconds']:.2f}x, "
                 f"{full['min_step_seconds'] / row['min_step_seconds']:.2f}x") if full else "-"
        lines.append(f"| {method} | {SETTINGS[method]} | {row['trained']:,} | {row['trained'] / row['total']:.2%} | "
                     f"{counted['weights'] / MiB:.0f} | {counted['gradients'] / MiB:.1f} | "
                     f"{counted['optimiser'] / MiB:.1f} | {total / MiB:.0f} | {memory_ratio} | "
                     f"{row['saved_activation_bytes'] / MiB:,.0f} | {row['peak_rss_bytes'] / MiB:,.0f} | "
                     f"{row['estimate']['total'] / MiB:,.0f} | "
                     f"{row['median_step_seconds']:.2f} | {row['min_step_seconds']:.2f} | {speed} |")
    lines += ["", "`vs full`: weights + gradients + AdamW state as a share of full fine-tuning's; `speed vs full`: "
              "full fine-tuning's step time over the method's (above 1: faster). The shares count every "
              "parameter of the adapted model, the added LoRA, prompt and adapter weights included. Steps, s, in "
              "order: " + "; ".join(f"{method} {', '.join(f'{s:.2f}' for s in row['step_seconds'])}"
                                      for method, row in rows.items()) + ".", ""]
    lines += [f"Every method at its default settings ({record['model']}, {record['classes']} classes; counted on "
              f"the meta device). AdamW trains in fp32: gradients and two moments are 12 bytes per trained "
              f"parameter.", "", "| method | settings | trained parameters | share | gradients + AdamW state MiB |",
              "|---|---|---:|---:|---:|"]
    lines += [f"| {method} | {SETTINGS[method]} | {found['trained']:,} | {found['trained'] / found['total']:.2%} | "
              f"{12 * found['trained'] / MiB:,.1f} |" for method, found in record["every_method"].items()]
    lines.append("")
    if full and "lora" in rows:
        lora = rows["lora"]
        share = lora["weights_grads_optimiser_bytes"] / full["weights_grads_optimiser_bytes"]
        median = full["median_step_seconds"] / lora["median_step_seconds"]
        fastest = full["min_step_seconds"] / lora["min_step_seconds"]
        lines += [f"LoRA against full fine-tuning: weights + gradients + AdamW state {share:.0%} of full's "
                  f"({'at most' if share <= 0.5 else 'more than'} half); step {fastest:.2f}x full's speed by the "
                  f"fastest steps, {median:.2f}x by the medians; peak RSS {lora['peak_rss_bytes'] / MiB:,.0f} against "
                  f"{full['peak_rss_bytes'] / MiB:,.0f} MiB.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
