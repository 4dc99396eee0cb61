"""How much memory a run will take, and how much there is: one estimate serves every check of sizes.

``estimate`` adds up what a process holds at its peak: the framework itself (Python, torch and vitkit
imported), the weights, in training their gradients and the optimiser's state (AdamW: two moments; SGD: one
momentum), the activations (training: what autograd saves for the backward pass, of every block, or with
activation checkpointing each block's input and the block recomputed, plus one block's gradients; inference:
the largest block's temporaries) and the loader's batches. Attention is counted as torch's fused
``scaled_dot_product_attention`` computes it (no tokens x tokens matrix), except where the model falls back to
the explicit product (attention dropout while training, relative position logits); a hybrid's ResNet is counted
by its weights alone. A dense head (``models.dense``) adds its maps and its outputs at the image's size, traced on
the meta device (``dense_head_bytes``). The per-token widths were read off the tensors autograd saves (the
coefficients below),
the rest of the factors off the peak resident memory of CPU runs; ``tests/test_memory.py`` holds the estimate to
within 30% of measured peaks.

``available_memory`` is what this process may grow to: the lower of its control group's limit (cgroup v2
``memory.max``, v1 ``memory.limit_in_bytes``) and the kernel's ``MemAvailable`` plus what the process holds
already (which the estimate counts as the framework's).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .data.slots import SLOTS
from .errors import ConfigError
from .models.config import GATED_MLPS, ViTConfig
from .models.dense import DenseHead, dense_layers, resized
from .models.position import make_position_embedding
from .models.stats import config_parameters

MiB, GiB = 2**20, 2**30
# Resident memory of a process that has imported torch 2.14 and vitkit's command line, before it allocates
# anything of its own (measured: 679-695 MiB of VmRSS on Linux x86-64, CPU build), plus the first kernels'
# workspaces and the allocator's slack of a small run (30-60 MiB).
FRAMEWORK_BYTES = 720 * MiB
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1, None: 0}  # copies of the weights an optimiser keeps
UNLIMITED = 2**60  # cgroup v1 writes "no limit" as the largest page-aligned int64
# The parts of an estimate that live where the model runs (the rest stays in the host's memory).
MODEL_PARTS = ("weights", "gradients", "optimiser", "activations")


@dataclass(frozen=True)
class Estimate:
    """Peak memory of a run in bytes, part by part; ``device`` is where the model's parts live."""

    parts: dict[str, int]
    device: str = "cpu"
    notes: dict[str, str] = field(default_factory=dict)  # what a part stands for, where it is not plain

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def host(self) -> int:
        """Bytes in the machine's memory: all but the model's parts on a CUDA device (MPS shares the machine's)."""
        return sum(size for name, size in self.parts.items() if self.device != "cuda" or name not in MODEL_PARTS)

    @property
    def accelerator(self) -> int:
        return self.total - self.host

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {describe_bytes(size)}" + (f" ({self.notes[name]})" if name in self.notes else "")
                          for name, size in self.parts.items())
        return f"{describe_bytes(self.total)}: {parts}"


def describe_bytes(size: float) -> str:
    return f"{size / GiB:,.2f} GiB" if size >= GiB / 10 else f"{size / MiB:.0f} MiB"


@dataclass(frozen=True)
class Limit:
    """How many bytes a process may hold, and what says so."""

    bytes: int
    source: str

    def __str__(self) -> str:
        return f"{describe_bytes(self.bytes)} ({self.source})"


