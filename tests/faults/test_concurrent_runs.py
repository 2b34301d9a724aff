"""Two runs started into one folder at once: each claims a run directory of its own, whole."""

import json
import os
import re
import subprocess
import sys

from harness import REPO_ROOT
from harness.rundir import claim_run_dir, run_dirs

HARNESS = [sys.executable, "-m", "harness.cli"]


def test_the_claim_is_exclusive(tmp_path):
    first, second = claim_run_dir(tmp_path / "run"), claim_run_dir(tmp_path / "run")
    assert (first, second) == (tmp_path / "run", tmp_path / "run-1")
    assert json.loads((first / "claim.json").read_text())["pid"] == os.getpid()


def test_two_runs_into_one_folder_in_the_same_second_keep_their_own_files(tmp_path):
    """The folder Hydra composes from the time to the second is forced to be the same for both."""
    folder = tmp_path / "sweep" / "same-second"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    runs = [subprocess.Popen([*HARNESS, "run", "recipes=cpu_zero2", f"layout.zero_stage={stage}",
                              "launcher.timeout_s=3", "tracking=disabled", f"hydra.run.dir={folder}"],
                             cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for stage in (1, 2)]  # fmt: skip
    outputs = [run.communicate(timeout=120)[0] for run in runs]
    dirs = run_dirs(tmp_path / "sweep")
    assert len(dirs) == 2, outputs
    stages = {}
    for run_dir in dirs:
        config = json.loads((run_dir / "config.json").read_text())
        ds_config = json.loads((run_dir / "ds_config.json").read_text())
        assert ds_config["zero_optimization"]["stage"] == config["layout"]["zero_stage"]
        stages[config["layout"]["zero_stage"]] = run_dir
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        assert f"layout.zero_stage={config['layout']['zero_stage']}" in overrides
    assert set(stages) == {1, 2}
    for stage, output in zip((1, 2), outputs):
        launched = re.search(r"--master_port[ =](\d+)", output)
        assert launched, output
        argv = json.loads((stages[stage] / "rendered.json").read_text())["argv"]
        assert argv[argv.index("--master_port") + 1] == launched.group(1)
