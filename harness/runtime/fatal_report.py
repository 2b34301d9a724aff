"""A rank killed by a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) leaves its own error record.

Such a rank runs no Python exception handler, and on Slurm or under any launcher but the local watchdog
nothing else records how it ended: its peers then fail with "Connection closed by peer" and one of them
would be named the cause. faulthandler writes every thread's Python stack, async-signal-safely, into a
file opened here before the run starts; the file is errors/rank<N>.fatal, dated when the rank died, and the
run directory's reader turns it into the rank's record (harness.rundir.records.RankError.from_fatal_report).
A rank that returns or raises removes the empty file; one killed by SIGTERM or SIGKILL leaves it empty, and
the reader ignores an empty report.
"""

from __future__ import annotations

import faulthandler
from pathlib import Path
from typing import IO, Optional

from harness.rundir import fatal_report_file


class FatalReport:
    """Armed by `arm` (as the rank starts), disarmed by `disarm` (however it ends, short of the signal)."""

    def __init__(self, run_dir: Path, rank: int):
        self.path = Path(run_dir) / fatal_report_file(rank)
        self._file: Optional[IO[str]] = None

    def arm(self) -> "FatalReport":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        faulthandler.enable(file=self._file, all_threads=True)
        return self

    def disarm(self) -> None:
        if self._file is None:
            return
        faulthandler.disable()
        self._file.close()
        self._file = None
        self.path.unlink(missing_ok=True)
        try:
            self.path.parent.rmdir()  # errors/ stays only where a rank recorded a failure
        except OSError:
            pass

    def __enter__(self) -> "FatalReport":
        return self.arm()

    def __exit__(self, *exc) -> None:
        self.disarm()