# ------------------------------------------------------------------------------------------- estimate
def tokens_per_image(config: ViTConfig, image_size: tuple[int, int], patches: int | None = None) -> int:
    """Tokens a block sees: the patches (a NaFlex budget, or the grid of ``image_size``) and the prefix tokens."""
    if patches is None:
        stride = config.effective_patch_size
        patches = max(1, image_size[0] // stride) * max(1, image_size[1] // stride)
    return patches + config.num_prefix_tokens


def explicit_attention(config: ViTConfig, training: bool) -> bool:
    """Whether attention builds the (heads, tokens, tokens) matrices: torch's fused kernels do not, but attention
    dropout in training and relative position logits take the explicit product."""
    return config.pos_embed == "relative" or (training and config.attn_dropout > 0)


def saved_per_token(config: ViTConfig, tokens: int) -> int:
    """Values autograd saves per token and block for the backward pass (counted with saved-tensor hooks): the
    norms' inputs and outputs, q/k/v, the attention output and its merged copy (9 D), the MLP's hidden layer and
    its activation (2 MLP), the fused attention's log-sum-exp and the norms' statistics; each option adds its own."""
    dim, hidden, heads = config.dim, config.mlp_dim, config.num_heads
    width = 9 * dim + 2 * hidden + heads + 4
    width += 2 * hidden if config.mlp in GATED_MLPS else 0  # the gate's activation and the product
    # Gemma 4's options (measured with saved-tensor hooks): the branch outputs' norms, the values' norm, and the
    # clamped inputs and outputs of every dense layer.
    width += 4 * dim if config.sandwich_norm else 0
    width += dim if config.v_norm else 0
    width += 8 * dim + 3 * hidden if config.clamp_linears else 0
    width += 2 * dim if config.layer_scale is not None else 0
    width += 3 * dim if config.qk_norm else 0
    width += 2 * dim if config.rope != "none" else 0
    width += hidden + 2 * dim if config.dropout > 0 else 0  # the dropout masks
    width += 3 * heads * tokens if explicit_attention(config, training=True) else 0  # probabilities, mask, product
    return width


def inference_per_token(config: ViTConfig, tokens: int) -> int:
    """Values per token alive at once inside one block without autograd, with the allocator's slack (measured peaks
    run to about twice the live tensors): the residual stream, q/k/v and the MLP's hidden layer and activation."""
    hidden = config.mlp_dim * (2 if config.mlp != "gelu" else 1)
    width = 2 * (3 * config.dim + 2 * hidden)
    return width + (2 * config.num_heads * tokens if explicit_attention(config, training=False) else 0)


def estimate(config: ViTConfig, batch: int, image_size: int | tuple[int, int] | None = None, training: bool = False,
             optimizer: str | None = "adamw", workers: int = 0, *, dtype: torch.dtype = torch.float32,
             grad_checkpointing: bool = False, patches: int | None = None, device: str = "cpu",
             weight_copies: int = 1, trained: int | None = None, frozen_blocks: bool = False) -> Estimate:
    """Peak memory of running ``config`` on batches of ``batch`` images of ``image_size`` (default: the config's):
    ``training`` (forward, backward and an ``optimizer`` step: 'adamw', 'sgd' or None) or inference; ``workers``
    loader processes (0: batches made in this one); ``dtype`` the compute precision of the activations;
    ``patches`` a NaFlex budget of patches per image in place of the grid; ``weight_copies`` models held at once
    (an EMA, the copies a benchmark compares). Parameter-efficient fine-tuning: ``trained`` parameters (default:
    all) have gradients and optimiser state, frozen ones none; with ``frozen_blocks`` (a linear probe) no gradient
    flows through the blocks, which then hold inference's activations."""
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size or config.image_size)
    tokens = tokens_per_image(config, size, patches)
    weights = 4 * parameters_at(config, size)  # fp32 master weights; autocast computes in lower precision from them
    learned = weights if trained is None else 4 * trained
    bytes_ = torch.empty((), dtype=dtype).element_size()
    if training and not frozen_blocks:
        blocks = 2 if grad_checkpointing else config.depth  # checkpointed: the block recomputed, and its forward's
        per_token = saved_per_token(config, tokens) * (blocks + 1)  # + one block's gradients in the backward pass
        per_token += config.depth * config.dim if grad_checkpointing else 0  # each block's input, kept for recompute
    else:
        per_token = inference_per_token(config, tokens)
    pixels = patches * config.patch_size ** 2 if patches is not None else size[0] * size[1]
    loader = max(workers, 1) * SLOTS * batch * config.in_chans * pixels * 4  # float batches in the loaders' slots
    parts = {"framework": FRAMEWORK_BYTES, "weights": weight_copies * weights,
             "gradients": learned if training else 0,
             "optimiser": OPTIMIZER_STATES[optimizer] * learned if training else 0,
             "activations": batch * tokens * per_token * bytes_, "loader": loader,
             "dense head": dense_head_bytes(config, size, training, batch)}
    notes = {"activations": f"{batch} x {tokens} tokens" + (", checkpointed" if training and grad_checkpointing
                                                            and not frozen_blocks else ""),
             "loader": f"{max(workers, 1)} x {SLOTS} batches"}
    if weight_copies > 1:
        notes["weights"] = f"{weight_copies} copies"
    if training and trained is not None:
        notes["gradients"] = f"{trained:,} trained parameters"
    return Estimate({name: part for name, part in parts.items() if part}, device, notes)


