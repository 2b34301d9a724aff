"""Slurm's own commands, run and parsed: sbatch, scancel, squeue, sacct (nothing else talks to Slurm)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Sequence


class SlurmError(RuntimeError):
    """A Slurm command failed; the message holds its stderr."""


def slurm_command(argv: Sequence[str], timeout: float = 60) -> str:
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} not found on PATH: is this a Slurm login node (or `make slurm-up` run)?")
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise SlurmError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def sbatch(script: Path) -> str:
    """Submit a script (its #SBATCH lines hold every option); return the job id."""
    out = slurm_command(["sbatch", "--parsable", str(script)])
    return out.strip().split(";")[0]


def scancel(job_keys: Sequence[str]) -> None:
    if job_keys:
        slurm_command(["scancel", *job_keys])


def squeue_jobs(job_ids: Sequence[str]) -> List[Dict[str, Any]]:
    """The given jobs (array ids cover their tasks) as slurmctld still holds them, finished ones included.

    Only these ids are asked for: a controller shared by every user answers one sweep's jobs, not the
    whole queue. 22.05 ignores `--jobs` under `--json` and answers every job; callers index by id either
    way. An id slurmctld has already forgotten makes squeue fail ("Invalid job id"): none is held then.
    """
    if not job_ids:
        return []
    try:
        out = slurm_command(["squeue", f"--jobs={','.join(sorted(set(job_ids)))}", "--json"])
    except SlurmError as error:
        if "Invalid job id" in str(error):
            return []
        raise
    return json.loads(out)["jobs"]


SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "DerivedExitCode", "NodeList", "Start", "End")


def sacct_rows(job_ids: Sequence[str]) -> List[Dict[str, str]]:
    """Finished jobs from accounting (`sacct`), else from the job-completion file (`sacct -c`).

    `--json` is avoided: 22.05.8 misreports exit codes there. `sacct -c` lists array tasks by raw job
    id only; the accounting database also as `A_i`. Empty when neither source is configured.
    """
    if not job_ids:
        return []
    base = ["sacct", "-n", "-P", "-j", ",".join(job_ids), "-o", ",".join(SACCT_FIELDS)]
    for argv in (base, [*base[:1], "-c", "-S", "2000-01-01", *base[1:]]):
        try:
            out = slurm_command(argv)
        except SlurmError:
            continue
        rows = [dict(zip(SACCT_FIELDS, line.split("|"))) for line in out.splitlines() if line.strip()]
        if rows:
            return rows
    return []
