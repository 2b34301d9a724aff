"""A job submitted from a bare shell (PATH without the project's venv, no TORCH_EXTENSIONS_DIR; sbatch's
--export=ALL hands the job that shell's environment) still runs its launcher with the venv's ninja on PATH and
a writable TORCH_EXTENSIONS_DIR: the job script sets both itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.compose import compose_run_config
from harness.engines.rendered import RenderedRun
from harness.launch.sbatch import render_job_script
from tests.slurm.conftest import SlurmCLI
from tests.unit.launch.test_job_environment import PROBE

pytestmark = pytest.mark.slurm



def test_a_job_from_a_bare_shell_sees_the_venv_and_the_op_cache(slurm_cluster, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rendered = RenderedRun(run_dir=str(run_dir), engine="deepspeed", launcher="torchrun", nnodes=1,
                           nproc_per_node=1, argv=[sys.executable, "-c", PROBE], env={})
    (run_dir / "job.sbatch").write_text(render_job_script(cfg, rendered))
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SLURM_CONF": slurm_cluster["SLURM_CONF"],
            "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    submitted = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], env=bare, check=True,
                               capture_output=True, text=True)
    job_id = int(submitted.stdout.strip().split(";")[0])
    # The job ends before the next test looks at the cluster (whose nodes it expects idle).
    SlurmCLI(slurm_cluster).wait_state(job_id, timeout=180)
    assert (run_dir / "seen.json").exists(), [p.read_text() for p in run_dir.glob("slurm-*.out")]
    seen = json.loads((run_dir / "seen.json").read_text())
    expected = home / ".cache" / "harness" / "torch_extensions"
    assert seen == {"ninja": f"{Path(sys.executable).parent}/ninja", "ext": str(expected), "writable": True}