def dense_head_bytes(config: ViTConfig, size: tuple[int, int], training: bool, batch: int = 1) -> int:
    """Bytes a dense head holds for ``batch`` images of ``size`` beyond the blocks' activations: in training what
    autograd saves of its maps and of its outputs brought to the image's size for the loss, plus the gradients of
    the two largest in the backward pass; in inference twice its largest map for each image, and one image's
    outputs at its size twice over (an evaluation resizes them one image at a time). 0 for a classifier."""
    if config.dense_head == "none":
        return 0
    maps, loss = _head_tensors(config.to_json(), tuple(size))
    if training:
        return batch * (sum(maps) + sum(loss) + 2 * max(maps + loss))
    return batch * 2 * max(maps) + 2 * max(loss)


@functools.lru_cache(maxsize=16)
def _head_tensors(config_json: str, size: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The bytes of each tensor (storage) autograd saves for one image of ``size`` in a dense head's forward pass,
    and in bringing its outputs to the image's size for a per-pixel loss; traced on the meta device (nothing
    allocated, nothing computed), in float32 as the loss takes the outputs, with autograd on whatever the caller's
    mode (under ``torch.no_grad()`` nothing would be saved)."""
    config = ViTConfig.from_json(config_json)
    stride = config.effective_patch_size
    grid = (max(1, size[0] // stride), max(1, size[1] // stride))
    maps: dict[int, int] = {}
    at_size: dict[int, int] = {}
    into = [maps]  # where the tensors saved now are counted

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in maps and storage._cdata not in at_size:  # saved by two operations: counted once
            into[0][storage._cdata] = storage.nbytes()
        return tensor

    with torch.device("meta"), torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        head = DenseHead(config).train()
        state = torch.empty(2, config.dim) if config.class_token else None  # two images: BatchNorm's minimum
        outputs = head([(torch.empty(2, config.dim, *grid), state) for _ in dense_layers(config)]).float()
        into[0] = at_size
        outputs = resized(outputs, size)
        loss = outputs.clamp(min=1e-3).log() if config.dense_output == "depth" else \
            torch.nn.functional.cross_entropy(outputs, torch.zeros(2, *size, dtype=torch.long))
    del loss
    return tuple(part // 2 for part in maps.values()), tuple(part // 2 for part in at_size.values() or [outputs.nbytes])


def parameters_at(config: ViTConfig, size: tuple[int, int]) -> int:
    """Parameters of ``config`` at ``size`` (rounded down to the token stride): its own count with the position
    table of the new grid in place of its own. Counted on the meta device, so that no size allocates anything;
    the whole model is built once per config (a size search asks for many sizes)."""
    stride = config.effective_patch_size
    resized = config.replace(image_size=(max(stride, size[0] // stride * stride),
                                         max(stride, size[1] // stride * stride)))
    if config.pos_embed == "relative":  # every block's table of relative positions grows with the grid
        return config_parameters(resized)
    return _parameters(config.to_json()) + _table_parameters(resized) - _table_parameters(config)


@functools.lru_cache(maxsize=8)
def _parameters(config_json: str) -> int:
    return config_parameters(ViTConfig.from_json(config_json))


def _table_parameters(config: ViTConfig) -> int:
    with torch.device("meta"):
        table = make_position_embedding(config)
    return 0 if table is None else sum(p.numel() for p in table.parameters())


# ------------------------------------------------------------------------------------------ the limit
def available_memory(cgroup: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> Limit:
    """What this process may grow to: the lower of its control group's memory limit (v2 and v1, the tightest of
    the group and its parents) and ``MemAvailable`` plus the process's own resident memory. ``cgroup`` and
    ``proc`` are where the two file systems are mounted."""
    limits = [Limit(available + resident_bytes(proc), "MemAvailable + this process's resident memory")
              for available in [_meminfo(proc / "meminfo", "MemAvailable")] if available is not None]
    limits += [limit for limit in [cgroup_limit(cgroup, proc / "self" / "cgroup")] if limit is not None]
    if not limits:
        raise OSError(f"{proc / 'meminfo'}: no MemAvailable and no cgroup memory limit; cannot tell how much "
                      f"memory there is")
    return min(limits, key=lambda limit: limit.bytes)


def cgroup_limit(root: Path, membership: Path) -> Limit | None:
    """The tightest memory limit of this process's control group and its parents, v2 (``memory.max``, at
    ``root`` or ``root/unified``) or v1 (``root/memory``, ``memory.limit_in_bytes``); None without one."""
    found: list[Limit] = []
    for line in _read(membership).splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            mounts, name = (root, root / "unified"), "memory.max"
        elif "memory" in controllers.split(","):
            mounts, name = (root / "memory",), "memory.limit_in_bytes"
        else:
            continue
        for mount in mounts:
            group = mount / path.lstrip("/")  # not there when the group's own folder is mounted (a container)
            for folder in [group, *group.parents] if group.is_dir() else [mount]:
                value = _read(folder / name).strip()
                if value.isdecimal() and int(value) < UNLIMITED:
                    found.append(Limit(int(value), f"cgroup {folder / name}"))
                if folder == mount:
                    break
    return min(found, key=lambda limit: limit.bytes, default=None)


def resident_bytes(proc: Path = Path("/proc")) -> int:
    """This process's resident memory now (``VmRSS``), 0 where the system does not say."""
    return _meminfo(proc / "self" / "status", "VmRSS") or 0


