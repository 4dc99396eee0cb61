"""The files that ``--corrupt skip`` replaced in training, kept per rank beside the run so that
``summary.json`` can name them all, a resumed run included."""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import atomic_file


class SkippedFiles:
    """The files replaced in training under ``--corrupt skip``: one JSON line per step that had any in
    ``run_dir/skipped/rank-N.jsonl`` (each rank reads its own images), counted in the metrics too."""

    def __init__(self, run_dir: Path, rank: int):
        self.folder = Path(run_dir) / "skipped"
        self.path = self.folder / f"rank-{rank}.jsonl"

    @staticmethod
    def _records(path: Path) -> list[dict]:
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill
                break
        return records

    def resume(self, step: int) -> None:
        """Forget the steps after ``step``: the resumed run reads their images again."""
        if self.path.exists():
            kept = [r for r in self._records(self.path) if r["step"] <= step]
            with atomic_file(self.path) as handle:
                handle.write("".join(json.dumps(r) + "\n" for r in kept))

    def record(self, step: int, names: list[str], log) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps({"step": step, "files": names}) + "\n")
        log.write(step, {"data/skipped": len(names)})

    def all_ranks(self) -> list[str]:
        paths = sorted(self.folder.glob("rank-*.jsonl")) if self.folder.is_dir() else []
        return [name for path in paths for record in self._records(path) for name in record["files"]]
