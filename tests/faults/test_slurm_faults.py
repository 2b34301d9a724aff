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
