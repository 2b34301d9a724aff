"""Out of memory on the host: the one rule that tells a kill by an OOM killer (the kernel's, a memory
cgroup's, or Slurm's memory enforcement) from any other kill, with the evidence, for local runs (a rank
the watchdog saw die, the launcher's exit) and Slurm jobs (the job-end hook, squeue / sacct) alike.

The OOM killer sends SIGKILL and leaves no record of its own in the killed process; what tells it apart:
- Slurm's view: the job state OUT_OF_MEMORY, or a step that ended with Slurm's SIG_OOM;
- slurmstepd's own line in the job's output (`slurm-<job>.out`): "Detected N oom-kill event(s)" (memory
  cgroup) or "exceeded memory limit (... > ...), being killed" (jobacct_gather's RSS enforcement, the
  only trace of it in linuxproc mode, where the step ends with a plain SIGKILL);
- the memory cgroup's `oom_kill` counter (cgroup v2 `memory.events`, v1 `memory.oom_control`, Linux
  4.13+) rising while the run ran: a container's or a systemd slice's limit, not the host's;
- the host itself nearly out of memory when the process died.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional

from harness.rundir import slurm_log

SIGKILL = 9
# Slurm's SIG_OOM (253) is what a step killed by the memory cgroup exits with; exit codes carry the
# signal in 7 bits, so it shows as signal 125 (DerivedExitCode 0:125 in cgroup mode, measured).
SIG_OOM = 253 & 0x7F
# A SIGKILL while the host had less than this fraction of its memory available reads as the kernel's OOM
# killer (it sends SIGKILL, and only under memory pressure).
OOM_AVAILABLE_FRACTION = 0.10
# slurmstepd's lines (src/slurmd/slurmstepd, src/plugins/jobacct_gather/common/common_jag.c, 22.05), e.g.
# "slurmstepd-n1: error: StepId=1.0 exceeded memory limit (343859200 > 157286400), being killed" (measured
# on the local cluster in linuxproc mode; the step then ends 0:9, srun exits 137).
SLURMSTEPD_OOM = re.compile(r"slurmstepd[^:]*: error: .*(oom-kill event|exceeded (job |step )?memory limit)",
                            re.IGNORECASE)
LOG_TAIL_BYTES = 1 << 16  # slurmstepd writes its line at the step's end: the tail of the log holds it
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class KillEvidence:
    """What is known about how a process, a step or a job ended. `signal` None: unknown (a process seen
    gone without its exit status, which may have been a SIGKILL); 0: not ended by a signal."""

    signal: Optional[int] = 0
    exit_code: Optional[int] = None  # as a shell or srun reports it: 128 + signal for a killed child
    slurm_state: str = ""
    slurm_job: str = ""
    slurmstepd_line: str = ""
    cgroup_oom_kills: int = 0  # rise of the memory cgroup's oom_kill counter over the run
    host_available: Optional[int] = None  # bytes, at the last sample before the death
    host_total: Optional[int] = None

    @property
    def maybe_sigkill(self) -> bool:
        return self.signal in (None, SIGKILL) or self.exit_code in (128 + SIGKILL, -SIGKILL)


def host_oom(evidence: KillEvidence) -> Optional[str]:
    """'out of memory (host): <evidence>' when an OOM killer ended it, else None."""
    job = f"slurm job {evidence.slurm_job}: " if evidence.slurm_job else ""
    if evidence.slurm_state == "OUT_OF_MEMORY":
        return f"out of memory (host): {job}OUT_OF_MEMORY (over its --mem, killed by the memory cgroup)"
    if evidence.signal == SIG_OOM:
        return f"out of memory (host): {job}a step was killed by the memory cgroup (exit signal {SIG_OOM} = SIG_OOM)"
    if evidence.slurmstepd_line:
        return f"out of memory (host): {job}{evidence.slurmstepd_line.strip()}"
    if not evidence.maybe_sigkill:
        return None
    if evidence.cgroup_oom_kills > 0:
        return (f"out of memory (host): {job}SIGKILL while the memory cgroup's oom_kill count rose by "
                f"{evidence.cgroup_oom_kills}")
    available, total = evidence.host_available, evidence.host_total
    if available is not None and total and available < OOM_AVAILABLE_FRACTION * total:
        return (f"out of memory (host): {job}SIGKILL with {available / 2**30:.2f} of {total / 2**30:.2f} GiB "
                "of host memory available (the kernel's OOM killer sends SIGKILL)")
    return None


def slurmstepd_oom_line(logs: Iterable[Path]) -> str:
    """slurmstepd's OOM line in the tail of the first log that has one ('' when none does)."""
    for path in logs:
        try:
            with open(path, "rb") as handle:
                handle.seek(max(0, handle.seek(0, 2) - LOG_TAIL_BYTES))
                tail = handle.read().decode("utf-8", "replace")
        except OSError:
            continue
        for line in tail.splitlines():  # the first: "exceeded memory limit (used > limit)" comes first
            if SLURMSTEPD_OOM.search(line):
                return line
    return ""


def job_logs(run_dir: Path, job_ids: Iterable[Optional[str]]) -> List[Path]:
    """The run's `slurm-<id>.out` of the given raw job ids (the template's --output), in that order."""
    return [Path(run_dir) / slurm_log(job) for job in job_ids if job]


def _memory_cgroup_files(proc_cgroup: str, root: Path) -> List[Path]:
    """This process's memory cgroup and its ancestors: the counter files that exist (v1 and v2)."""
    files = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            base, name = root, "memory.events"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.oom_control"
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            candidate = base.joinpath(*parts[:depth], name)
            if candidate.is_file():
                files.append(candidate)
    return files


def cgroup_oom_kills(proc_cgroup_file: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> int:
    """The OOM kills counted in this process's memory cgroup and its ancestors (0 when not readable)."""
    try:
        files = _memory_cgroup_files(proc_cgroup_file.read_text(), root)
    except (OSError, ValueError):
        return 0
    total = 0
    for path in files:
        try:
            match = re.search(r"^oom_kill (\d+)$", path.read_text(), re.MULTILINE)
        except OSError:
            continue
        total += int(match.group(1)) if match else 0
    return total