def _meminfo(path: Path, key: str) -> int | None:
    """A ``Key:   123 kB`` entry of a /proc file, in bytes."""
    for line in _read(path).splitlines():
        name, _, value = line.partition(":")
        if name == key and value.split() and value.split()[0].isdecimal():
            return int(value.split()[0]) * 1024
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # absent on this system (no cgroup, not Linux): that source says nothing
        return ""


def accelerator_memory(device: torch.device) -> Limit:
    """Free memory of a CUDA device as its driver reports it."""
    free, _ = torch.cuda.mem_get_info(device)
    return Limit(free, f"free on {device}")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container or ``taskset`` narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_workers(workers: int, flag: str = "--num-workers") -> None:
    """Refuse more loader processes than CPUs to run them: each is a copy of this process."""
    cpus = usable_cpus()
    if workers > cpus:
        raise ConfigError(f"{flag} {workers}: expected at most {cpus}, the CPUs this process may run on "
                          f"(os.sched_getaffinity)")


# ------------------------------------------------------------------------------------------ the check
@dataclass(frozen=True)
class Plan:
    """A run as the flags describe it, for ``check``: its batch per step, ``accum_steps`` micro-batches of it,
    the image size, and how the command line names the flags that change them."""

    batch: int
    image_size: tuple[int, int]
    accum_steps: int = 1
    grad_checkpointing: bool = False
    stride: int = 0  # pixels per token side: a suggested image size is a multiple of it (0: none suggested)
    image_flag: str | None = "--image-size {}"  # None: the command cannot change the size
    checkpointing_flag: str | None = None  # training: the flag that turns activation checkpointing on
    batch_flag: str | None = "--batch-size {}"  # None: the command cannot change the batch (one image, ...)

    @property
    def micro_batch(self) -> int:
        return max(1, self.batch // self.accum_steps)


def check(plan: Plan, measure: Callable[[Plan], Estimate], command: str, limit: Limit | None = None,
          device: torch.device = torch.device("cpu")) -> Estimate:
    """``measure(plan)``, refused with a ``ConfigError`` when it exceeds ``limit`` (default: ``available_memory``;
    on a CUDA ``device`` the model's parts are held to its free memory), naming the estimate, the limit and the
    flags that would fit."""
    limit = limit or available_memory()
    accelerator = accelerator_memory(device) if device.type == "cuda" else None
    found = measure(plan)
    if _fits(found, limit, accelerator):
        return found
    over = accelerator if accelerator and found.accelerator > accelerator.bytes else limit
    fitting = _fitting_flags(plan, measure, lambda other: _fits(other, limit, accelerator))
    where = f" on {found.device}" if over is accelerator else ""
    advice = ("; flags that fit: " + ", ".join(fitting)) if fitting else "; no smaller batch or image size fits"
    height, width = plan.image_size
    steps = f" in {plan.accum_steps} micro-batches" if plan.accum_steps > 1 else ""
    subject = f"at {plan.batch_flag.format(plan.batch)}{steps} of {height}x{width} images" if plan.batch_flag else \
        f"on {height}x{width} images, {plan.batch} at a time,"
    raise ConfigError(f"{command} {subject} needs about {found}{where}, but {over} is available{advice}")


def _fits(found: Estimate, limit: Limit, accelerator: Limit | None) -> bool:
    return found.host <= limit.bytes and (accelerator is None or found.accelerator <= accelerator.bytes)


def _fitting_flags(plan: Plan, measure: Callable[[Plan], Estimate], fits: Callable[[Estimate], bool]) -> list[str]:
    """Changes of one flag each that bring the run under the limit: a smaller batch (in training: more
    accumulation steps, which keep the batch a step sees), a smaller image, activation checkpointing."""
    advice = []
    largest = _largest(plan.micro_batch, lambda micro: fits(measure(replace(plan, batch=micro, accum_steps=1))))
    if largest and plan.batch_flag:
        if plan.checkpointing_flag:  # training: the same batch per step in micro-batches that fit
            steps = next(k for k in range(1, plan.batch + 1) if plan.batch % k == 0 and plan.batch // k <= largest)
            advice.append(f"--accum-steps {steps} (micro-batches of {plan.batch // steps}, the same {plan.batch} "
                          f"images a step)")
        advice.append(plan.batch_flag.format(largest))
    if plan.image_flag and plan.stride:
        height, width = plan.image_size

        def size(rows: int) -> tuple[int, int]:  # the aspect ratio kept, both sides multiples of the stride
            return rows * plan.stride, max(1, width * rows // height) * plan.stride

        rows = _largest(height // plan.stride, lambda rows: fits(measure(replace(plan, image_size=size(rows)))))
        if rows and size(rows) != plan.image_size:
            side = size(rows)
            advice.append(plan.image_flag.format(side[0] if side[0] == side[1] else f"{side[0]}x{side[1]}"))
    checkpointed = replace(plan, grad_checkpointing=True)
    if plan.checkpointing_flag and not plan.grad_checkpointing and fits(measure(checkpointed)):
        advice.append(plan.checkpointing_flag)
    return advice


def _largest(top: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in 1..top with fits(n), for a fits that holds below some bound (binary search); None if none."""
    if not fits(1):
        return None
    low, high = 1, top
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low
