"""Atomic writes after a crash: leftovers swept, a version moved aside put back, a full disk named."""

import errno
import os

import pytest

from vitkit.atomic import atomic_directory, sweep
from vitkit.train.loop import MetricsLog


def test_sweep_puts_back_a_version_moved_aside_and_clears_temporaries(tmp_path):
    # The state a kill leaves between atomic_directory's two renames: the old `best` moved aside, the new
    # one complete in its staging folder but not renamed; plus an interrupted file write.
    (tmp_path / ".best.k3j2.old" / "best").mkdir(parents=True)
    (tmp_path / ".best.k3j2.old" / "best" / "config.json").write_text("old")
    (tmp_path / ".best.x9a1.tmp").mkdir()
    (tmp_path / ".best.x9a1.tmp" / "config.json").write_text("new")
    (tmp_path / ".summary.json.q0w9.tmp").write_text("{")
    (tmp_path / ".hidden-but-ours-not").write_text("kept")
    removed = sweep(tmp_path)
    assert (tmp_path / "best" / "config.json").read_text() == "old"
    assert sorted(p.name for p in removed) == [".best.k3j2.old", ".best.x9a1.tmp", ".summary.json.q0w9.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden-but-ours-not", "best"]


def test_a_failed_directory_write_leaves_the_old_version_and_no_staging(tmp_path):
    with atomic_directory(tmp_path / "ckpt") as staging:
        (staging / "config.json").write_text("first")
    with pytest.raises(OSError, match="disk"):
        with atomic_directory(tmp_path / "ckpt") as staging:
            (staging / "config.json").write_text("second")
            raise OSError("disk gone")
    assert (tmp_path / "ckpt" / "config.json").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_names_the_metrics_file(tmp_path):
    """/dev/full fails every write with a real ENOSPC."""
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    log = MetricsLog(tmp_path, enabled=True)
    log.board = None  # TensorBoard's own files are not under test
    with pytest.raises(OSError) as error:
        log.write(1, {"train/loss": 1.0})
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(tmp_path / "metrics.jsonl")
