"""The JSON-lines records of a run (metrics, skipped files): a kill's torn line or a line of another shape is
left out on resume, never a crash."""

import json

from vitkit.train.metrics_log import MetricsLog
from vitkit.train.skipped import SkippedFiles

LINES = ['{"step": 1, "files": ["a.jpg"]}', "[1, 2]", "3", '"text"', "null", '{"files": ["no step"]}',
         '{"step": "2", "files": ["step as text"]}', '{"step": 2, "files": ["b.jpg"]}',
         '{"step": 3, "files": ["c.jpg"]}', '{"step": 2, "files": "not a list"}',
         '{"step": 4, "fi']  # the last one torn by a kill


def test_records_of_any_other_shape_are_left_out_on_resume(tmp_path):
    skipped = SkippedFiles(tmp_path, rank=0)
    skipped.folder.mkdir()
    skipped.path.write_text("\n".join(LINES))
    skipped.resume(2)  # was: TypeError on the JSON list
    assert [json.loads(line) for line in skipped.path.read_text().splitlines()] == [
        {"step": 1, "files": ["a.jpg"]}, {"step": 2, "files": ["b.jpg"]}, {"step": 2, "files": "not a list"}]
    assert skipped.all_ranks() == ["a.jpg", "b.jpg"]

    log = MetricsLog(tmp_path, enabled=True)
    log.board = None
    log.path.write_text("\n".join(LINES))
    assert [r["step"] for r in log.records()] == [1, 2, 3, 2]
    log.truncate_after(1)
    log.write(2, {"train/loss": 0.5})
    assert log.records() == [{"step": 1, "files": ["a.jpg"]}, {"step": 2, "train/loss": 0.5}]
