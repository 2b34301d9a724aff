"""What a job script brings with it, whatever the submitting shell had: the project's bin directory on PATH
(its ninja), a created TORCH_EXTENSIONS_DIR; and the time limit's warning signal, handed by the node's supervisor
to the ranks (not to the launcher) with the task exiting as the launcher does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.config.compose import compose_run_config
from harness.engines.rendered import RenderedRun
from harness.launch.sbatch import supervised
from harness.launch.slurm import group_runs, node_command, render_job_script
from harness.plan.time_limit import warning_lead_s
from harness.rundir import PLAN_FILE, write_json

VENV_BIN = str(Path(sys.executable).parent)
# What a job's launcher sees: the ninja on its PATH and whether TORCH_EXTENSIONS_DIR is set and writable.
PROBE = ("import json, os, shutil; d = os.environ.get('TORCH_EXTENSIONS_DIR'); json.dump({'ninja': shutil.which("
         "'ninja'), 'ext': d, 'writable': bool(d) and os.access(d, os.W_OK)}, open('seen.json', 'w'))")


def stub_slurm(tmp_path: Path) -> Path:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "scontrol").write_text('#!/bin/bash\nif [[ $2 == hostnames ]]; then echo n1; else echo "NodeAddr=127.0.0.1"; fi\n')
    (stubs / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nSLURM_NODEID=0 exec "$@"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    return stubs


def test_a_job_from_a_bare_shell_sees_the_venv_and_a_torch_extensions_dir(tmp_path, monkeypatch):
    """The job runs under a PATH without the venv and no TORCH_EXTENSIONS_DIR (the submitting shell's, as
    --export=ALL hands it over); the ranks' launcher still finds the venv's ninja and a writable op cache."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rendered = RenderedRun(run_dir=str(run_dir), engine="deepspeed", launcher="torchrun", nnodes=1,
                           nproc_per_node=1, argv=[sys.executable, "-c", PROBE], env={})
    text = render_job_script(cfg, rendered)
    expected_dir = home / ".cache" / "harness" / "torch_extensions"
    assert f"export PATH={VENV_BIN}:\"$PATH\"" in text
    assert f"export TORCH_EXTENSIONS_DIR={expected_dir}" in text
    script = run_dir / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    bare = {"PATH": f"{stub_slurm(tmp_path)}:/usr/bin:/bin", "HOME": str(home),
            **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
            "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_CPUS_PER_TASK": "1"}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=bare, capture_output=True, text=True, timeout=120)
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen == {"ninja": f"{VENV_BIN}/ninja", "ext": str(expected_dir), "writable": True}, proc.stderr


def test_the_render_time_torch_extensions_dir_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ops"))
    cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled"])
    rendered = RenderedRun(run_dir=str(tmp_path), engine="deepspeed", launcher="torchrun", nnodes=1,
                           nproc_per_node=1, argv=["true"], env={})
    assert f"export TORCH_EXTENSIONS_DIR={tmp_path / 'ops'}\n" in render_job_script(cfg, rendered)


def test_env_setup_owns_path_but_the_op_cache_is_still_set(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled",
                              'launcher.env_setup=["source /shared/venv/bin/activate"]'])
    rendered = RenderedRun(run_dir=str(tmp_path), engine="deepspeed", launcher="torchrun", nnodes=1,
                           nproc_per_node=1, argv=["torchrun"], env={})
    text = render_job_script(cfg, rendered)
    assert "export PATH=" not in text and "export TORCH_EXTENSIONS_DIR=" in text


LAUNCHER = """
import subprocess, sys
open("launcher.started", "w").close()
import os
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, "RANK": "0"})
sys.exit(3 if rank.wait() == 0 else 4)
"""
# A rank that sets its handler two seconds after it starts (the inherited disposition ignores the signal until
# then), as a rank still importing torch does.
RANK = """
import signal, time
time.sleep(2)
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.05)
open("rank.warned", "w").write(str(len(got)))
"""


def test_the_warning_reaches_the_ranks_and_the_task_exits_as_its_launcher(tmp_path):
    """The node's task (what srun starts, the only process Slurm's --signal reaches: the node's supervisor)
    passes the warning to the ranks until the launcher ends, so a rank still starting gets it once its handler
    is set; the launcher, which would die of it, ignores it; the task exits with the launcher's code."""
    cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled"])
    command = node_command(supervised(cfg, tmp_path, [sys.executable, "-c", LAUNCHER, RANK]))
    task = subprocess.Popen(["bash", "-c", command], cwd=tmp_path)
    deadline = time.time() + 60
    while not (tmp_path / "launcher.started").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    task.send_signal(signal.SIGUSR1)  # once, before the rank listens
    assert task.wait(timeout=60) == 3  # the launcher lived through the signal and saw its rank exit 0
    assert (tmp_path / "rank.warned").read_text() == "1"


def test_an_array_asks_for_its_slowest_runs_lead(tmp_path):
    cfg = compose_run_config(["cluster=local_slurm", "launcher=slurm_local", "tracking=disabled"])
    runs = []
    for name, step_s in (("a", 2.0), ("b", 300.0), ("c", None)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        write_json(run_dir / PLAN_FILE, {"step_time_s": step_s})
        runs.append((run_dir, cfg, RenderedRun(run_dir=str(run_dir), engine="deepspeed", launcher="torchrun",
                                               nnodes=1, nproc_per_node=2, argv=["true"], env={})))
    (group,) = group_runs(runs)
    assert group.warning_lead_s == warning_lead_s(300.0) == 435
