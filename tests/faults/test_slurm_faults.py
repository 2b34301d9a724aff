"""Faults of Slurm runs on the real local cluster: a job that can never start, a rank killed inside a job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.conftest import slurm_cluster  # noqa: F401 (the session's local cluster)

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
COMMON = ["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled", "bench.steps=2", "--poll=1"]


def harness(env, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def only_run(results: Path) -> Path:
    (status,) = results.rglob("status.json")
    return status.parent


def test_a_job_that_can_never_start_fails_the_point_and_the_sweep_returns(slurm_cluster, tmp_path):  # noqa: F811
    """64 CPU ranks per node ask `--cpus-per-task=64` of nodes with 4 CPUs: Slurm says PartitionConfig."""
    proc = harness(dict(slurm_cluster), "sweep", *COMMON, f"results_dir={tmp_path}",
                   "cluster.accelerators_per_node=64", "layout.dp_shard=-1", timeout=120)
    run = only_run(tmp_path)
    status = json.loads((run / "status.json").read_text())
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert status["state"] == "FAILED", status
    assert "can never start" in status["reason"] and "PartitionConfig" in status["reason"], status
    job = json.loads((run / "slurm.json").read_text())["job_id"]
    queue = subprocess.run(["squeue", "--noheader", f"--jobs={job}", "--states=PENDING"], env=dict(slurm_cluster),
                           capture_output=True, text=True)
    assert queue.stdout.strip() == "", "the job was left in the queue"


def _rank_pids(run: Path, timeout_s: float = 120) -> dict:
    """{rank: pid} of the job's ranks once both run: the topmost RANK carriers below a process of the run."""
    import time

    import psutil

    from harness.launch.watchdog import rank_processes

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if any(str(run) in part for part in cmdline):
                ranks = {rank: pid for pid, rank in rank_processes(process.pid).items()}
                if len(ranks) == 2:
                    return ranks
        time.sleep(0.5)
    raise AssertionError(f"the job's ranks did not start within {timeout_s} s")


def test_a_rank_killed_inside_a_job_is_named_not_its_peer(slurm_cluster, tmp_path):  # noqa: F811
    import os
    import signal
    import time

    env = dict(slurm_cluster)
    proc = harness(env, "sweep", *COMMON, f"results_dir={tmp_path}", "bench.steps=400", "--no-wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = only_run(tmp_path)
    ranks = _rank_pids(run)
    time.sleep(2.0)  # into the run, past the ranks' start
    os.kill(ranks[1], signal.SIGKILL)
    harness(env, "sweep", "status", str(run.parent), "--watch", "--poll=1", timeout=180)
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "FAILED", status
    assert status["reason"].startswith("rank 1: SIGKILL"), status
