"""A run cut by its time limit's warning on the real local cluster: Slurm signals the job's task (as
`--signal=USR1@<lead>` does ahead of the limit), the ranks stop together after their step and write the steps
they measured, marked partial; the run is TIMEOUT with that measurement in its status, summary and report."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
STEPS = 100_000  # far more than the test waits for: only the warning ends the run


def harness(env, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def timed_steps_logged(log: Path) -> int:
    """Rank 0's progress lines past warm-up (`[step N/M]`, harness/runtime/progress.py)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return len(re.findall(r"\[step (\d+)/(\d+)\]", text))


def test_the_warning_signal_leaves_a_partial_measurement_and_timeout(slurm_cluster, tmp_path):
    env = dict(slurm_cluster)
    proc = harness(env, "run", "cluster=local_slurm", "launcher=slurm_local", "tracking=disabled",
                   f"bench.steps={STEPS}", "bench.warmup_steps=2", "launcher.time_limit=UNLIMITED",
                   "sweep_name=cut", f"results_dir={tmp_path}", "--no-wait")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    job, run = re.search(r"slurm job (\d+); run directory (\S+)", proc.stdout).groups()
    run = Path(run)
    try:
        assert f"--signal=USR1@" in (run / "job.sbatch").read_text()
        wait_for(lambda: timed_steps_logged(run / f"slurm-{job}.out") >= 5, 600, "timed steps in the job's log")
        subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)
        wait_for(lambda: json.loads((run / "status.json").read_text())["state"] not in ("RUNNING", "PENDING"),
                 300, "the job to end")
    finally:
        subprocess.run(["scancel", job], env=env, check=False)
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "TIMEOUT", status
    metrics = json.loads((run / "metrics.json").read_text())
    partial = metrics["partial"]
    assert 1 <= partial["steps_measured"] < STEPS and partial["steps_planned"] == STEPS
    assert len(metrics["measured"]["step_times_s"]) == partial["steps_measured"]
    assert metrics["measured"]["tokens_per_s"] > 0 and metrics["world_size"] == 2
    assert f"partial measurement: {partial['steps_measured']} of {STEPS} timed steps" in status["reason"]
    # Slurm's view once the job has ended keeps it: TIMEOUT with the partial measurement, in the status table
    # and in the summary the report writes.
    shown = harness(env, "sweep", "status", str(run.parent))
    assert "TIMEOUT" in shown.stdout and "partial measurement" in shown.stdout, shown.stdout
    assert json.loads((run / "status.json").read_text())["state"] == "TIMEOUT"
    report = harness(env, "report", str(run.parent))
    assert report.returncode == 0, report.stderr
    with open(run.parent / "summary.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["status"] == "TIMEOUT" and float(row["tokens_per_s"]) > 0 and "partial measurement" in row["reason"]


def test_slurm_sends_the_warning_itself_ahead_of_a_short_limit(slurm_cluster, tmp_path):
    """The run's own job.sbatch, submitted by hand with a 3-minute limit and a 120 s lead (sbatch's options
    override the script's): Slurm signals the job by itself (up to 60 s earlier than asked, sbatch(1)), the
    ranks stop after their step, and the run ends TIMEOUT with a partial measurement before the limit."""
    env = dict(slurm_cluster)
    proc = harness(env, "sweep", "cluster=local_slurm", "launcher=slurm_local", "tracking=disabled",
                   f"bench.steps={STEPS}", "launcher.time_limit=UNLIMITED", "sweep_name=limit",
                   f"results_dir={tmp_path}", "--dry-run")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    (run,) = [p.parent for p in tmp_path.rglob("job.sbatch")]
    job = subprocess.run(["sbatch", "--parsable", "--time=3", "--signal=USR1@120", str(run / "job.sbatch")],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    try:
        wait_for(lambda: json.loads((run / "status.json").read_text())["state"] not in ("PENDING", "RUNNING"),
                 240, "the job to end")
    finally:
        subprocess.run(["scancel", job], env=env, check=False)
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "TIMEOUT" and "partial measurement" in status["reason"], status
    partial = json.loads((run / "metrics.json").read_text())["partial"]
    assert 1 <= partial["steps_measured"] < STEPS
