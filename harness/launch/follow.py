"""Rank 0's step lines echoed live from a run's launch.log while the run is going."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Optional

from harness.runtime.progress import PROGRESS_PREFIX

FOLLOW_INTERVAL_S = 0.5  # how often the log is read: step lines appear on the console within this delay


class StepFollower:
    """Reads the launcher's log as it grows and hands each complete line that starts with PROGRESS_PREFIX
    to `say`; ranks' other output stays in the log only. A context manager: the last lines are read on exit."""

    def __init__(self, log_path: Path, say: Callable[[str], None], prefix: str = "",
                 interval_s: float = FOLLOW_INTERVAL_S):
        self.log_path, self.say, self.prefix, self.interval_s = Path(log_path), say, prefix, interval_s
        self._offset, self._partial = 0, b""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "StepFollower":
        self._thread = threading.Thread(target=self._loop, name="step-follower", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.read_new_lines()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read_new_lines()

    def read_new_lines(self) -> None:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._offset)
                chunk = log.read()
        except OSError:
            return
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if line.startswith(PROGRESS_PREFIX):
                self.say(f"{self.prefix}{line}")
