"""A run cut at the time limit's warning: its metrics.json, marked partial, is a TIMEOUT with the measurement
kept (the job-end hook, Slurm's view, the local launcher); the rank side stops together and says how far it got."""

from __future__ import annotations

import json
import os
import signal
import shutil
from pathlib import Path

from harness.launch import slurm as slurm_mod
from harness.launch.local import classify as classify_local
from harness.launch.status import SlurmView, classify, run_view
from harness.rundir import metrics_written, read_status, state_from_files, write_json, write_status
from tests.unit.report import synthetic_runs

PARTIAL = {"steps_measured": 3, "steps_planned": 10, "reason": "stopped at the time limit's warning, SIGUSR1"}
SUB = {"job_key": "41", "job_id": "41", "array_job_id": None, "array_task_id": None}


def cut_run(tmp_path: Path, state: str = "RUNNING") -> Path:
    run = tmp_path / "run"
    run.mkdir()
    write_status(run, state)
    # A well-formed metrics.json (status reads a run's files as the report does), marked partial.
    source = synthetic_runs.make_run(run / "elsewhere", "m", "COMPLETED")
    metrics = json.loads((source / "metrics.json").read_text())
    shutil.rmtree(run / "elsewhere")
    write_json(run / "metrics.json", {**metrics, "partial": PARTIAL})
    return run


def slurm_view(state: str) -> SlurmView:
    return SlurmView(job_id="41", state=state)


def test_a_partial_metrics_file_is_timeout_not_completed(tmp_path):
    run = cut_run(tmp_path)
    assert not metrics_written(run)
    state, reason = state_from_files(run)
    assert state == "TIMEOUT" and reason.startswith("partial measurement: 3 of 10 timed steps")


def test_the_job_end_hook_and_slurms_view_keep_it(tmp_path):
    run = cut_run(tmp_path)
    slurm_mod.job_end(run, 0)  # the ranks exited 0 after writing it
    assert read_status(run).state == "TIMEOUT"
    write_json(run / slurm_mod.SUBMISSION_FILE, SUB)
    for slurm_state in ("COMPLETED", "TIMEOUT", "FAILED"):
        view, _ = run_view(run, SUB, None, slurm_view(slurm_state), True)
        assert view.state == "TIMEOUT" and "partial measurement: 3 of 10" in view.reason, (slurm_state, view)
    assert classify(slurm_view("RUNNING"), False, [], partial="x")[0] == "RUNNING"  # still writing


def test_the_local_launcher_reads_it_the_same_way(tmp_path):
    run = cut_run(tmp_path)
    assert classify_local(run, 0)[0] == "TIMEOUT"


def test_the_rank_notes_the_warning_and_stops_after_the_step(monkeypatch):
    import harness.runtime.bench as bench
    from harness.runtime.lifecycle import WarningSignal

    previous = signal.getsignal(signal.SIGUSR1)
    try:
        warning = WarningSignal()
        assert not warning.received
        os.kill(os.getpid(), signal.SIGUSR1)
        assert warning.received
    finally:
        signal.signal(signal.SIGUSR1, previous)

    class Session:
        def train_step(self, batches):
            return 1.0

    class Timer:
        times_s = []

        def step(self):
            import contextlib

            self.times_s.append(0.1)
            return contextlib.nullcontext()

    losses, asked = [], []
    bench.timed_steps(Session(), lambda step: None, range(2, 12), Timer(), losses,
                      stop=lambda: asked.append(1) or len(asked) == 3)
    assert len(losses) == 3
    cfg = type("Cfg", (), {"bench": type("Bench", (), {"steps": 10})()})()
    assert bench.cut_short(3, cfg) == PARTIAL
    assert bench.cut_short(10, cfg) is None
