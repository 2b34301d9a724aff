"""`harness sync`: finds the offline runs below a sweep and hands them to `wandb sync` (dry run here)."""

from __future__ import annotations

import os
import subprocess
import sys

from harness import REPO_ROOT
from harness.config.schema import TrackingConfig
from harness.report.wandb_sync import offline_runs
from harness.runtime.sinks import WandbRun, wandb_environment, wandb_group


def _offline_run(run_dir, monkeypatch):
    for key, value in wandb_environment(run_dir, TrackingConfig()).items():
        monkeypatch.setenv(key, value)
    run = WandbRun(run_dir, TrackingConfig(), name="r", group=wandb_group("grid", run_dir), job_type="deepspeed",
                   config={"plan": {"world_size": 2}}, tags=["deepspeed", "dp2"])
    run.log_step({"step": 1, "loss": 5.0})
    run.finish({})
    assert run.error is None, run.error
    return run


def test_runs_sit_in_run_wandb_and_wandb_sync_dry_run_finds_them(tmp_path, monkeypatch):
    run_dir = tmp_path / "grid" / "20261123-101010" / "000-a"
    run = _offline_run(run_dir, monkeypatch)
    assert run.group == "grid-20261123-101010"
    (found,) = offline_runs([tmp_path])
    assert found.parent == (run_dir / "wandb").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    direct = subprocess.run([str(REPO_ROOT / ".venv/bin/wandb") if (REPO_ROOT / ".venv/bin/wandb").exists()
                             else "wandb", "sync", "--dry-run", str(run_dir / "wandb")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert "Would sync 1 run(s)" in direct.stdout + direct.stderr
    ours = subprocess.run([sys.executable, "-m", "harness.cli", "sync", str(tmp_path), "--dry-run"], cwd=REPO_ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert ours.returncode == 0 and "Would sync 1 run(s)" in ours.stdout + ours.stderr


def test_sync_without_runs_says_so(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness.cli", "sync", str(tmp_path)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no offline W&B run" in out.stderr
