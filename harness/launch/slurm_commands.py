"""Slurm's own commands, run and parsed: sbatch, scancel, squeue, sacct, sinfo (nothing else talks to Slurm)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence


class SlurmError(RuntimeError):
    """A Slurm command failed; the message holds its stderr."""


def slurm_command(argv: Sequence[str], timeout: float = 60) -> str:
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} not found on PATH: is this a Slurm login node (or `make slurm-up` run)?")
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        unreachable = unreachable_line(proc.stderr)
        if unreachable:
            raise SlurmError(unreachable)
        raise SlurmError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


# What every Slurm client prints when it finds no configuration (no SLURM_CONF, no /etc/slurm/slurm.conf,
# no DNS SRV record: slurm/src/common/fetch_config.c) or no controller answers (slurm_protocol_api.c).
NO_CONFIG = "Could not establish a configuration source"
NO_CONTROLLER = "Unable to contact slurm controller"


def unreachable_line(stderr: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """One line saying why Slurm cannot be reached and what to do, or None when `stderr` (any Slurm
    command's) is another failure. `harness doctor` says the same line."""
    environ = os.environ if environ is None else environ
    conf = environ.get("SLURM_CONF")
    if NO_CONFIG in stderr:
        where = (f"SLURM_CONF={conf} holds no usable slurm.conf" if conf else
                 "SLURM_CONF is unset and this machine has no slurm.conf")
        return (f"Slurm is not reachable: {where}; export SLURM_CONF=PATH/slurm.conf "
                "(`make slurm-up` prints it for the local cluster)")
    if NO_CONTROLLER in stderr:
        return (f"Slurm is not reachable: no slurmctld answers{f' (SLURM_CONF={conf})' if conf else ''}; "
                "`sinfo` says more (`make slurm-up` starts the local cluster)")
    return None


def check_reachable(timeout: float = 30) -> Optional[str]:
    """None when Slurm's controller answers `sinfo`; else the one line saying why not (asked once,
    before anything is submitted)."""
    try:
        slurm_command(["sinfo", "-h", "-o", "%P"], timeout=timeout)
    except SlurmError as error:
        return str(error)
    except subprocess.TimeoutExpired:
        return f"Slurm is not reachable: sinfo did not answer in {timeout:.0f} s"
    return None


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


SINFO_FIELDS = ("node", "partition", "state", "reason")


def sinfo_nodes() -> List[Dict[str, str]]:
    """Every node of every partition, one row per (node, partition): its state as sinfo prints it
    (`drained`, `down*`, `idle~`: the suffix is part of the state) and the reason an administrator or
    slurmctld gave (`none` when there is none). The reason comes last: it is free text."""
    out = slurm_command(["sinfo", "-N", "-h", "-o", "%N|%R|%T|%E"])
    return [dict(zip(SINFO_FIELDS, line.split("|", 3))) for line in out.splitlines() if line.strip()]


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
