"""`harness run -m` names its run directories as `harness sweep` does: by the values that differ."""

import os
import subprocess
import sys

from harness import REPO_ROOT


def test_multirun_directories_are_named_by_what_differs(tmp_path):
    # bench.warmup_steps=1 is refused when each point is prepared, after Hydra made its directory: nothing
    # launches, and the directory names are what is under test.
    out = subprocess.run([sys.executable, "-m", "harness.cli", "run", "-m", "layout.zero_stage=1,3",
                          "bench.warmup_steps=1", "tracking=disabled", f"results_dir={tmp_path}"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 1, out.stderr
    names = sorted(path.name for path in tmp_path.glob("adhoc/*/*") if path.is_dir())
    # Before: both were `N-deepspeed-dp2_zero2`, the layout preset's name, whatever zero stage ran.
    assert names == ["000-zero1", "001-zero3"], names
    assert not any(tmp_path.rglob("rendered.json"))
