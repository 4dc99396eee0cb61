"""The metrics of a training run: ``metrics.jsonl`` in the run directory, one JSON record per logged step
(cut back on resume so that each step is recorded once), mirrored to TensorBoard when it is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .steplog import append_record, keep_steps_up_to, step_records


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

    def close(self) -> None:
        """Stop TensorBoard's writer thread and close its event file (a run that ended, or failed)."""
        if self.board is not None:
            self.board.close()
            self.board = None

    def write(self, step: int, values: dict[str, float]) -> None:
        """Append one record of ``values`` at ``step`` (nothing on a rank other than the main one)."""
        if not self.enabled:
            return
        append_record(self.path, {"step": step, **values})
        if self.board is not None:
            for key, value in values.items():
                self.board.add_scalar(key, value, step)
            self.board.flush()
