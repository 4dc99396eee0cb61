"""Files of JSON lines, one record per step (``metrics.jsonl``, ``skipped/rank-N.jsonl``): appended as a run
goes, cut back to the checkpoint's step on resume, so that each step is recorded once whatever killed the
run. Reading keeps only well-formed records: a line torn by a kill, or any line that is not a JSON object
with an integer ``step``, is left out rather than stopping ``--resume``."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from ..atomic import atomic_file, name_the_file


def step_records(path: Path) -> list[dict[str, Any]]:
    """The well-formed records of ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    if not path.is_file():  # a directory, a device: never read a stream without end
        raise FileExistsError(f"{path} is not a regular file; expected a run's records (JSON lines)")
    found = []
    for line in path.read_text(errors="replace").splitlines():
        # not JSON, an integer past Python's digit limit, arrays nested past the parser's depth: all malformed alike
        with contextlib.suppress(ValueError, RecursionError):
            record = json.loads(line)
            if isinstance(record, dict) and type(record.get("step")) is int:
                found.append(record)
    return found


def keep_steps_up_to(path: Path, step: int) -> None:
    """Drop the records of the steps after ``step`` (a resumed run redoes them) and every malformed line."""
    if not path.exists():
        return
    kept = [record for record in step_records(path) if record["step"] <= step]
    with atomic_file(path) as handle:
        handle.write("".join(json.dumps(record) + "\n" for record in kept))


def append_record(path: Path, record: dict[str, Any]) -> None:
    try:
        with path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError as error:
        name_the_file(error, path)
        raise
