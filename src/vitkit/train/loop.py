"""One training loop for every recipe: the objective says what to minimise, the loop does the rest.

Per step: learning rate from the schedule, ``accum_steps`` micro-batches (forward under autocast,
backward, gradient sync on the last one), clipping at a global norm, the optimiser step, EMA
weights; then logging, evaluation and checkpoints. DDP and FSDP differ only inside the helpers of
``distributed`` and ``checkpointing``. The state of a step is a function of its index,
so a resumed run continues bit for bit (CPU).

Crash consistency: a checkpoint is written every ``checkpoint_every`` steps and every
``checkpoint_minutes`` of wall time; SIGTERM (a scheduler's preemption notice) and SIGINT (Ctrl-C) are
acted on after the current step: a checkpoint is saved, then the process ends as the signal would have
ended it (status 143 for SIGTERM; KeyboardInterrupt, status 130 from the command line, for SIGINT). On
resume, ``metrics.jsonl`` loses the records of the steps that will be redone, so it holds each step once.
Under torchrun, a rank that dies ends the others at their next collective with a ``ConnectionError`` naming
the checkpoint that ``--resume`` continues from; only the main rank writes checkpoints, each atomically, so a
rank dying during a write leaves the earlier ones whole.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shlex
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, TrainingDiverged
from ..progress import StepProgress
from ..runtime import autocast, resolve_precision
from .checkpointing import list_checkpoints, load_checkpoint, plain_vit, save_checkpoint, sweep_run, vit_of
from .distributed import (Distributed, clip_gradients, full_state, full_weights, gathered, is_sharded, no_gradient_sync,
                          rank_loss_explained, sharded_like, wrap)
from .objectives import Objective
from .steplog import append_record, keep_steps_up_to, step_records

logger = logging.getLogger(__name__)

TRAINING_PRECISIONS = ("fp32", "bf16", "auto")


@dataclass
class LoopConfig:
    """How the ``Trainer`` runs: steps, accumulation, clipping, precision, EMA, and when it logs, evaluates and
    saves checkpoints (the recipe fields of the same names)."""

    total_steps: int
    accum_steps: int = 1
    clip_norm: float | None = 1.0
    precision: str = "fp32"
    ema_decay: float = 0.0
    log_every: int = 20
    eval_every: int = 0  # 0: only at the end
    checkpoint_every: int = 0  # steps; 0: by wall time (and at the end) only
    checkpoint_minutes: float = 10.0  # wall time; 0: by steps (and at the end) only
    keep_last: int = 2
    best_metric: str = "val/accuracy"  # higher is better
    compile: bool = False


class EMA:
    """Polyak averaging of the weights: ``shadow <- decay * shadow + (1 - decay) * weights``. Under
    FSDP each rank averages its own shards; the state dict holds whole tensors."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.names = [n for n, t in model.state_dict().items() if t.is_floating_point()]
        self.shadow = [t.detach().clone() for n, t in model.state_dict().items() if n in self.names]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model``'s current weights by ``1 - decay``."""
        current = model.state_dict()
        torch._foreach_lerp_(self.shadow, [current[n] for n in self.names], 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights by name, whole tensors (gathered from FSDP shards), for a checkpoint."""
        return {name: gathered(tensor) for name, tensor in zip(self.names, self.shadow)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Take the averaged weights from a checkpoint's ``state`` (sharded again under FSDP)."""
        for tensor, name in zip(self.shadow, self.names):
            tensor.copy_(sharded_like(state[name], tensor))

    @contextlib.contextmanager
    def swapped_into(self, model: nn.Module):
        """Run a block with the averaged weights in ``model``, then put the trained ones back."""
        backup = {n: t.detach().clone() for n, t in model.state_dict().items()}
        model.load_state_dict({**backup, **dict(zip(self.names, self.shadow))})
        try:
            yield model
        finally:
            model.load_state_dict(backup)


class MetricsLog:
    """``metrics.jsonl`` in the run directory (and TensorBoard when it is installed); main rank only."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.path, self.enabled, self.board = Path(run_dir) / "metrics.jsonl", enabled, None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()  # a run directory we may not write fails here, before TensorBoard's threads start
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                pass
            else:
                self.board = SummaryWriter(str(run_dir))

    def records(self) -> list[dict[str, Any]]:
        """The complete records (a line cut short by a kill is left out)."""
        return step_records(self.path)

    def truncate_after(self, step: int) -> None:
        """On (re)start, drop the records of steps that the run will redo, and any torn line."""
        if self.enabled:
            keep_steps_up_to(self.path, step)

    def final(self, step: int) -> dict[str, float]:
        """The metrics recorded at ``step``, merged: what a finished run returned."""
        merged: dict[str, float] = {}
        for record in self.records():
            if record["step"] == step:
                merged.update({k: v for k, v in record.items() if k not in ("step", "train/images_per_s")})
        return merged

    def write(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        append_record(self.path, {"step": step, **values})
        if self.board is not None:
            for key, value in values.items():
                self.board.add_scalar(key, value, step)
            self.board.flush()


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir``, ready to paste: ``vitkit train --resume`` resumes
    a run of any recipe (pre-training and fine-tuning too), since it reads the run's own recipe.json."""
    return shlex.join(["vitkit", "train", "--resume", "--run-dir", str(run_dir)])


class StopRequest:
    """SIGTERM and SIGINT, noted while a run trains so that it can save before it stops (the handlers
    can only be installed from the main thread; elsewhere the signals keep their usual effect). A signal the
    process was started ignoring (a shell's background job ignores SIGINT, as does Python then) stays ignored:
    noting it would save a checkpoint, then deliver it to no effect, at every step to the end."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._note) for signum in self.SIGNALS
                             if signal.getsignal(signum) != signal.SIG_IGN}
        return self

    def _note(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def act(self, signum: int) -> None:
        """Put the usual handlers back and deliver ``signum`` to this process, as if it came now."""
        self.__exit__()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.raise_signal(signum)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The training compute dtype (``vitkit.runtime`` decides what ``auto`` means on this hardware).
    fp16 is left out: without loss scaling its gradients underflow."""
    if precision not in TRAINING_PRECISIONS:
        raise ConfigError(f"precision={precision!r} for training; expected one of {', '.join(TRAINING_PRECISIONS)}")
    return resolve_precision(precision, device)


class Trainer:
    """Train ``model`` with ``objective`` for ``config.total_steps`` optimiser steps.

    ``batches(start_step)`` yields this rank's micro-batches from step ``start_step`` on;
    ``lr_at(step)`` is the schedule (a parameter group's ``lr_scale``, where it has one, multiplies it:
    layer-wise decay); ``evaluate(model)`` returns metrics such as ``val/accuracy`` (on the main rank; the
    EMA weights are evaluated when EMA is on).
    """

    def __init__(self, model: nn.Module, objective: Objective, optimizer: torch.optim.Optimizer,
                 lr_at: Callable[[int], float], batches: Callable[[int], Iterable], run_dir: str | Path,
                 config: LoopConfig, evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
                 env: Distributed | None = None):
        self.model, self.objective, self.optimizer = model, objective, optimizer
        self.lr_at, self.batches, self.config, self.evaluate = lr_at, batches, config, evaluate
        self.env = env or Distributed()
        self.run_dir = Path(run_dir)
        self.ema = EMA(model, config.ema_decay) if config.ema_decay > 0 else None
        self.step = 0
        self.asked = (False, False)  # agreed over ranks at the last step: (stop, save)
        self.best: float | None = None
        self.saved_at = time.monotonic()  # when the last checkpoint was written (or training began)
        self.network = wrap(model, self.env)
        if config.compile:
            self.network = torch.compile(self.network)
        self.dtype = autocast_dtype(config.precision, self.env.device)
        self.log = MetricsLog(self.run_dir, self.env.is_main)

    # ---------------------------------------------------------------------------- state
    def training_state(self, optimizer: dict[str, Any]) -> dict[str, Any]:
        """What a checkpoint keeps beside the weights to continue the run exactly: step, ``optimizer`` state, best
        metric and every rank's random generators."""
        # every rank draws its own dropout and masks, so every rank's generator is kept
        state = {"step": self.step, "optimizer": optimizer, "best": self.best,
                 "rng_cpu": self.env.gather(torch.get_rng_state())}
        if torch.cuda.is_available():
            state["rng_cuda"] = self.env.gather(torch.cuda.get_rng_state(self.env.device))
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def resume(self) -> bool:
        """Continue from the newest complete checkpoint of the run directory, if there is one."""
        found = list_checkpoints(self.run_dir)
        if not found:
            return False
        state = load_checkpoint(found[-1], self.model, self.optimizer)
        self.step, self.best = state["step"], state["best"]
        self.restore_generators(state)
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        return True

    def restore_generators(self, state: dict[str, Any]) -> None:
        """Each rank's random generators as they were saved. On another number of ranks the run goes on,
        but no longer exactly: ranks beyond the saved ones get fresh seeds of their own."""
        def per_rank(saved):  # a lone tensor: written by one rank, before the streams were per rank
            return [saved] if isinstance(saved, torch.Tensor) else saved

        cpu = per_rank(state["rng_cpu"])
        if len(cpu) != self.env.world_size and self.env.is_main:
            warnings.warn(f"resuming a run saved by {len(cpu)} rank(s) on {self.env.world_size}: the random "
                          f"streams (dropout, masks), and a shard dataset's sample order in the epoch under way, "
                          f"will not be those of an uninterrupted run", stacklevel=2)
        if self.env.rank >= len(cpu):
            torch.manual_seed(self.step * 1_000_003 + self.env.rank)
            return
        torch.set_rng_state(cpu[self.env.rank])
        if "rng_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(per_rank(state["rng_cuda"])[self.env.rank], self.env.device)

    def save(self) -> None:
        """Write a checkpoint on the main rank; every rank calls it (FSDP gathers the shards)."""
        weights, optimizer = full_state(self.model, self.optimizer)
        state = self.training_state(optimizer)
        if self.env.is_main:
            save_checkpoint(self.run_dir, self.step, self.model, weights, state, self.config.keep_last)
        self.env.barrier()
        self.saved_at = time.monotonic()

    def _after_step(self, stop: StopRequest) -> None:
        """Save when a checkpoint is due by steps or wall time, or a signal asked the run to stop (then
        stop). The wall-time and signal parts are what the ranks agreed on in the step's reduction, so
        that under torchrun all of them save, and stop, at the same step."""
        config, done = self.config, self.step
        if done == config.total_steps:  # the final checkpoint follows the final evaluation
            return
        stopping, late = self.asked
        due = bool(config.checkpoint_every and done % config.checkpoint_every == 0) or late
        if stopping or due:
            self.save()
        if stopping:
            self._stop(stop)

    def _requests(self, stop: StopRequest | None) -> list[float]:
        """This rank's (a signal asked to stop, a checkpoint is due by wall time), as 0/1."""
        minutes = self.config.checkpoint_minutes
        late = bool(minutes and time.monotonic() - self.saved_at >= 60 * minutes)
        return [float(stop is not None and stop.signum is not None), float(late)]

    def _stop(self, stop: StopRequest) -> None:
        signum = stop.signum or signal.SIGTERM
        if self.env.is_main:
            logger.warning(f"{signal.Signals(signum).name}: saved a checkpoint at step {self.step} in "
                           f"{self.run_dir}; continue with: {resume_command(self.run_dir)}")
        stop.act(signum)

    @contextlib.contextmanager
    def final_model(self):
        """The ViT to evaluate and export, with the EMA average when EMA is on, on the main rank (None
        on the others). Every rank enters: under FSDP the shards are gathered into a plain copy."""
        sharded = is_sharded(self.model)
        if not (self.env.is_main or sharded):
            yield None
            return
        averaged = self.ema.swapped_into(self.model) if self.ema is not None else contextlib.nullcontext(self.model)
        with averaged as model:
            if not sharded:
                yield vit_of(model)
                return
            weights = full_weights(model)
        yield plain_vit(model, weights).to(self.env.device) if self.env.is_main else None

    # ------------------------------------------------------------------------------ loop
    def _to_device(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.env.device, non_blocking=True)
        return type(batch)(self._to_device(part) for part in batch)

    def _train_step(self, micro_batches, stop: StopRequest | None = None) -> dict[str, float]:
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        accum = self.config.accum_steps
        totals: dict[str, torch.Tensor] = {}
        images = 0
        for index in range(accum):
            batch = self._to_device(next(micro_batches))
            images += len(batch[0])
            last = index == accum - 1
            with contextlib.nullcontext() if last else no_gradient_sync(self.network):
                with autocast(self.env.device, self.dtype):
                    loss, metrics = self.objective(self.network, batch)
                (loss / accum).backward()
            for key, value in {"loss": loss.detach(), **metrics}.items():
                totals[key] = totals.get(key, 0.0) + value.detach().float() / accum
        clip = self.config.clip_norm or math.inf
        norm = clip_gradients(self.model.parameters(), clip)
        keys = sorted(totals)
        # the one host sync of the step: the weights must not be updated from a non-finite gradient; the
        # same reduction tells every rank whether any of them was asked to stop or is due to save
        reduced = [totals[k] for k in keys] + [norm.float()] + list(norm.new_tensor(self._requests(stop)))
        *averaged, grad_norm, stopping, late = self.env.mean(torch.stack(reduced)).tolist()
        self.asked = (stopping > 0, late > 0)
        values = dict(zip(keys, averaged))
        if not math.isfinite(values["loss"]) or not math.isfinite(grad_norm):
            raise TrainingDiverged(
                f"step {self.step}: loss {values['loss']} / gradient norm {grad_norm} is not finite; "
                f"stopped without updating the weights. The last good checkpoint is kept in "
                f"{self.run_dir / 'checkpoints'}; lower the learning rate or check the data.")
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update(self.model)
        self.step += 1
        return {**{f"train/{k}": v for k, v in values.items()}, "train/lr": lr,
                "train/grad_norm": grad_norm, "train/images": images * self.env.world_size}

    def _evaluate(self) -> dict[str, float]:
        if self.evaluate is None:
            return {}
        results: dict[str, float] = {}
        self.model.eval()
        with self.final_model() as model:
            if self.env.is_main:
                with torch.no_grad():
                    results = self.evaluate(model)
                if results:
                    self.log.write(self.step, results)
                score = results.get(self.config.best_metric)
                if score is not None and (self.best is None or score > self.best):
                    self.best = score
                    model.save(self.run_dir / "best")
        self.model.train()
        self.env.barrier()
        return results

    def fit(self, resume: bool = False) -> dict[str, float]:
        """Run to ``total_steps`` (from the last checkpoint if ``resume``); returns the last metrics. Under
        torchrun, a rank that is lost ends the others with a ``ConnectionError`` saying where to resume from."""
        with self.rank_loss_explained():
            return self._fit_from_start(resume)

    def rank_loss_explained(self):
        """A block whose collectives, when a rank is lost, end this one with a ``ConnectionError`` saying where
        the run can resume from."""
        return rank_loss_explained(self.env, self.where_to_resume)

    def where_to_resume(self) -> str:
        """Advice after a lost rank: the newest complete checkpoint, which ``--resume`` continues from."""
        found = list_checkpoints(self.run_dir)
        if not found:
            return f"{self.run_dir} holds no checkpoint yet: --resume starts the run over"
        return f"--resume continues the run from {found[-1]}"

    def _fit_from_start(self, resume: bool) -> dict[str, float]:
        config = self.config
        if self.env.is_main:
            sweep_run(self.run_dir)
        self.env.barrier()
        if resume and self.resume() and self.env.is_main:
            logger.info(f"resumed from step {self.step} in {self.run_dir}")
        self.log.truncate_after(self.step)
        if self.step >= config.total_steps:  # finished; killed while exporting or testing the final model
            return self.log.final(self.step)
        with StopRequest() as stop:
            return self._fit(stop)

    def _fit(self, stop: StopRequest) -> dict[str, float]:
        config = self.config
        self.model.train()
        micro_batches = iter(self.batches(self.step))
        window: list[tuple[float, float]] = []
        progress = StepProgress(config.total_steps, self.step, logger, quiet=not self.env.is_main)
        with contextlib.closing(progress):  # closed on a stop or an error as well
            last: dict[str, float] = {}
            while self.step < config.total_steps:
                tick = time.perf_counter()
                last = self._train_step(micro_batches, stop)
                window.append((last["train/images"], time.perf_counter() - tick))
                done = self.step
                progress.advance(done)
                if done % config.log_every == 0 or done == config.total_steps:
                    rate = sum(n for n, _ in window) / max(sum(t for _, t in window), 1e-9)
                    window.clear()
                    shown = {k: v for k, v in last.items() if k != "train/images"}
                    self.log.write(done, {**shown, "train/images_per_s": rate})
                    progress.report(done, shown, rate)
                if config.eval_every and done % config.eval_every == 0 and done < config.total_steps:
                    last.update(self._evaluate())
                self._after_step(stop)
        last.update(self._evaluate())
        self.save()
        if stop.signum is not None:
            self._stop(stop)
        return last
