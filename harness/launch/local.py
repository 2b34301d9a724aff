"""Start a rendered run on this machine with its standard launcher, and classify how it ended."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

from harness.engines.rendered import RenderedRun
from harness.rundir import (
    COMPLETED,
    FAILED,
    LAUNCH_LOG,
    TIMEOUT,
    metrics_written,
    read_status,
    state_from_files,
    write_status,
)

LOG_FILE = LAUNCH_LOG


def free_port() -> int:
    """A port nobody listens on now, so concurrent local runs do not collide on the rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def resolve_executable(name: str) -> str:
    """Prefer the launcher installed beside this Python (the venv's), whatever PATH says."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def rank_environment(rendered: RenderedRun, extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(rendered.env)
    env.update(extra)
    # One intra-op thread per rank: the ranks share this machine's cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def classify(run_dir: Path, returncode: Optional[int]) -> Tuple[str, str]:
    """Final state from structured files and the exit code (never from log text)."""
    if returncode is None:
        return TIMEOUT, "local time limit reached (launcher.timeout_s)"
    # A non-zero exit after metrics.json is still a failure here (the launcher saw a rank die).
    from_files = state_from_files(run_dir, metrics_count=returncode == 0)
    if from_files is not None:
        return from_files
    written = "after writing metrics.json" if metrics_written(run_dir) else "and no metrics.json"
    return FAILED, f"launcher exited with code {returncode} {written} (see {LOG_FILE})"


def _run_process_group(argv, log, env, timeout_s: int) -> Optional[int]:
    """Run the launcher in its own session; on timeout the whole group (every rank) is killed."""
    process = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return None
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def launch_local(rendered: RenderedRun, timeout_s: int, extra_env: Dict[str, str]) -> Tuple[str, str]:
    if rendered.nnodes != 1:
        raise ValueError(f"launcher=local starts one node; cluster.nodes={rendered.nnodes} needs launcher=slurm")
    run_dir = Path(rendered.run_dir)
    argv = rendered.argv_for("0", "127.0.0.1", str(free_port()))
    argv[0] = resolve_executable(argv[0])
    with open(run_dir / LOG_FILE, "w") as log:
        returncode = _run_process_group(argv, log, rank_environment(rendered, extra_env), timeout_s)
    state, reason = classify(run_dir, returncode)
    if state != COMPLETED or read_status(run_dir).state != COMPLETED:
        write_status(run_dir, state, reason)
    return state, reason
