"""The files that ``--corrupt skip`` replaced in training, kept per rank beside the run so that
``summary.json`` can name them all, a resumed run included."""

from __future__ import annotations

from pathlib import Path

from .steplog import append_record, keep_steps_up_to, step_records


class SkippedFiles:
    """The files replaced in training under ``--corrupt skip``: one JSON line per step that had any in
    ``run_dir/skipped/rank-N.jsonl`` (each rank reads its own images), counted in the metrics too."""

    def __init__(self, run_dir: Path, rank: int):
        self.folder = Path(run_dir) / "skipped"
        self.path = self.folder / f"rank-{rank}.jsonl"

    def resume(self, step: int) -> None:
        """Forget the steps after ``step``: the resumed run reads their images again."""
        keep_steps_up_to(self.path, step)

    def record(self, step: int, names: list[str], log) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        append_record(self.path, {"step": step, "files": names})
        log.write(step, {"data/skipped": len(names)})

    def all_ranks(self) -> list[str]:
        paths = sorted(self.folder.glob("rank-*.jsonl")) if self.folder.is_dir() else []
        return [name for path in paths for record in step_records(path) if isinstance(record.get("files"), list)
                for name in record["files"] if isinstance(name, str)]
