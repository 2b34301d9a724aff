"""A sweep's progress, local or on Slurm: a rich bar (done, failed, pruned, remaining, elapsed, ETA) with each
run's lines above it."""

from __future__ import annotations

import time
from typing import Any, Optional

from harness.rundir import COMPLETED
from harness.terminal import fit_text, terminal_width


def eta_s(elapsed_s: float, finished: int, remaining: int) -> Optional[float]:
    """The runs still to go at the rate runs have finished so far (finished / elapsed): the mean time per
    run times the runs left when they go one after another (local), the same rate-based estimate when a
    Slurm array runs several side by side; unknown before the first run ends."""
    if finished == 0:
        return None
    return elapsed_s / finished * remaining


def clock(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class SweepProgress:
    """Counts the runs of one sweep as they end and draws them under the run lines."""

    def __init__(self, runnable: int, pruned: int, console: Any = None):
        from rich.console import Console

        self.console = console or Console()
        self.runnable, self.pruned = runnable, pruned
        self.done = self.failed = 0
        self.earlier = 0  # runs already final when following began: not part of the rate behind the ETA
        self.started = time.monotonic()
        self._progress = None
        self._task = None

    def counts(self) -> str:
        elapsed = time.monotonic() - self.started
        remaining = self.runnable - self.done - self.failed
        finished_here = self.done + self.failed - self.earlier
        return (f"{self.done} done, {self.failed} failed, {self.pruned} pruned, {remaining} remaining | "
                f"elapsed {clock(elapsed)} | ETA {clock(eta_s(elapsed, finished_here, remaining))}")

    def __enter__(self) -> "SweepProgress":
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[counts]}"), console=self.console,
                                  refresh_per_second=2)
        self._task = self._progress.add_task("sweep", total=max(self.runnable, 1), counts=self.counts())
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._refresh()
        self._progress.stop()

    def _refresh(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done + self.failed, counts=self.counts())

    def echo(self, line: str) -> None:
        """One line above the bar (a run's start, its step lines, its end); the bar's clocks tick on."""
        self.console.print(fit_text(line, terminal_width()), markup=False, highlight=False, soft_wrap=True)
        self._refresh()

    def _count(self, state: str) -> None:
        if state == COMPLETED:
            self.done += 1
        else:
            self.failed += 1

    def already(self, state: str) -> None:
        """A run that was final before the sweep was followed (`sweep status --watch` of a running sweep)."""
        self._count(state)
        self.earlier += 1
        self._refresh()

    def finished(self, name: str, state: str, reason: str) -> None:
        self._count(state)
        # Written out as well, so a log or a terminal without live redraw keeps every count.
        self.echo(f"[harness] {self.counts()}")
