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


def test_a_run_composed_into_a_folder_another_process_holds_writes_nothing_there(tmp_path):
    """The other `harness run` of the same second is stood in for by its claim and its files: Hydra composes
    the same folder for this run, which must leave them as they were and keep its own record in its claim."""
    held = tmp_path / "sweep" / "same-second"
    (held / ".hydra").mkdir(parents=True)
    claim_run_dir(held)
    theirs = {held / ".hydra" / "overrides.yaml": "- layout.zero_stage=1\n", held / "cli.log": "their log\n"}
    for path, text in theirs.items():
        path.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([*HARNESS, "run", "recipes=cpu_zero2", "layout.zero_stage=2", "launcher.timeout_s=3",
                    "tracking=disabled", f"hydra.run.dir={held}"], cwd=REPO_ROOT, env=env, capture_output=True,
                   timeout=120)
    assert {path: path.read_text() for path in theirs} == theirs
    assert sorted(path.name for path in held.iterdir()) == [".hydra", "claim.json", "cli.log"]
    ours = held.with_name("same-second-1")
    assert "layout.zero_stage=2" in (ours / ".hydra" / "overrides.yaml").read_text()
    assert f"[harness] {ours}: " in (ours / "cli.log").read_text()
