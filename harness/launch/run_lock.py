"""One live launch per run directory: `run.lock` names the host, process and start time that hold it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Optional

import psutil

LOCK_FILE = "run.lock"


class RunLocked(RuntimeError):
    """The run directory is held by a live process."""


def _start_time(pid: int) -> Optional[float]:
    """When process `pid` started; None once it has ended (a zombie has ended too)."""
    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
    except psutil.Error:
        return None


def live_holder(run_dir: Path) -> Optional[str]:
    """Who holds the run (`host pid N started T`), or None when unlocked or the lock is stale.

    A lock is stale when its process is gone or its pid now belongs to a younger process (pids are
    reused) or has ended. A lock from another host cannot be checked from here and counts as live.
    """
    try:
        lock = json.loads((Path(run_dir) / LOCK_FILE).read_text())
        host, pid, started = lock["host"], int(lock["pid"]), float(lock["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host == socket.gethostname():
        seen = _start_time(pid)
        if seen is None or abs(seen - started) > 1.0:
            return None
    return f"still running on {host} under pid {pid} (started {started:.0f})"


class RunLock:
    """Hold `run.lock` while the block runs (O_EXCL, so two launches cannot both take it); a stale lock is
    replaced, a live one refused. `hand_to(pid)` names the process that outlives this one (the watchdog)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE

    def __enter__(self) -> "RunLock":
        for _ in range(2):
            try:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = live_holder(self.path.parent)
                if holder:
                    raise RunLocked(f"{self.path.parent.name}: {holder}") from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(descriptor, "w") as handle:
                handle.write(json.dumps(self._record(os.getpid())))
            return self
        raise RunLocked(f"{self.path.parent.name}: another launch took the lock at the same time")

    def hand_to(self, pid: int) -> None:
        temporary = self.path.with_name(f".{LOCK_FILE}.{os.getpid()}")
        temporary.write_text(json.dumps(self._record(pid)))
        os.replace(temporary, self.path)

    @staticmethod
    def _record(pid: int) -> dict:
        return {"host": socket.gethostname(), "pid": pid, "start_time": _start_time(pid) or 0.0,
                "harness_pid": os.getpid()}

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)
