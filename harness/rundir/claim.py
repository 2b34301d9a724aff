"""A run directory belongs to one process: the one that created its claim file."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Union

from harness.rundir.files import CLAIM_FILE


def claim_run_dir(path: Union[str, Path]) -> Path:
    """The run directory this process may fill: `path`, or `path-1`, `path-2`, ... when another process
    claimed it first (two `harness run`s started in the same second compose the same folder name).

    The claim is the exclusive creation of its claim file (O_CREAT | O_EXCL: of two processes, exactly one
    creates it), made before anything else is written inside; it records who holds the directory."""
    path = Path(path)
    candidate, n = path, 1
    while True:
        candidate.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(candidate / CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            candidate, n = path.with_name(f"{path.name}-{n}"), n + 1
            continue
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}, handle)
        return candidate
