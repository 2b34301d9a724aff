"""Run the real CLI into a temporary results folder, as a user would."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from harness import REPO_ROOT
from harness.rundir import COMPLETED, LAUNCH_LOG, read_status

HARNESS = [sys.executable, "-m", "harness.cli"]


def run_harness(args: List[str], results: Path, timeout: int = 900, env: Dict[str, str] = None):
    """`harness run ...` as a user runs it; returns (completed process, run dirs, seconds)."""
    full_env = {**os.environ, **(env or {})}
    start = time.monotonic()
    proc = subprocess.run(
        [*HARNESS, "run", *args, f"results_dir={results}"],
        cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    run_dirs = sorted(p.parent for p in results.rglob("status.json"))
    return proc, run_dirs, elapsed


def failure_report(proc, run_dirs: List[Path]) -> str:
    """What a failed `harness run` printed, and the end of the launch log of each run that did not complete
    (a launcher that dies before its ranks start leaves its cause only there)."""
    logs = []
    for run_dir in run_dirs:
        log = run_dir / LAUNCH_LOG
        if read_status(run_dir).state != COMPLETED and log.exists():
            logs.append(f"--- {run_dir.name}/launch.log ---\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join([proc.stdout[-3000:], proc.stderr[-3000:], *logs])


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def prepare_and_launch(cfg, run_dir: Path, timeout_s: int = 600):
    """Plan, render and launch one composed config in-process; returns (metrics.json, plan.json, seconds)."""
    from harness.launch.local import launch_local
    from harness.launch.prepare import prepare_run

    prepared = prepare_run(cfg, run_dir)
    start = time.monotonic()
    state, reason = launch_local(prepared.rendered, timeout_s, {})
    seconds = time.monotonic() - start
    log = (run_dir / "launch.log").read_text() if (run_dir / "launch.log").exists() else ""
    assert state == "COMPLETED", f"{state}: {reason}\n{log[-4000:]}"
    return metrics(run_dir), json.loads((run_dir / "plan.json").read_text()), seconds
