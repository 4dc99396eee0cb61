"""The files that ``--corrupt skip`` replaced in training, kept per rank beside the run so that
``summary.json`` can name them all, a resumed run included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .steplog import append_record, keep_steps_up_to, step_records


class SkippedFiles:
    """The files replaced in training under ``--corrupt skip``: one JSON line per step that had any in
    ``run_dir/skipped/rank-N.jsonl`` (each rank reads its own images), counted in the metrics too."""

    def __init__(self, run_dir: Path, rank: int, world_size: int = 1):
        self.folder = Path(run_dir) / "skipped"
        self.path = self.folder / f"rank-{rank}.jsonl"
        self.rank, self.world_size = rank, world_size

    def resume(self, step: int) -> None:
        """Forget the steps after ``step``: the resumed run reads their images again. The main rank also cuts
        back the files of ranks that a run resumed on fewer ranks no longer has (their steps are redone by
        the others, and no rank writes those files, so no rank races this)."""
        keep_steps_up_to(self.path, step)
        if self.rank == 0:
            ours = {f"rank-{rank}.jsonl" for rank in range(self.world_size)}
            for path in self.files():
                if path.name not in ours:
                    keep_steps_up_to(path, step)

    def files(self) -> list[Path]:
        """Every rank's file, those of earlier runs on more ranks included."""
        return sorted(self.folder.glob("rank-*.jsonl")) if self.folder.is_dir() else []

    def record(self, step: int, names: list[str], count: Callable[[int, dict[str, float]], None]) -> None:
        """Note the files replaced at ``step`` in this rank's file, and their number with ``count(step, values)``
        (``Trainer.record``: the run's metrics)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        append_record(self.path, {"step": step, "files": names})
        count(step, {"data/skipped": len(names)})

    def all_ranks(self) -> list[str]:
        return [name for path in self.files() for record in step_records(path) if isinstance(record.get("files"), list)
                for name in record["files"] if isinstance(name, str)]
