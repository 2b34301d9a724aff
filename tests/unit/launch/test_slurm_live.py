"""A Slurm run followed as a local one is: its step lines from the run directory's progress.jsonl, each
state change with Slurm's pending reason in words, the sweep's bar and ETA; an unreachable Slurm said
once, with doctor's hint. Slurm's answers are recorded `squeue --json` records, replayed."""

from __future__ import annotations

import io
import itertools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.doctor import slurm_facts
from harness.launch import slurm_commands
from harness.launch import sweep as sweep_mod
from harness.launch.slurm_reasons import pending_reason
from harness.launch.status import SlurmView, classify
from harness.launch.sweep_progress import SweepProgress
from harness.rundir import write_json, write_status
from harness.runtime.progress import PROGRESS_FILE, StepRecord
from tests.unit.launch.test_slurm_status import write_measured

REPO = Path(__file__).resolve().parents[3]
# What sinfo, squeue and sbatch print on stderr (exit 1) with no SLURM_CONF and no /etc/slurm (22.05.8).
NO_CONFIG = """\
{cmd}: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host
{cmd}: error: fetch_config: DNS SRV lookup failed
{cmd}: error: _establish_config_source: failed to fetch config
{cmd}: fatal: Could not establish a configuration source
"""


def squeue(state: str, reason: str, job_id: int = 8) -> dict:
    return {"job_id": job_id, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
            "job_state": state, "state_reason": reason, "exit_code": 0, "derived_exit_code": 0,
            "restart_cnt": 0, "start_time": 1795308600 if state != "PENDING" else 0, "end_time": 0}


@pytest.mark.parametrize("reason,words", [
    ("None", "waiting for the scheduler"),
    ("", "waiting for the scheduler"),
    ("Priority", "waiting for jobs of higher priority to start first (Slurm reason Priority)"),
    ("Resources", "waiting for enough free nodes, CPUs or memory (Slurm reason Resources)"),
    ("QOSMaxJobsPerUserLimit", "waiting until earlier jobs of the same user or account end"),
])
def test_pending_reasons_are_words_never_none_in_brackets(reason, words):
    state, said = classify(SlurmView.from_squeue(squeue("PENDING", reason)), False, [])
    assert state == "PENDING" and words in said and "(None)" not in said
    assert said == f"slurm job 8 pending: {pending_reason(reason)}"


def fake_slurm(tmp_path: Path, monkeypatch) -> Path:
    """sinfo, squeue and sbatch that fail as Slurm's do without a configuration; SLURM_CONF unset."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in ("sinfo", "squeue", "sbatch", "sacct"):
        script = bin_dir / cmd
        script.write_text(f"#!/bin/sh\ncat >&2 <<'END'\n{NO_CONFIG.format(cmd=cmd)}END\nexit 1\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return bin_dir


def test_unreachable_slurm_is_one_line_with_doctors_hint(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch)
    line = slurm_commands.check_reachable()
    assert line.startswith("Slurm is not reachable") and "SLURM_CONF" in line and "\n" not in line
    assert "resolve_ctls_from_dns_srv" not in line
    (fact,) = slurm_facts()
    assert fact.detail == line, "doctor says the same line"


@pytest.mark.integration
def test_run_without_slurm_conf_says_it_once_before_submitting(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch)
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "launcher=slurm_local",
                           "cluster=local_slurm", "tracking=disabled"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert out.count("Slurm is not reachable") == 1, out
    assert "resolve_ctls_from_dns_srv" not in out and "Could not establish" not in out, out


def submitted(root: Path, name: str, job_id: int) -> Path:
    run = root / name
    run.mkdir(parents=True)
    write_status(run, "PENDING")
    write_json(run / "slurm.json", {"job_key": str(job_id), "job_id": str(job_id), "array_job_id": None,
                                    "array_task_id": None, "submitted": 1795308500.0})
    return run


def test_a_followed_slurm_sweep_shows_step_lines_reasons_bar_and_eta(tmp_path, monkeypatch):
    run = submitted(tmp_path, "000-deepspeed-single", 8)
    steps = [StepRecord(1, 2, True, 5.5, None, None, None, 2**20), StepRecord(2, 2, False, 5.4, 0.03, 8000.0, 0.02, 2**20)]

    def job_writes_its_steps():
        with open(run / PROGRESS_FILE, "a") as out:
            out.write(steps[0].json_line())
        yield [squeue("RUNNING", "None")]
        with open(run / PROGRESS_FILE, "a") as out:
            out.write(steps[1].json_line())
        write_measured(run)
        yield [squeue("COMPLETED", "None")]

    # Lazily: the job writes each step only once the harness has seen the answer before it.
    answers = itertools.chain([[squeue("PENDING", "None")], [squeue("PENDING", "Priority")]], job_writes_its_steps())
    monkeypatch.setattr(slurm_commands, "squeue_jobs", lambda ids: next(answers))
    from rich.console import Console

    out = io.StringIO()
    with SweepProgress(1, 0, console=Console(file=out, width=200)) as progress:
        (view,) = sweep_mod.wait_for([run], poll_s=0.01, progress=progress, follow_s=0.005)
    text = out.getvalue()
    assert view.state == "COMPLETED"
    lines = [line.strip() for line in text.splitlines()]
    assert "[harness] 000-deepspeed-single: PENDING [slurm PENDING] slurm job 8 pending: waiting for the scheduler" in lines
    assert any("waiting for jobs of higher priority to start first (Slurm reason Priority)" in line for line in lines)
    assert f"[000-deepspeed-single] {steps[0].line()}" in lines and f"[000-deepspeed-single] {steps[1].line()}" in lines
    assert "(None)" not in text
    assert any(line.startswith("[harness] 1 done, 0 failed, 0 pruned, 0 remaining | elapsed") and "ETA 0:00:00" in line
               for line in lines), text


def test_no_wait_prints_the_watch_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sweep_mod, "submit_slurm", lambda *args: [])
    opts = sweep_mod.Options(wait=False)
    assert sweep_mod.launch(tmp_path, [], "slurm", "grid", opts, report=None) == 0
    assert f"`harness sweep status --watch {tmp_path}`" in capsys.readouterr().out


def test_watch_counts_runs_that_ended_before_and_follows_the_rest(tmp_path, monkeypatch, capsys):
    done = submitted(tmp_path, "000-a", 7)
    write_measured(done)
    (done / PROGRESS_FILE).write_text(StepRecord(1, 1, False, 9.9, 0.5, 1.0, None, None).json_line())
    going = submitted(tmp_path, "001-b", 8)
    step = StepRecord(1, 1, False, 5.0, 0.02, 100.0, None, None)

    def answers():
        yield [squeue("COMPLETED", "None", 7), squeue("RUNNING", "None", 8)]
        (going / PROGRESS_FILE).write_text(step.json_line())
        write_measured(going)
        yield [squeue("COMPLETED", "None", 7), squeue("COMPLETED", "None", 8)]

    replies = answers()
    monkeypatch.setattr(slurm_commands, "squeue_jobs", lambda ids: next(replies))
    views = sweep_mod.follow([done, going], poll_s=0.01)
    out = capsys.readouterr().out
    assert [v.state for v in views] == ["COMPLETED", "COMPLETED"]
    assert "loss 9.9000" not in out, "a run that ended before the watch began is not replayed"
    assert f"[001-b] {step.line()}" in out
    assert "[harness] 2 done, 0 failed, 0 pruned, 0 remaining" in out
