"""Headless Chromium for the tests that render a page (the analysis report, the documentation site)."""

import shutil
import subprocess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "headless Chromium is not installed (Debian: apt-get install chromium)"


def chromium(tmp_path, *args):
    """Run headless Chromium with a profile of its own under ``tmp_path``; its stdout."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    done = subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
