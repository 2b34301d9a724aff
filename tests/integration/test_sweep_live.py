"""A local sweep through the real CLI: each run's step lines, the sweep's counts and ETA."""

import json
import os
import subprocess
import sys

import pytest

from harness import REPO_ROOT

pytestmark = pytest.mark.integration


def test_local_sweep_shows_steps_and_counts(results_root):
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "sweep", "engine=deepspeed,fsdp", "layout.zero_stage=1",
         "bench.steps=2", "tracking=disabled", f"results_dir={results_root / 'sweep_live'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    (log,) = (results_root / "sweep_live").rglob("000-*/launch.log")
    steps = [line for line in log.read_text().splitlines() if line.startswith("[step ")]
    total = json.loads((log.parent / "metrics.json").read_text())["measured"]["warmup_steps"] + 2  # until steady
    assert len(steps) == total and steps[-1].startswith(f"[step {total}/{total}] loss "), steps
    assert "1 done, 0 failed, 1 pruned, 0 remaining" in out and "ETA 0:00:00" in out
