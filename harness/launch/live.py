"""Copy a launcher's output into launch.log as it comes, echoing rank 0's step lines to the console."""

from __future__ import annotations

import threading
from typing import IO, Callable, Optional

from harness.runtime.progress import PROGRESS_PREFIX


def step_line(raw: bytes) -> Optional[str]:
    """The progress part of one output line (a launcher may prefix it with a rank tag), or None."""
    text = raw.decode("utf-8", errors="replace").rstrip("\n")
    start = text.find(PROGRESS_PREFIX)
    return text[start:] if start >= 0 else None


def copy_lines(source: IO[bytes], log: IO[str], echo: Optional[Callable[[str], None]]) -> None:
    for raw in iter(source.readline, b""):
        log.write(raw.decode("utf-8", errors="replace"))
        log.flush()
        line = step_line(raw) if echo else None
        if line is not None:
            echo(line)
    source.close()


def start_copier(source: IO[bytes], log: IO[str], echo: Optional[Callable[[str], None]]) -> threading.Thread:
    """A daemon thread that drains the launcher's pipe until it closes (every rank has exited)."""
    thread = threading.Thread(target=copy_lines, args=(source, log, echo), name="launch-log", daemon=True)
    thread.start()
    return thread
