"""The run-state vocabulary of status.json."""

from __future__ import annotations

from enum import Enum


class RunState(str, Enum):
    """Where a run stands. A str, so it compares equal to and serialises as its name."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    OOM = "OOM"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    PRUNED = "PRUNED"
    CORRUPT = "CORRUPT"  # a file of the run is unreadable or missing (the reason names it)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def final(self) -> bool:
        """Nothing more will happen to the run by itself (CORRUPT is not: a repair or a refresh can)."""
        return self in FINAL_STATES


PENDING, RUNNING, COMPLETED, FAILED, OOM, TIMEOUT, CANCELLED, PRUNED, CORRUPT = RunState
FINAL_STATES = (COMPLETED, FAILED, OOM, TIMEOUT, CANCELLED, PRUNED)
