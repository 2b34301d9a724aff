"""`harness tune` on the real local Slurm cluster (2 nodes x 2 ranks), tiny Llama, K=2: both recommended layouts run,
the deepspeed factors are refitted into a new profile beside the host's (which is left as it was), and the
transcript names the recommended, the measured best and the factors with their error before and after."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from harness.plan.engine_factors import FACTOR_RANGE
from harness.plan.hardware import cpu_profile_name, load_profile, profile_path
from tests.slurm.test_sweep_slurm import REPO

pytestmark = pytest.mark.slurm


def test_tune_runs_the_top_two_and_writes_a_refitted_profile(slurm_cluster, tmp_path):
    env = {**slurm_cluster, "HARNESS_CONFIG_DIR": str(tmp_path / "config"), "PYTHONPATH": str(REPO)}
    name = f"tunetest{os.getpid()}"
    host = profile_path(cpu_profile_name())
    host_before = host.read_bytes() if host.exists() else None
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "tune", "--global-batch", "8", "--top", "2",
                           "--name", name, "model=tiny_llama", "engine=deepspeed", "cluster=local_slurm",
                           "cluster.nodes=2", "layout.seq_len=64", "tracking=disabled", "bench.warmup_steps=2",
                           "bench.steps=3", f"results_dir={tmp_path / 'results'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    out = proc.stdout
    written = re.search(r"wrote profile (\S+)", out)
    try:
        assert proc.returncode == 0, out + proc.stderr
        assert len(re.findall(r"^  #\d deepspeed .* measured [\d,]+ tokens/s", out, re.M)) == 2, out
        factors = re.search(r"engine factors deepspeed: compute 1\.000 -> ([\d.]+), comm 1\.000 -> ([\d.]+); "
                            r"median .* over [23] run\(s\): ([\d.]+)% before, ([\d.]+)% after", out)
        assert factors, out
        assert float(factors.group(4)) <= float(factors.group(3))  # the refit fits these runs at least as well
        assert "re-ranked top: deepspeed" in out and "measured best (the pick): deepspeed" in out
        profile = load_profile(written.group(1))
        assert profile is not None and profile.name == f"{cpu_profile_name()}-{name}"
        fitted = profile.engine_factors["deepspeed"]
        assert fitted == pytest.approx({"compute": float(factors.group(1)), "comm": float(factors.group(2))},
                                       abs=1e-3)
        assert all(FACTOR_RANGE[0] <= v <= FACTOR_RANGE[1] for v in fitted.values())
        assert (host.read_bytes() if host.exists() else None) == host_before
    finally:
        if written:
            os.unlink(written.group(1))
