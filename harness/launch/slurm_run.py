"""`harness run` with a Slurm backend: the run is submitted as a one-point grid (its own job.sbatch, the
template `harness sweep` uses), then followed until its job ends, its step lines as a local run's;
Ctrl-C cancels the job."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Tuple

from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun
from harness.launch.job_records import read_submission
from harness.launch.points import Point, record_sweep
from harness.launch.sbatch import ScriptValueRejected
from harness.launch.slurm_commands import SlurmError, scancel
from harness.launch.sweep import submit_slurm, wait_for, watch_command
from harness.rundir import CANCELLED, FAILED, read_status, write_status


def run_on_slurm(run_dir: Path, cfg: RunConfig, rendered: RenderedRun, wait: bool, poll_s: float,
                 overrides: List[str], say: Callable[[str], None] = print) -> Tuple[str, str]:
    """(state, reason) of one prepared run submitted to Slurm: final when `wait`, else as submitted.

    The run's folder becomes a sweep of one (sweep.json), so `harness sweep status|resume|cancel` follow
    and mend it like any sweep's point. An interrupt scancels the job, marks the run CANCELLED, re-raises.
    """
    run_dir = Path(run_dir)
    sweep_dir = run_dir.parent
    record_sweep(sweep_dir, cfg.sweep_name, cfg.launcher.backend, overrides, run_dir.name)
    try:
        submit_slurm(sweep_dir, [Point(run_dir, overrides, cfg, rendered)], cfg.sweep_name, dry_run=False)
    except ScriptValueRejected as error:  # a value that cannot go into job.sbatch: nothing was submitted
        write_status(run_dir, FAILED, f"not submitted: {error}")
        return FAILED, f"not submitted: {error}"
    submission = read_submission(run_dir)
    if submission is None:  # sbatch refused the job; the run's status says why
        status = read_status(run_dir)
        return status.state, status.reason
    job = submission["job_key"]
    say(f"[harness] slurm job {job}; run directory {run_dir}")
    if not wait:
        say(f"[harness] submitted; follow with `{watch_command(sweep_dir)}`")
        return read_status(run_dir).state, f"submitted as slurm job {job}"
    try:
        (view,) = wait_for([run_dir], poll_s, say=say)
    except KeyboardInterrupt:
        cancel_job(run_dir, job, say)
        raise
    return view.state, view.reason


def cancel_job(run_dir: Path, job: str, say: Callable[[str], None]) -> None:
    """scancel the run's job and mark the run CANCELLED (the job cannot say so once it is killed)."""
    try:
        scancel([job])
        reason = f"interrupted: slurm job {job} cancelled (scancel)"
    except SlurmError as error:
        reason = f"interrupted; scancel {job} failed: {error}"
    write_status(run_dir, CANCELLED, reason)
    say(f"[harness] {run_dir.name}: {CANCELLED} {reason}")

