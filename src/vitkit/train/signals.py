"""SIGTERM (a scheduler's preemption notice) and SIGINT (Ctrl-C) while a run trains: noted, so that the
trainer saves a checkpoint after the current step, then ends the process as the signal would have."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any


class StopRequest:
    """SIGTERM and SIGINT, noted while a run trains so that it can save before it stops (the handlers
    can only be installed from the main thread; elsewhere the signals keep their usual effect). A signal the
    process was started ignoring (a shell's background job ignores SIGINT, as does Python then) stays ignored:
    noting it would save a checkpoint, then deliver it to no effect, at every step to the end."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self.previous = {signum: signal.signal(signum, self._note) for signum in self.SIGNALS
                             if signal.getsignal(signum) != signal.SIG_IGN}
        return self

    def _note(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}

    def act(self, signum: int) -> None:
        """Put the usual handlers back and deliver ``signum`` to this process, as if it came now."""
        self.__exit__()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.raise_signal(signum)
