"""One training loop for every recipe: the objective says what to minimise, the ``Trainer`` does the rest.

Per step: learning rate from the schedule, ``accum_steps`` micro-batches (forward under autocast, backward,
gradient sync on the last one), clipping at a global norm, the optimiser step, the EMA weights (``ema``); then
logging (``metrics_log``), evaluation and checkpoints. DDP and FSDP differ only inside the helpers of
``distributed`` and ``checkpointing``. The state of a step is a function of its index, so a resumed run
continues bit for bit (CPU).

Crash consistency: a checkpoint is written every ``checkpoint_every`` steps and every ``checkpoint_minutes`` of
wall time; SIGTERM (a scheduler's preemption notice) and SIGINT (Ctrl-C) are noted (``signals``) and acted on
after the current step: a checkpoint is saved, then the process ends as the signal would have ended it (status
143 for SIGTERM; KeyboardInterrupt, status 130 from the command line, for SIGINT). On resume, ``metrics.jsonl``
loses the records of the steps that will be redone, so it holds each step once. Under torchrun, a rank that
dies ends the others at their next collective with a ``ConnectionError`` naming the checkpoint that
``--resume`` continues from; only the main rank writes checkpoints, each atomically, so a rank dying during a
write leaves the earlier ones whole.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shlex
import signal
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import TrainingDiverged
from ..progress import StepProgress
from ..runtime import autocast, autocast_dtype
from .checkpointing import list_checkpoints, load_checkpoint, plain_vit, save_checkpoint, sweep_run, vit_of
from .distributed import (Distributed, clip_gradients, full_state, full_weights, is_sharded, no_gradient_sync,
                          rank_loss_explained, wrap)
from ..checkpoints.adapters import save_model
from .ema import EMA
from .metrics_log import MetricsLog
from .objectives import Objective
from .recipes import Optim, Run, Schedule
from .signals import StopRequest

logger = logging.getLogger(__name__)


@dataclass
class LoopConfig:
    """How the ``Trainer`` runs: ``total_steps`` (what the data and the schedule make of the recipe) and three
    sections of the recipe, handed over whole: ``optim`` (clipping, EMA), ``schedule`` (accumulation) and ``run``
    (precision, compilation, and when it logs, evaluates and saves checkpoints)."""

    total_steps: int
    optim: Optim = field(default_factory=Optim)
    schedule: Schedule = field(default_factory=Schedule)
    run: Run = field(default_factory=Run)
    best_metric: str = "val/accuracy"  # higher is better


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
        self.ema = EMA(model, config.optim.ema_decay) if config.optim.ema_decay > 0 else None
        self.step = 0
        self.asked = (False, False)  # agreed over ranks at the last step: (stop, save)
        self.best: float | None = None
        self.saved_at = time.monotonic()  # when the last checkpoint was written (or training began)
        self.network = wrap(model, self.env)
        if config.run.compile:
            # static shapes: one graph per batch shape (the training steps share one, evaluation adds its last
            # partial batch), never a dynamic-shape graph, which torch 2.11's inductor fails to build for this model
            # once evaluation has seen two batch sizes (pytorch/pytorch#197077)
            self.network = torch.compile(self.network, dynamic=False)
        self.dtype = autocast_dtype(config.run.precision, self.env.device)
        self._log = MetricsLog(self.run_dir, self.env.is_main)

    def close(self) -> None:
        """Release what the run holds open beyond its checkpoints (TensorBoard's writer thread)."""
        self._log.close()

    def record(self, step: int, values: dict[str, float]) -> None:
        """Add ``values`` to the run's metrics at ``step`` (``metrics.jsonl``, and TensorBoard when installed;
        the main rank writes, the others' calls do nothing): what the loop measures, and what the caller counts
        beside it, such as the images the data pipeline skipped."""
        self._log.write(step, values)

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
            save_checkpoint(self.run_dir, self.step, self.model, weights, state, self.config.run.keep_last)
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
        due = bool(config.run.checkpoint_every and done % config.run.checkpoint_every == 0) or late
        if stopping or due:
            self.save()
        if stopping:
            self._stop(stop)

    def _requests(self, stop: StopRequest | None) -> list[float]:
        """This rank's (a signal asked to stop, a checkpoint is due by wall time), as 0/1."""
        minutes = self.config.run.checkpoint_minutes
        late = bool(minutes and time.monotonic() - self.saved_at >= 60 * minutes)
        return [float(stop is not None and stop.signum is not None), float(late)]

    def _stop(self, stop: StopRequest) -> None:
        signum = stop.signum or signal.SIGTERM
        if self.env.is_main:
            logger.warning(f"{signal.Signals(signum).name}: saved a checkpoint at step {self.step} of "
                           f"{self.config.total_steps}; {self.where_to_resume()}")
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
        accum = self.config.schedule.accum_steps
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
        clip = self.config.optim.clip_norm or math.inf
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
                    self.record(self.step, results)
                score = results.get(self.config.best_metric)
                if score is not None and score == score and (self.best is None or score > self.best):  # not NaN
                    self.best = score
                    save_model(model, self.run_dir / "best")
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
        """How to go on after a signal or a lost rank: the command that continues the run, ready to paste, and
        the newest complete checkpoint, which it continues from. ``vitkit train --resume`` continues a run of any
        recipe (pre-training and fine-tuning too): it reads the run's own recipe.json."""
        command = shlex.join(["vitkit", "train", "--run-dir", str(self.run_dir), "--resume"])
        found = list_checkpoints(self.run_dir)
        if not found:
            return f"{self.run_dir} holds no checkpoint yet: {command} starts the run over"
        return f"{command} continues the run from {found[-1]}"

    def _fit_from_start(self, resume: bool) -> dict[str, float]:
        config = self.config
        if self.env.is_main:
            sweep_run(self.run_dir)
        self.env.barrier()
        if resume and self.resume() and self.env.is_main:
            logger.info(f"resumed from step {self.step} in {self.run_dir}")
        self._log.truncate_after(self.step)
        if self.step >= config.total_steps:  # finished; killed while exporting or testing the final model
            return self._log.final(self.step)
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
                if done % config.run.log_every == 0 or done == config.total_steps:
                    rate = sum(n for n, _ in window) / max(sum(t for _, t in window), 1e-9)
                    window.clear()
                    shown = {k: v for k, v in last.items() if k != "train/images"}
                    self.record(done, {**shown, "train/images_per_s": rate})
                    progress.report(done, shown, rate)
                if config.run.eval_every and done % config.run.eval_every == 0 and done < config.total_steps:
                    last.update(self._evaluate())
                self._after_step(stop)
        last.update(self._evaluate())
        self.save()
        if stop.signum is not None:
            self._stop(stop)
        return last
