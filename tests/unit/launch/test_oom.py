"""A host OOM kill (SIGKILL / 137 by a memory cgroup, the kernel, or Slurm's memory enforcement) is OOM with
its evidence, not FAILED: one rule (harness.launch.oom) for the local launcher, the watchdog's rank records,
the job-end hook and squeue / sacct."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from harness.launch import local, oom, slurm_commands, status
from harness.launch import slurm as slurm_mod
from harness.launch.oom import KillEvidence, host_oom
from harness.launch.watchdog import RankSeen, record_signal_deaths
from harness.rundir import read_errors, read_status, write_error, write_json, write_status

CGROUP_LINE = ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=19.0. Some of your processes may have "
               "been killed by the cgroup out-of-memory handler.")
# Measured on the local cluster in linuxproc mode (the job's log, in this order).
RSS_LINE = "slurmstepd-n1: error: StepId=19.0 exceeded memory limit (343859200 > 157286400), being killed"
RSS_LOG = f"{RSS_LINE}\nslurmstepd-n1: error: Exceeded job memory limit\nsrun: error: n1: task 0: Killed\n"
GIB = 2**30


@pytest.mark.parametrize("evidence, says", [
    (KillEvidence(slurm_state="OUT_OF_MEMORY", slurm_job="30"), "slurm job 30: OUT_OF_MEMORY"),
    (KillEvidence(signal=oom.SIG_OOM, slurm_job="20"), "SIG_OOM"),
    (KillEvidence(exit_code=137, slurmstepd_line=CGROUP_LINE), "Detected 1 oom-kill event(s)"),
    (KillEvidence(exit_code=137, slurmstepd_line=RSS_LINE), "exceeded memory limit"),
    (KillEvidence(exit_code=137, cgroup_oom_kills=2), "oom_kill count rose by 2"),
    (KillEvidence(signal=signal.SIGKILL, host_available=GIB // 2, host_total=24 * GIB), "0.50 of 24.00 GiB"),
    (KillEvidence(signal=None, host_available=GIB // 2, host_total=24 * GIB), "0.50 of 24.00 GiB"),
])
def test_each_kind_of_evidence_reads_as_host_oom(evidence, says):
    reason = host_oom(evidence)
    assert reason.startswith("out of memory (host): ") and says in reason, reason


@pytest.mark.parametrize("evidence", [
    KillEvidence(exit_code=137),  # a SIGKILL and nothing else: someone's kill -9, not proven OOM
    KillEvidence(signal=signal.SIGKILL, host_available=12 * GIB, host_total=24 * GIB),
    KillEvidence(exit_code=1, cgroup_oom_kills=1),  # an OOM kill elsewhere in the cgroup; this exited 1
    KillEvidence(signal=signal.SIGTERM, host_available=0, host_total=24 * GIB),
])
def test_other_endings_are_not_oom(evidence):
    assert host_oom(evidence) is None


def test_slurmstepd_line_only_from_slurmstepd(tmp_path):
    log = tmp_path / "slurm-19.out"
    log.write_text("[step 1/2] loss 10.1\nprint('exceeded memory limit') from the user's code\n")
    assert oom.slurmstepd_oom_line([tmp_path / "slurm-18.out", log]) == ""
    log.write_text(log.read_text() + "x" * 70000 + "\n" + CGROUP_LINE + "\nsrun: error: n1: task 0: Out Of Memory\n")
    assert oom.slurmstepd_oom_line([tmp_path / "slurm-18.out", log]) == CGROUP_LINE


@pytest.mark.parametrize("proc_cgroup, files", [
    ("4:memory:/slice/job\n0::/\n", {"memory/slice/job/memory.oom_control": "oom_kill_disable 0\noom_kill 2\n",
                                     "memory/slice/memory.oom_control": "oom_kill 1\n",
                                     "memory/memory.oom_control": "under_oom 0\noom_kill 0\n"}),
    ("0::/user.slice/run\n", {"user.slice/run/memory.events": "low 0\nmax 4\noom 3\noom_kill 3\n"}),
])
def test_cgroup_oom_kill_counters_v1_and_v2(tmp_path, proc_cgroup, files):
    (tmp_path / "cgroup").write_text(proc_cgroup)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    assert oom.cgroup_oom_kills(tmp_path / "cgroup", tmp_path / "fs") == 3
    assert oom.cgroup_oom_kills(tmp_path / "missing", tmp_path / "fs") == 0


def test_local_launcher_sigkilled_by_the_memory_cgroup(tmp_path):
    assert local.classify(tmp_path, 137)[0] == "FAILED"
    state, reason = local.classify(tmp_path, 137, oom_kills=1)
    assert state == "OOM" and "oom_kill count rose by 1" in reason and "code 137" in reason


def test_watchdog_rank_record_under_a_cgroup_limit_with_room_on_the_host(tmp_path):
    seen = RankSeen(pid=1, rank=2, last_alive=time.time(), rss=GIB, available=20 * GIB, exit_status=signal.SIGKILL)
    record_signal_deaths(tmp_path, [seen], 24 * GIB, oom_kills=1)
    (error,) = read_errors(tmp_path)
    assert error.out_of_memory and "oom_kill count rose by 1" in error.message
    assert local.classify(tmp_path, 1) == ("OOM", error.reason())


def run_dir(tmp_path: Path, job: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    write_status(run, "RUNNING")
    write_json(run / slurm_mod.SUBMISSION_FILE, {"job_key": job, "job_id": job, "array_job_id": None,
                                                 "array_task_id": None})
    return run


@pytest.mark.parametrize("line", [CGROUP_LINE, RSS_LINE])
def test_slurm_sigkill_with_slurmstepds_oom_line_is_oom(tmp_path, monkeypatch, line):
    """sacct says FAILED 137:0 / 0:9 (linuxproc mode: Slurm's RSS enforcement SIGKILLs the step); the
    job's own log holds slurmstepd's line, which becomes the evidence."""
    run = run_dir(tmp_path, "19")
    write_error(run, 0, RuntimeError("gloo: Connection closed by peer"))  # a peer's symptom
    sacct = "19|oom.000-deepspeed-single|FAILED|137:0|0:9|n1|2026-11-22T00:48:47|2026-11-22T00:48:50\n"
    monkeypatch.setattr(slurm_commands, "slurm_command",
                        lambda argv, timeout=60: '{"jobs": []}' if argv[0] == "squeue" else sacct)
    (view,) = status.refresh([run])
    assert view.state == "FAILED" and "Connection closed" in view.reason  # no evidence of memory: FAILED
    write_status(run, "RUNNING")
    (run / "slurm-19.out").write_text(f"[step 1/2] loss 10.3\n{line}\n" + (RSS_LOG if line == RSS_LINE else ""))
    (view,) = status.refresh([run])
    assert view.state == "OOM" and read_status(run).state == "OOM"
    assert view.reason == f"out of memory (host): slurm job 19: {line}"


def test_job_end_hook_reads_slurmstepds_oom_line(tmp_path, monkeypatch):
    run = run_dir(tmp_path, "77")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    (run / "slurm-77.out").write_text(CGROUP_LINE + "\n")
    slurm_mod.job_end(run, 137)
    assert read_status(run).state == "OOM" and "oom-kill" in read_status(run).reason
