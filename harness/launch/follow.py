"""Rank 0's step lines echoed live from a run's progress.jsonl while the run is going: the same lines for a
local run and for a Slurm job (whose run directory sits on the filesystem the login node shares)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Optional

from harness.runtime.progress import PROGRESS_FILE, StepRecord

FOLLOW_INTERVAL_S = 0.5  # how often the file is read: step lines appear on the console within this delay


class StepFollower:
    """Reads a run's progress.jsonl as it grows and hands each complete record's line() to `say`. Used
    by polling (`read_new_lines`, a Slurm wait) or as a context manager that polls in a thread and reads
    the last records on exit (a local launch)."""

    def __init__(self, run_dir: Path, say: Callable[[str], None], prefix: str = "",
                 interval_s: float = FOLLOW_INTERVAL_S):
        self.path, self.say, self.prefix, self.interval_s = Path(run_dir) / PROGRESS_FILE, say, prefix, interval_s
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

    def skip_written(self) -> None:
        """Echo only what is written from now on (a run that ended before it was followed)."""
        try:
            self._offset, self._partial = self.path.stat().st_size, b""
        except OSError:
            pass

    def read_new_lines(self) -> None:
        try:
            with open(self.path, "rb") as progress:
                progress.seek(0, 2)
                if progress.tell() < self._offset:  # a new attempt started the file again
                    self._offset, self._partial = 0, b""
                progress.seek(self._offset)
                chunk = progress.read()
        except OSError:
            return
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            record = StepRecord.from_json_line(raw.decode("utf-8", "replace"))
            if record is not None:
                self.say(f"{self.prefix}{record.line()}")
