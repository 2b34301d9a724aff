"""`harness calibrate --slurm` on the real local Slurm cluster: one job across both nodes measures a profile
that the planner then uses for a cluster that names it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.config.compose import compose_run_config
from harness.plan.hardware import PROFILE_VERSION, load_profile
from harness.plan.planner import make_plan
from tests.slurm.test_sweep_slurm import REPO

pytestmark = pytest.mark.slurm


def test_one_job_across_two_nodes_writes_the_profile_the_planner_uses(slurm_cluster, tmp_path):
    out = tmp_path / "local-slurm.json"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "calibrate", "--slurm", "--nodes", "2",
                           "--tasks-per-node", "1", "--name", "local-slurm", "--out", str(out),
                           "--sbatch=--cpus-per-task=2"],
                          cwd=REPO, env=dict(slurm_cluster), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"cluster.profile={out}" in proc.stdout
    profile = load_profile(out)
    assert profile is not None and profile.version == PROFILE_VERSION
    assert profile.name == "local-slurm" and profile.source.startswith("measured:local-slurm")
    # two ranks, one per node: the links it fitted are those of a group spanning both nodes
    raw = json.loads(out.read_text())["raw"]
    assert raw["ranks"] == 2 and profile.gpus_per_node == 1
    assert set(profile.collective_links) == {"all_reduce", "all_gather", "reduce_scatter", "p2p"}
    assert profile.cores_per_node >= 2 and profile.measured_peak_flops > 0
    cfg = compose_run_config(["cluster=local_slurm", f"cluster.profile={out}", "cluster.nodes=2",
                              "cluster.accelerators_per_node=1"])
    plan = make_plan(cfg)
    assert plan.time_source == profile.source and plan.step_time_s > 0
