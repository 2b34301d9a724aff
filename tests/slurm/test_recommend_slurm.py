"""`harness recommend` writes a sweep preset of its top layouts, and `harness sweep` verifies them on the real
local Slurm cluster: every recommended layout runs to COMPLETED, with its prediction beside its measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm.test_sweep_slurm import REPO, harness, run_dirs, submitted_dir, watch

pytestmark = pytest.mark.slurm

CONFIG_DIR = REPO / "hydra_configs"


@pytest.fixture
def preset():
    """A preset name of this test's own; its files leave hydra_configs/ with the test."""
    name = f"recommended_slurm_test_{os.getpid()}"
    yield name
    for path in [CONFIG_DIR / "sweep" / f"{name}.yaml", *(CONFIG_DIR / "layout").glob(f"{name}_*.yaml")]:
        path.unlink(missing_ok=True)


def test_the_recommended_preset_runs_on_the_cluster(slurm_cluster, preset, tmp_path):
    env = dict(slurm_cluster)
    ranked = subprocess.run([sys.executable, "-m", "harness.cli", "recommend", "--global-batch", "8", "--top", "2",
                             "--name", preset, "model=tiny_llama", "engine=deepspeed", "cluster=local_slurm",
                             "layout.seq_len=64"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ranked.returncode == 0, ranked.stdout + ranked.stderr
    assert "why #1 beats #2:" in ranked.stdout and f"harness sweep sweep={preset}" in ranked.stdout
    layouts = sorted((CONFIG_DIR / "layout").glob(f"{preset}_*.yaml"))
    assert len(layouts) == 2
    submitted = harness(env, "sweep", f"sweep={preset}", "launcher=slurm_local", "tracking=disabled",
                        "bench.warmup_steps=2", "bench.steps=3", f"results_dir={tmp_path}", "--no-wait")
    states = watch(env, submitted_dir(submitted))
    assert sorted(s["state"] for s in states.values()) == ["COMPLETED", "COMPLETED"], states
    for run in run_dirs(submitted_dir(submitted)):
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["predicted"]["step_time_s"] > 0 and metrics["measured"]["step_time_s"] > 0
        # the run is the layout the recommender wrote (its layout file's name is the run's layout name)
        assert metrics["layout"]["name"].startswith(preset)
