"""`harness run` with launcher=slurm_local on the real local cluster: the tiny default recipe is submitted
through its job.sbatch, followed until its job ends, and reported as a local run is (metrics, summary)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]


def test_harness_run_submits_and_follows_the_job(slurm_cluster, tmp_path):
    args = ["run", "cluster=local_slurm", "launcher=slurm_local", "tracking=disabled", "bench.steps=2",
            "sweep_name=slurm_run", f"results_dir={tmp_path}", "--poll=1"]
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=dict(slurm_cluster),
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    match = re.search(r"slurm job (\d+); run directory (\S+)", proc.stdout)
    assert match, proc.stdout
    job_id, run = match.group(1), Path(match.group(2))
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "COMPLETED", status
    assert json.loads((run / "slurm_job.json").read_text())["job_id"] == job_id  # it ran inside the job
    assert (run / f"slurm-{job_id}.out").exists() and not (run / "launch.log").exists()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    with open(run.parent / "summary.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["status"] == "COMPLETED" and float(row["tokens_per_s"]) > 0
    assert f"{run.name}: COMPLETED" in proc.stdout
    # Followed live as a local run is: rank 0's step lines, read from the run directory while the job ran,
    # each the very line the rank printed into the job's log, before the run's final line.
    echoed = [line.split("] ", 1)[1] for line in proc.stdout.splitlines() if line.startswith(f"[{run.name}] [step ")]
    logged = [line for line in (run / f"slurm-{job_id}.out").read_text().splitlines() if line.startswith("[step ")]
    assert echoed and echoed == logged, proc.stdout
    assert "tokens/s" in echoed[-1]
    assert proc.stdout.index(echoed[-1]) < proc.stdout.index(f"{run.name}: COMPLETED")
    assert "(None)" not in proc.stdout
