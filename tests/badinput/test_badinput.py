"""The bad-input corpus (cases.py): every case ends with its exit status and one line that names what was
wrong, never a traceback; no pickle payload ever runs. Plus what needs a process of its own: a full disk
(a file size limit) and a read-only run directory."""

import io
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cases import CASES, PWNED, TRAIN, hf_with
from launch import child_env
from vitkit.cli import main


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny finished run (2 steps, a checkpoint at each) for the cases that resume or overwrite one."""
    run = tmp_path_factory.mktemp("badinput") / "run"
    assert main([*TRAIN, "--checkpoint-every", "1", "--run-dir", str(run)]) == 0
    return run


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_gets_a_clear_error(case, tmp_path, finished_run, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a case that runs without --run-dir writes its default run folder there
    if case.needs_run:
        shutil.copytree(finished_run, tmp_path / "run")
    argv = case.build(tmp_path)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == case.code, err
    assert case.says.format(tmp=tmp_path) in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("vitkit", "usage")) and "error" in err
    assert not os.path.exists(PWNED)


# Root ignores permission bits; without these two capabilities it obeys them like anyone else.
AS_ROOT_WITHOUT_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def run_in_process(argv, limit=None, prefix=()) -> subprocess.CompletedProcess:
    """``vitkit`` in a fresh process, optionally under a file size limit."""
    def restrict():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    env = child_env()
    return subprocess.run([*prefix, sys.executable, "-m", "vitkit", *argv], env=env, capture_output=True, text=True,
                          timeout=240, preexec_fn=restrict)


def test_a_full_disk_loses_nothing(finished_run, tmp_path):
    """A file size limit (RLIMIT_FSIZE: writes beyond it fail with EFBIG, as a full disk fails with
    ENOSPC) hits the next checkpoint: a one-line error, and the checkpoints already saved are intact."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = {p.relative_to(run): p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}
    result = run_in_process([*TRAIN, "--steps", "4", "--checkpoint-every", "1", "--run-dir", str(run), "--resume"],
                            limit=20_000)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "step-00000003: could not write" in result.stderr and "is the disk full?" in result.stderr
    after = {p.relative_to(run): p.read_bytes() for p in (run / "checkpoints").rglob("*") if p.is_file()}
    assert after == before  # nothing half-written left behind, nothing lost


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="root needs setpriv to obey modes")
def test_a_read_only_run_directory_is_named(tmp_path):
    """A run directory the user may not write: one line naming it, exit 1."""
    prefix = AS_ROOT_WITHOUT_OVERRIDE if os.geteuid() == 0 else []
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o555)
    try:
        result = run_in_process([*TRAIN, "--run-dir", str(run)], prefix=prefix)
    finally:
        run.chmod(0o755)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"{run}" in result.stderr and "Permission denied" in result.stderr


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="root needs setpriv to obey modes")
def test_an_unreadable_processor_config_is_named(tmp_path):
    """An HF directory whose preprocessor_config.json the user may not read: one line naming it, exit 1."""
    prefix = AS_ROOT_WITHOUT_OVERRIDE if os.geteuid() == 0 else []
    directory = hf_with(tmp_path, "{}")
    (directory / "preprocessor_config.json").chmod(0)
    result = run_in_process(["info", str(directory)], prefix=prefix)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip() == (f"vitkit info: error: {directory}/preprocessor_config.json: unreadable "
                                      f"(Permission denied); expected a JSON file")


def test_debug_shows_the_traceback_and_bugs_are_not_hidden(tmp_path, capsys, monkeypatch):
    assert main(["--debug", "info", str(tmp_path / "gone")]) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("VITKIT_DEBUG", "1")
    assert main(["info", str(tmp_path / "gone"), "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.delenv("VITKIT_DEBUG")

    def buggy(args):
        return 1 // 0
    monkeypatch.setattr("vitkit.cli.models.run_models", buggy)
    with pytest.raises(ZeroDivisionError):  # a genuine bug is no user error: it keeps its traceback
        main(["models"])


def test_resume_leaves_out_metric_lines_no_parser_can_read(finished_run, tmp_path):
    """A metrics.jsonl line nested past the JSON parser's depth, or holding an integer past Python's digit
    limit, is a malformed line like any other: resume drops it and keeps the run's records."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    metrics = run / "metrics.jsonl"
    kept = metrics.read_text()
    metrics.write_text(kept + "[" * 100_000 + "\n" + '{"step": ' + "9" * 5000 + "}\n")
    assert main(["train", "--resume", "--run-dir", str(run)]) == 0
    assert metrics.read_text() == kept


def test_the_eta_of_a_run_of_2_to_the_62_steps_is_printed(caplog):
    """Past what a timestamp holds (and past a day) the hours are counted on: 2^62 - 1 steps left at 1 s a step."""
    import logging

    from vitkit.progress import StepProgress

    progress = StepProgress(total=2**62, done=0, logger=logging.getLogger("vitkit.test"), stream=io.StringIO())
    progress.started -= 1.0  # one step took a second
    with caplog.at_level(logging.INFO, logger="vitkit.test"):
        progress.report(1, {"loss": 1.0}, 10.0)
    hours = re.search(r"ETA (\d+):\d\d:\d\d$", caplog.text.strip())  # about (2^62 - 1) / 3600: 1.28e15
    assert hours and 1.28e15 <= int(hours[1]) < 1.29e15, caplog.text
