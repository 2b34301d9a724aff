"""Run states from recorded `squeue --json` / `sacct -c` output (Slurm 22.05.8, the local cluster) and the
run directory's own files; the in-job hooks; only the run's own status.json is ever written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.launch import slurm as slurm_mod
from harness.launch import slurm_commands
from harness.launch import status as status_mod
from harness.launch.status import SlurmIndex, SlurmView, classify, classify_files, refresh, run_view, task_ids
from harness.rundir import RankError, read_status, write_error, write_json, write_status
from tests.unit.report import synthetic_runs

def write_measured(run: Path) -> None:
    """A well-formed metrics.json (status reads a run's files as the report does: `{}` is a corrupt one)."""
    source = synthetic_runs.make_run(run / "elsewhere", "m", "COMPLETED")
    (run / "metrics.json").write_bytes((source / "metrics.json").read_bytes())
    shutil.rmtree(run / "elsewhere")


# Recorded from `squeue --json` on the local cluster (trimmed to the fields the harness reads).
SQUEUE = {
    "array_task_completed": {"job_id": 7, "array_job_id": 6, "array_task_id": 0, "array_task_string": "",
                             "job_state": "COMPLETED", "state_reason": "None", "exit_code": 0,
                             "derived_exit_code": 0, "restart_cnt": 0, "start_time": 1795308258,
                             "end_time": 1795308302},
    "array_task_failed": {"job_id": 11, "array_job_id": 9, "array_task_id": 1, "array_task_string": "",
                          "job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 256,
                          "derived_exit_code": 256, "restart_cnt": 0, "start_time": 1795308375,
                          "end_time": 1795308441},
    "array_pending_rest": {"job_id": 1, "array_job_id": 1, "array_task_id": None, "array_task_string": "1-2%1",
                           "job_state": "PENDING", "state_reason": "JobArrayTaskLimit", "exit_code": 0,
                           "derived_exit_code": 0, "restart_cnt": 0, "start_time": 0, "end_time": 0},
    "array_cancelled_rest": {"job_id": 4, "array_job_id": 4, "array_task_id": None, "array_task_string": "1-3%1",
                             "job_state": "CANCELLED", "state_reason": "JobArrayTaskLimit", "exit_code": 0,
                             "derived_exit_code": 0, "restart_cnt": 0, "start_time": 1795307997,
                             "end_time": 1795307997},
    "job_cancelled_running": {"job_id": 18, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
                              "job_state": "CANCELLED", "state_reason": "None", "exit_code": 15,
                              "derived_exit_code": 256, "restart_cnt": 0, "start_time": 1795308503,
                              "end_time": 1795308508},
    # linuxproc mode, over --mem: SIGKILL by RSS polling; srun exits 137; derived 0:9.
    "job_mem_killed_linuxproc": {"job_id": 19, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
                                 "job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 35072,
                                 "derived_exit_code": 9, "restart_cnt": 0, "start_time": 1795308527,
                                 "end_time": 1795308530},
    # cgroup mode, a step over --mem: srun exits 1, the step's SIG_OOM (253) shows in derived_exit_code.
    "job_step_oom_cgroup": {"job_id": 20, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
                            "job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 256,
                            "derived_exit_code": 253, "restart_cnt": 0, "start_time": 1795308540,
                            "end_time": 1795308547},
    # As the findings record them (batch-step OOM in cgroup mode, time limit, node failure + requeue).
    "job_batch_oom_cgroup": {"job_id": 30, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
                             "job_state": "OUT_OF_MEMORY", "state_reason": "OutOfMemory", "exit_code": 0,
                             "derived_exit_code": 0, "restart_cnt": 0},
    "job_timeout": {"job_id": 31, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
                    "job_state": "TIMEOUT", "state_reason": "TimeLimit", "exit_code": 0, "derived_exit_code": 0,
                    "restart_cnt": 0},
    "job_requeued_after_node_fail": {"job_id": 32, "array_job_id": 0, "array_task_id": None,
                                     "array_task_string": "", "job_state": "PENDING", "state_reason": "BeginTime",
                                     "exit_code": 0, "derived_exit_code": 0, "restart_cnt": 1},
    "job_node_fail": {"job_id": 33, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
                      "job_state": "NODE_FAIL", "state_reason": "NodeDown", "exit_code": 0, "derived_exit_code": 0,
                      "restart_cnt": 0},
    "job_running": {"job_id": 34, "array_job_id": 0, "array_task_id": None, "array_task_string": "",
                    "job_state": "RUNNING", "state_reason": "None", "exit_code": 0, "derived_exit_code": 0,
                    "restart_cnt": 0, "start_time": 1795308600, "end_time": 1795312200},
}
# Recorded `sacct -c -n -P -o JobID,JobName,State,ExitCode,DerivedExitCode,NodeList,Start,End` lines.
SACCT = """\
11|failres.array-001|FAILED|1:0|1:0|n1|2026-11-22T00:46:15|2026-11-22T00:47:21
18|cancelme.000-deepspeed-single|CANCELLED|0:0|0:0|n1|2026-11-22T00:48:23|2026-11-22T00:48:28
19|oom.000-deepspeed-single|FAILED|137:0|0:9|n1|2026-11-22T00:48:47|2026-11-22T00:48:50
20|oom.000-deepspeed-single|FAILED|1:0|0:125|n1|2026-11-22T00:49:00|2026-11-22T00:49:07
7|cpu_grid.array-001|COMPLETED|0:0|0:0|n1|2026-11-22T00:44:18|2026-11-22T00:45:02
40|x|CANCELLED by 0|0:0|0:0|n1|2026-11-22T00:50:00|2026-11-22T00:50:01
"""
SACCT_ROWS = [dict(zip(slurm_mod.SACCT_FIELDS, line.split("|"))) for line in SACCT.splitlines()]
OOM_ERROR = {"rank": 1, "type": "OutOfMemoryError", "message": "CUDA out of memory", "out_of_memory": True}
RANK_ERROR = {"rank": 0, "type": "FileNotFoundError", "message": "no such file", "out_of_memory": False}


def view(name: str) -> SlurmView:
    return SlurmView.from_squeue(SQUEUE[name])


@pytest.mark.parametrize("record,metrics,errors,state,reason", [
    ("array_task_completed", True, [], "COMPLETED", ""),
    ("array_task_completed", False, [], "FAILED", "exited 0 but no metrics.json"),
    ("array_task_failed", False, [RANK_ERROR], "FAILED", "rank 0: FileNotFoundError"),
    ("array_task_failed", False, [], "FAILED", "exit code 1"),
    ("job_cancelled_running", False, [RANK_ERROR], "CANCELLED", "cancelled"),  # errors follow from scancel
    ("job_cancelled_running", True, [], "COMPLETED", ""),  # measured before the cancel: kept
    ("job_timeout", False, [RANK_ERROR], "TIMEOUT", "time limit"),
    ("job_batch_oom_cgroup", False, [], "OOM", "OUT_OF_MEMORY"),
    ("job_step_oom_cgroup", False, [], "OOM", "SIG_OOM"),
    ("array_task_failed", False, [RANK_ERROR, OOM_ERROR], "OOM", "rank 1: OutOfMemoryError"),
    ("job_mem_killed_linuxproc", False, [], "FAILED", "SIGKILL"),  # no structured OOM signal in this mode
    ("job_node_fail", False, [], "FAILED", "NODE_FAIL and not requeued"),
    ("job_requeued_after_node_fail", False, [], "PENDING", "requeued (1x)"),
    ("array_pending_rest", False, [], "PENDING", "JobArrayTaskLimit"),
    ("job_running", False, [], "RUNNING", "running"),
])
def test_classify_recorded_squeue(record, metrics, errors, state, reason):
    got_state, got_reason = classify(view(record), metrics, [RankError.from_dict(e) for e in errors])
    assert got_state == state
    assert reason in got_reason


@pytest.mark.parametrize("job_id,state,reason", [
    ("11", "FAILED", "exit code 1"),
    ("18", "CANCELLED", "cancelled"),
    ("19", "FAILED", "SIGKILL"),
    ("20", "OOM", "SIG_OOM"),
    ("40", "CANCELLED", "cancelled"),
])
def test_classify_recorded_sacct(job_id, state, reason):
    row = next(r for r in SACCT_ROWS if r["JobID"] == job_id)
    got_state, got_reason = classify(SlurmView.from_sacct(row), False, [])
    assert (got_state, reason in got_reason) == (state, True), got_reason


def test_exit_codes_decode_both_ways():
    assert (view("job_mem_killed_linuxproc").exit_status, view("job_mem_killed_linuxproc").derived_signal) == (137, 9)
    assert view("job_cancelled_running").exit_signal == 15
    assert view("job_step_oom_cgroup").derived_signal == 125
    row = SlurmView.from_sacct(SACCT_ROWS[3])
    assert (row.exit_status, row.derived_signal, row.start is not None) == (1, 125, True)


def test_array_task_strings():
    assert task_ids("1-3%1") == [1, 2, 3]
    assert task_ids("2,4-8:2%3") == [2, 4, 6, 8]
    assert task_ids("5") == [5] and task_ids("") == []


def test_index_finds_tasks_pending_remainders_and_jobs():
    index = SlurmIndex(SQUEUE.values())
    assert index.squeue_view({"array_job_id": "6", "array_task_id": 0}).state == "COMPLETED"
    pending = index.squeue_view({"array_job_id": "1", "array_task_id": 2})
    assert (pending.state, pending.job_id, pending.reason) == ("PENDING", "1_2", "JobArrayTaskLimit")
    assert index.squeue_view({"array_job_id": "4", "array_task_id": 3}).state == "CANCELLED"
    assert index.squeue_view({"array_job_id": "1", "array_task_id": 7}) is None
    assert index.squeue_view({"job_id": "18", "array_job_id": None}).state == "CANCELLED"
    assert index.squeue_view({"job_id": "99", "array_job_id": None}) is None
    # sacct -c knows array tasks by raw id only; the job record written inside the job holds it.
    index.add_sacct(SACCT_ROWS)
    submission = {"array_job_id": "9", "array_task_id": 1, "job_id": None}
    assert index.sacct_view(submission, None) is None
    record = {"job_id": "11", "array_job_id": "9", "array_task_id": "1"}
    assert index.sacct_view(submission, record).state == "FAILED"
    stale = {"job_id": "11", "array_job_id": "5", "array_task_id": "1"}  # an older attempt's record
    assert index.sacct_view(submission, stale) is None


def make_run(root: Path, name: str, state: str = "PENDING", submission=None) -> Path:
    run = root / name
    run.mkdir(parents=True)
    write_status(run, state)
    if submission:
        write_json(run / slurm_mod.SUBMISSION_FILE, submission)
    return run


def test_run_view_rules(tmp_path):
    sub = {"job_key": "34", "job_id": "34", "array_job_id": None, "array_task_id": None}
    # Never submitted (a dry run) and pruned runs are shown as their files say.
    dry = make_run(tmp_path, "dry")
    assert run_view(dry, None, None, None, True)[0].reason == "not submitted"
    # The rank wrote COMPLETED while Slurm still shows the job running: the run said so first.
    done = make_run(tmp_path, "done", "COMPLETED", sub)
    write_measured(done)
    v, write = run_view(done, sub, None, view("job_running"), True)
    assert (v.state, write, v.settled) == ("COMPLETED", False, False)
    # A final state written by the job-end hook is refined by what only Slurm knows.
    hook = make_run(tmp_path, "hook", "FAILED", sub)
    v, write = run_view(hook, sub, None, view("job_step_oom_cgroup"), True)
    assert (v.state, write) == ("OOM", True)
    # A requeued job is PENDING again, whatever the interrupted attempt wrote.
    requeued = make_run(tmp_path, "requeued", "FAILED", sub)
    v, _ = run_view(requeued, sub, {"restart_count": 0}, view("job_requeued_after_node_fail"), True)
    assert v.state == "PENDING"
    # Submitted, not final, and unknown to squeue and sacct: lost, written FAILED so resume retries it.
    lost = make_run(tmp_path, "lost", "RUNNING", sub)
    v, write = run_view(lost, sub, None, None, True)
    assert (v.state, write) == ("FAILED", True) and "no longer knows" in v.reason
    # ... but not when Slurm could not be asked.
    assert run_view(lost, sub, None, None, False)[0].state == "RUNNING"


def test_refresh_writes_only_final_states_into_each_runs_own_file(tmp_path, monkeypatch):
    ok = make_run(tmp_path, "000-ok", "RUNNING", {"job_key": "6_0", "array_job_id": "6", "array_task_id": 0})
    write_measured(ok)
    bad = make_run(tmp_path, "001-bad", "RUNNING", {"job_key": "9_1", "array_job_id": "9", "array_task_id": 1})
    write_error(bad, 0, FileNotFoundError("no such file"))
    queued = make_run(tmp_path, "002-queued", "PENDING", {"job_key": "1_2", "array_job_id": "1", "array_task_id": 2})
    # Forgotten by squeue, found in sacct -c through the raw id the job recorded.
    old = make_run(tmp_path, "003-old", "RUNNING", {"job_key": "50_0", "array_job_id": "50", "array_task_id": 0})
    write_json(old / slurm_mod.JOB_RECORD_FILE, {"job_id": "20", "array_job_id": "50", "array_task_id": "0"})
    asked = []
    monkeypatch.setattr(slurm_commands, "squeue_jobs", lambda ids: list(SQUEUE.values()))
    monkeypatch.setattr(slurm_commands, "sacct_rows", lambda keys: asked.extend(keys) or SACCT_ROWS)
    before = {p: p.stat().st_mtime_ns for p in queued.iterdir()}
    views = {v.run_dir.name: v for v in refresh([ok, bad, queued, old])}
    assert {k: v.state for k, v in views.items()} == {
        "000-ok": "COMPLETED", "001-bad": "FAILED", "002-queued": "PENDING", "003-old": "OOM"}
    assert read_status(bad).state == "FAILED" and "FileNotFoundError" in read_status(bad).reason
    assert read_status(old).state == "OOM"
    assert read_status(ok).state == "COMPLETED"  # metrics.json and a finished job
    assert {p: p.stat().st_mtime_ns for p in queued.iterdir()} == before
    assert "50_0" in asked and "20" in asked


def test_job_hooks(tmp_path, monkeypatch):
    run = make_run(tmp_path, "run", "FAILED")
    write_error(run, 0, RuntimeError("first attempt"))
    (run / "metrics.json").write_text("{}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "70")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    write_json(run / "slurm.json", {"job_key": "70_3", "attempt": 1, "history": []})
    slurm_mod.job_start(run)
    # A requeue by Slurm (SLURM_RESTART_COUNT=1) is the run's next attempt; the interrupted one is history.
    submission = json.loads((run / "slurm.json").read_text())
    assert submission["attempt"] == 2 and submission["history"] == [
        {"job_key": "70_3", "state": "REQUEUED", "files": "attempts/1",
         "reason": "requeued by Slurm (restart 1: node failure or preemption)"}]
    # The earlier attempt's measurement and errors are set aside, never mixed with this attempt's.
    assert not (run / "metrics.json").exists() and not (run / "errors").exists()
    assert (run / "attempts" / "1" / "metrics.json").exists() and (run / "attempts" / "1" / "errors").is_dir()
    record = json.loads((run / "slurm_job.json").read_text())
    assert (record["job_id"], record["array_task_id"], record["restart_count"]) == ("77", "3", 1)
    assert read_status(run).to_dict() == {**read_status(run).to_dict(), "state": "RUNNING", "reason": "slurm job 70_3 on n[1-2]"}
    slurm_mod.job_end(run, 137)
    status = read_status(run).to_dict()
    assert status["state"] == "FAILED" and "SIGKILL" in status["reason"] and "slurm-77.out" in status["reason"]


def test_classify_files_from_the_runs_own_records(tmp_path):
    run = make_run(tmp_path, "run")
    assert classify_files(run, 1)[0] == "FAILED"
    write_error(run, 1, MemoryError("host"))
    assert classify_files(run, 1)[0] == "OOM"
    (run / "metrics.json").write_text("{}")
    assert classify_files(run, 0) == ("COMPLETED", "")


def test_timing_line():
    views = [status_mod.RunView(Path("a"), "COMPLETED", "", "1", "COMPLETED", 100.0, 130.0),
             status_mod.RunView(Path("b"), "COMPLETED", "", "2", "COMPLETED", 110.0, 150.0)]
    line = status_mod.timing(views, [95.0, 95.0])
    assert "grid wall time 55 s" in line and "sum to 70 s" in line
    # A running job's end in squeue is its start plus its time limit: it does not count until it ends.
    running = status_mod.RunView(Path("c"), "RUNNING", "", "3", "RUNNING", 120.0, 720.0)
    line = status_mod.timing([*views, running], [95.0, 95.0, 95.0])
    assert "grid wall time 55 s" in line and "sum to 70 s" in line and "1 more not finished" in line
    assert status_mod.timing([running], [95.0]) is None


def test_a_job_sbatch_resubmitted_by_hand_is_followed(tmp_path, monkeypatch):
    """The sweep's job (9_1) failed; the user ran `sbatch <run>/job.sbatch` (job 34, running): the
    run follows job 34, and the old failure does not overwrite the running attempt's status."""
    run = make_run(tmp_path, "run", "RUNNING", {"job_key": "9_1", "array_job_id": "9", "array_task_id": 1})
    write_json(run / slurm_mod.JOB_RECORD_FILE, {"job_id": "34", "array_job_id": None, "array_task_id": None})
    monkeypatch.setattr(slurm_commands, "squeue_jobs", lambda ids: list(SQUEUE.values()))
    (view,) = refresh([run])
    assert (view.state, view.job_key, view.slurm_state) == ("RUNNING", "34", "RUNNING")
    assert read_status(run).state == "RUNNING"


def test_squeue_asks_only_for_the_sweeps_own_jobs(tmp_path, monkeypatch):
    """One squeue per look, filtered by the sweep's job ids (each array once, a job re-submitted by hand
    too); an id slurmctld has forgotten ('Invalid job id') leaves sacct to answer."""
    runs = [make_run(tmp_path, "a", "RUNNING", {"job_key": "9_0", "array_job_id": "9", "array_task_id": 0}),
            make_run(tmp_path, "b", "RUNNING", {"job_key": "9_1", "array_job_id": "9", "array_task_id": 1}),
            make_run(tmp_path, "c", "PENDING", {"job_key": "12", "job_id": "12", "array_job_id": None,
                                               "array_task_id": None}),
            make_run(tmp_path, "d", "RUNNING", {"job_key": "50_0", "array_job_id": "50", "array_task_id": 0}),
            make_run(tmp_path, "never-submitted")]
    write_json(runs[3] / slurm_mod.JOB_RECORD_FILE, {"job_id": "34", "array_job_id": None, "array_task_id": None})
    calls = []

    def fake(argv, timeout=60):
        calls.append(list(argv))
        return json.dumps({"jobs": list(SQUEUE.values())})

    monkeypatch.setattr(slurm_commands, "slurm_command", fake)
    refresh(runs)
    assert calls[0] == ["squeue", "--jobs=12,34,9", "--json"]
    assert [call[0] for call in calls].count("squeue") == 1
    asked = len(calls)
    assert refresh([runs[-1]]) == refresh([runs[-1]], query_slurm=False)  # nothing submitted: nothing asked
    assert len(calls) == asked

    def forgotten(argv, timeout=60):
        calls.append(list(argv))
        if argv[0] == "squeue":
            raise slurm_commands.SlurmError("squeue exited 1: slurm_load_jobs error: Invalid job id specified")
        return "12|j|COMPLETED|0:0|0:0|n1|2026-01-01T00:00:00|2026-01-01T00:01:00\n"

    monkeypatch.setattr(slurm_commands, "slurm_command", forgotten)
    (view,) = refresh([make_run(tmp_path, "e", "PENDING", {"job_key": "12", "job_id": "12", "array_job_id": None,
                                                          "array_task_id": None})])
    assert calls[-1][:2] == ["sacct", "-n"] and view.slurm_state == "COMPLETED"


def test_status_is_polled_every_30_s_by_default():
    from harness.commands.sweep import parse_args
    from harness.launch.sweep import POLL_S

    assert POLL_S == 30.0 and parse_args([]).poll_s == POLL_S and parse_args(["--poll=1"]).poll_s == 1.0


# Recorded from `squeue --json` on the local cluster: `--cpus-per-task=64` where nodes have 4 CPUs.
NEVER = {"job_id": 6, "array_job_id": 0, "array_task_id": None, "array_task_string": "", "job_state": "PENDING",
         "state_reason": "PartitionConfig", "exit_code": 0, "derived_exit_code": 0, "restart_cnt": 0,
         "start_time": 0, "end_time": 0}


def test_a_job_that_can_never_start_fails_with_the_reason_in_words_and_is_cancelled(tmp_path, monkeypatch):
    sub = {"job_key": "6", "job_id": "6", "array_job_id": None, "array_task_id": None}
    run = make_run(tmp_path, "never", "PENDING", sub)
    cancelled = []
    monkeypatch.setattr(slurm_commands, "squeue_jobs", lambda ids: [NEVER])
    monkeypatch.setattr(slurm_commands, "scancel", cancelled.extend)
    (seen,) = refresh([run])
    assert seen.state == "FAILED" and seen.settled
    assert "can never start" in seen.reason and "exceeds what the partition's nodes have" in seen.reason
    assert read_status(run).state == "FAILED" and cancelled == ["6"]
    # Once Slurm shows the cancellation, the run keeps its reason (it is not a user's scancel).
    monkeypatch.setattr(slurm_commands, "squeue_jobs", lambda ids: [{**NEVER, "job_state": "CANCELLED"}])
    (seen,) = refresh([run])
    assert seen.state == "FAILED" and "can never start" in read_status(run).reason
    # A damaged run is settled once its job ended: following it would otherwise never end.
    assert status_mod.RunView(run, "CORRUPT", "", "6", "COMPLETED").settled
    assert not status_mod.RunView(run, "CORRUPT", "", "6", "RUNNING").settled
    # A job only waiting for room is left waiting.
    waiting = make_run(tmp_path, "waiting", "PENDING", sub)
    monkeypatch.setattr(slurm_commands, "squeue_jobs", lambda ids: [{**NEVER, "state_reason": "Resources"}])
    assert refresh([waiting])[0].state == "PENDING" and read_status(waiting).state == "PENDING"


@pytest.mark.parametrize("reason, never", [("PartitionConfig", True), ("QOSMaxCpuPerJobLimit", True),
                                           ("AssocMaxNodePerJobLimit", True), ("Priority", False),
                                           ("QOSMaxJobsPerUserLimit", False), ("ReqNodeNotAvail", False)])
def test_never_starting_reasons(reason, never):
    from harness.launch.slurm_reasons import never_starts

    assert (never_starts(reason) is not None) == never


# A two-node job waiting for its nodes: NEVER's record with the reason and request squeue --json gives then.
REQ_NODE = {**NEVER, "state_reason": "ReqNodeNotAvail", "partition": "debug", "node_count": 2,
            "required_nodes": "", "excluded_nodes": ""}
# `sinfo -N -h -o '%N|%R|%T|%E'` on the local cluster, and as it reads with n2 drained by an administrator.
SINFO_FINE = "n1|debug|idle|none\nn2|debug|idle|none\n"
SINFO_DRAINED = "n1|debug|idle|none\nn2|debug|drained|maintenance\n"


def fake_slurm(monkeypatch, jobs, sinfo, calls):
    def fake(argv, timeout=60):
        calls.append(argv[0])
        if argv[0] == "squeue":
            return json.dumps({"jobs": jobs})
        assert argv[0] == "sinfo", argv
        return sinfo[0]

    monkeypatch.setattr(slurm_commands, "slurm_command", fake)
    monkeypatch.setattr(slurm_commands, "scancel", lambda keys: calls.append(("scancel", *keys)))


def test_req_node_not_avail_fails_only_once_too_few_nodes_stay_unusable_past_the_grace(tmp_path, monkeypatch):
    from harness.launch.job_records import NODES_SHORT_SINCE, read_submission
    from harness.launch.slurm_reasons import NODES_GRACE_S

    sub = {"job_key": "6", "job_id": "6", "array_job_id": None, "array_task_id": None}
    run = make_run(tmp_path, "run", "PENDING", sub)
    other = make_run(tmp_path, "other", "PENDING", {**sub, "job_key": "7", "job_id": "7"})
    sinfo, calls = [SINFO_FINE], []
    fake_slurm(monkeypatch, [REQ_NODE, {**REQ_NODE, "job_id": 7}], sinfo, calls)
    t0 = 1_000_000.0
    # Both nodes usable: only busy or reserved for a while, so it waits (one sinfo for both jobs).
    assert [v.state for v in refresh([run, other], now=t0)] == ["PENDING", "PENDING"]
    assert calls == ["squeue", "sinfo"] and NODES_SHORT_SINCE not in read_submission(run)
    # n2 drained: too few usable nodes, but within the grace (a node may come back by itself).
    sinfo[0] = SINFO_DRAINED
    assert refresh([run], now=t0 + 60)[0].state == "PENDING"
    assert read_submission(run)[NODES_SHORT_SINCE] == t0 + 60
    assert refresh([run], now=t0 + 60 + NODES_GRACE_S - 1)[0].state == "PENDING"
    # n2 back: the clock is reset, and a new drain starts a new grace.
    sinfo[0] = SINFO_FINE
    assert refresh([run], now=t0 + 60 + NODES_GRACE_S)[0].state == "PENDING"
    assert NODES_SHORT_SINCE not in read_submission(run)
    sinfo[0] = SINFO_DRAINED
    assert refresh([run], now=t0 + 2 * NODES_GRACE_S)[0].state == "PENDING"
    assert read_status(run).state == "PENDING" and ("scancel", "6") not in calls
    # Past the grace: FAILED with the nodes in words, and the job cancelled.
    (seen,) = refresh([run], now=t0 + 3 * NODES_GRACE_S)
    assert seen.state == "FAILED" and seen.settled and ("scancel", "6") in calls
    assert ("can never start: it needs 2 nodes of partition debug, only 1 usable: n2 drained (maintenance), "
            f"for {NODES_GRACE_S / 60:.0f} min (Slurm reason ReqNodeNotAvail)") in read_status(run).reason
    # No job waiting for nodes: sinfo is not asked.
    calls.clear()
    fake_slurm(monkeypatch, [{**REQ_NODE, "job_id": 7, "state_reason": "Resources"}], sinfo, calls)
    assert refresh([other], now=t0)[0].state == "PENDING" and calls == ["squeue"]


@pytest.mark.parametrize("asked, sinfo, words", [
    ({"node_count": 1, "required_nodes": "n3"}, SINFO_FINE,
     "it asks for node n3 by name: n3 does not exist in partition debug"),
    ({"node_count": 1, "required_nodes": "n[1-2]"}, "n1|debug|idle|none\nn2|debug|down*|Not responding\n",
     "it asks for nodes n1,n2 by name: n2 down and not responding (Not responding)"),
    ({"node_count": 2, "excluded_nodes": "n1"}, SINFO_FINE, "only 1 usable: n1 excluded by the job (--exclude)"),
])
def test_req_node_not_avail_by_name_and_excluded(asked, sinfo, words):
    from harness.launch.slurm_commands import SINFO_FIELDS
    from harness.launch.slurm_reasons import NODES_GRACE_S, nodes_never_come

    nodes = [dict(zip(SINFO_FIELDS, line.split("|", 3))) for line in sinfo.splitlines()]
    job = {**REQ_NODE, **asked}
    assert nodes_never_come(job, nodes, None, 100.0) == (100.0, None)
    since, never = nodes_never_come(job, nodes, 100.0, 100.0 + NODES_GRACE_S)
    assert since == 100.0 and words in never


def test_node_states_and_host_lists():
    from harness.launch.slurm_reasons import hostnames, node_problem

    assert hostnames("n[1-3,7],gpu[08-10],login") == ["n1", "n2", "n3", "n7", "gpu08", "gpu09", "gpu10", "login"]
    usable = ["idle", "mixed", "allocated", "completing", "idle~", "idle#", "reserved", "planned"]
    assert [node_problem({"state": s, "reason": "none"}) for s in usable] == [None] * len(usable)
    assert node_problem({"state": "draining", "reason": "bad gpu"}) == "draining (bad gpu)"
    assert node_problem({"state": "idle*", "reason": "none"}) == "idle and not responding"
    assert node_problem({"state": "future", "reason": ""}) == "future"


def test_a_run_line_never_pairs_a_final_state_with_a_lagging_slurm_state(tmp_path):
    from harness.launch.sweep import run_line
    from harness.launch.status import RunView

    lagging = run_line(RunView(tmp_path / "000-a", "COMPLETED", "", "1_0", "RUNNING"))
    assert lagging == "[harness] 000-a: COMPLETED"
    # Slurm's own final state, or a run still going, is shown as it is
    assert run_line(RunView(tmp_path / "000-a", "FAILED", "rank 0 exited 1", "1_0", "FAILED")) == \
        "[harness] 000-a: FAILED [slurm FAILED] rank 0 exited 1"
    assert run_line(RunView(tmp_path / "000-a", "RUNNING", "", "1_0", "RUNNING")) == \
        "[harness] 000-a: RUNNING [slurm RUNNING]"
