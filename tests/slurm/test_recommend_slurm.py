"""`harness recommend` writes recipes of its top choices and a sweep preset into the user's config directory, and its
printed `harness sweep` line, run as printed, verifies them on the real local Slurm cluster (2 nodes x 2 ranks):
every recommended layout runs to COMPLETED, with its prediction beside its measurement."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.slurm.test_sweep_slurm import REPO, harness, run_dirs, submitted_dir, watch

pytestmark = pytest.mark.slurm


def test_the_printed_sweep_runs_the_recommended_recipes_on_the_cluster(slurm_cluster, tmp_path):
    env = {**slurm_cluster, "HARNESS_CONFIG_DIR": str(tmp_path / "config")}
    name = f"recommended_slurm_test_{os.getpid()}"
    ranked = subprocess.run([sys.executable, "-m", "harness.cli", "recommend", "--global-batch", "8", "--top", "2",
                             "--name", name, "model=tiny_llama", "engine=deepspeed", "cluster=local_slurm",
                             "cluster.nodes=2", "layout.seq_len=64", "tracking=disabled", "bench.warmup_steps=2",
                             "bench.steps=3", f"results_dir={tmp_path / 'results'}"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ranked.returncode == 0, ranked.stdout + ranked.stderr
    assert "why #1 over #2:" in ranked.stdout and "ranked for launcher=slurm_local" in ranked.stdout
    printed = re.search(r"run them with: harness (sweep sweep=\S+)", ranked.stdout).group(1)
    submitted = harness(env, *shlex.split(printed), "--no-wait")  # the printed line, nothing added but --no-wait
    states = watch(env, submitted_dir(submitted))
    assert sorted(s["state"] for s in states.values()) == ["COMPLETED", "COMPLETED"], states
    for run in run_dirs(submitted_dir(submitted)):
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["predicted"]["step_time_s"] > 0 and metrics["measured"]["step_time_s"] > 0
        assert metrics["layout"]["name"].startswith(name)  # the run is the recipe the recommender wrote
