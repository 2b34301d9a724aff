"""Where each run of a sweep stands: its own files (status, metrics, rank errors) read with Slurm's view.

The ranks and the job's hooks write what they know (RUNNING, COMPLETED with metrics.json, a rank's
error with its `out_of_memory` flag, the launcher's exit code). What only Slurm knows (still queued,
requeued, time limit, scancel, memory-limit kill, node failure) comes from `squeue --jobs=<the sweep's
job ids> --json` and, once squeue has forgotten a job, `sacct`. Only final states are written back, and
only into the run's own `status.json`. The one log line ever read is slurmstepd's own out-of-memory line
in the job's `slurm-<job>.out` (harness.launch.oom): in linuxproc mode nothing else tells Slurm's
memory-limit kill from any other SIGKILL.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from harness.launch import slurm_commands
from harness.launch.job_records import NODES_SHORT_SINCE, note_nodes_short, read_job_record, read_submission
from harness.launch.oom import SIG_OOM, SIGKILL, KillEvidence, host_oom, job_logs, slurmstepd_oom_line
from harness.launch.slurm_reasons import REQ_NODE_NOT_AVAIL, never_starts, nodes_never_come, pending_reason
from harness.rundir.vocabulary import header
from harness.rundir import (
    CANCELLED,
    COMPLETED,
    CORRUPT,
    FAILED,
    FINAL_STATES,
    OOM,
    PENDING,
    PRUNED,
    RUNNING,
    TIMEOUT,
    RankError,
    metrics_written,
    partial_measurement,
    rank_failure,
    read_run,
    read_status,
    slurm_log,
    state_from_files,
    write_status,
)
from harness.terminal import print_fitted

# Slurm job states (22.05 names) by what they mean for a run.
SLURM_WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                           "SUSPENDED", "STOPPED", "RESIZING"})
SLURM_ACTIVE = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"})
SLURM_FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                         "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT"})


@dataclass(frozen=True)
class SlurmView:
    """One job (or array task) as Slurm reports it, from squeue --json or a sacct row."""

    job_id: str
    state: str
    reason: str = ""
    exit_status: int = 0
    exit_signal: int = 0
    derived_status: int = 0
    derived_signal: int = 0
    restart_count: int = 0
    start: Optional[float] = None  # epoch seconds
    end: Optional[float] = None
    # What the job asks of the nodes (squeue --json), for a ReqNodeNotAvail job's nodes_never_come.
    nodes_asked: Mapping[str, Any] = field(default_factory=dict, compare=False)
    never: str = ""  # why it will never start, learnt from outside squeue's reason (sinfo's node states)

    @property
    def final(self) -> bool:
        return self.state in SLURM_FINAL

    @classmethod
    def from_squeue(cls, record: Mapping[str, Any]) -> "SlurmView":
        state = record.get("job_state")
        state = state[0] if isinstance(state, list) else state  # later releases print a list
        exit_status, exit_signal = _wait_status(record.get("exit_code"))
        derived_status, derived_signal = _wait_status(record.get("derived_exit_code"))
        return cls(str(record.get("job_id")), str(state), str(record.get("state_reason") or ""), exit_status,
                   exit_signal, derived_status, derived_signal, int(record.get("restart_cnt") or 0),
                   _epoch(record.get("start_time")), _epoch(record.get("end_time")),
                   {key: record.get(key) for key in ("partition", "node_count", "required_nodes", "excluded_nodes")})

    @classmethod
    def from_sacct(cls, row: Mapping[str, str]) -> "SlurmView":
        exit_status, exit_signal = _colon_pair(row.get("ExitCode", ""))
        derived_status, derived_signal = _colon_pair(row.get("DerivedExitCode", ""))
        state = (row.get("State") or "").split(" ")[0]  # "CANCELLED by 0"
        return cls(row.get("JobID", ""), state, "", exit_status, exit_signal, derived_status, derived_signal, 0,
                   _iso_epoch(row.get("Start")), _iso_epoch(row.get("End")))


def _epoch(value: Any) -> Optional[float]:
    if isinstance(value, dict):  # the shape of later releases' JSON (not met on 22.05)
        value = value.get("number") if value.get("set", True) else None
    return float(value) if value else None


def _iso_epoch(text: Optional[str]) -> Optional[float]:
    try:
        return datetime.datetime.fromisoformat(text).timestamp() if text else None
    except ValueError:  # "Unknown", "None"
        return None


def _wait_status(raw: Any) -> Tuple[int, int]:
    """squeue --json reports the raw wait status: exit status << 8 | signal."""
    if isinstance(raw, dict):  # the shape of later releases' JSON (not met on 22.05)
        return int(raw.get("return_code") or 0), int((raw.get("signal") or {}).get("id") or 0)
    raw = int(raw or 0)
    return (raw >> 8) & 0xFF, raw & 0x7F


def _colon_pair(text: str) -> Tuple[int, int]:
    try:
        status, signal = text.split(":")
        return int(status), int(signal)
    except ValueError:
        return 0, 0


def classify_files(run_dir: Path, returncode: int) -> Tuple[str, str]:
    """Final state from the run's own files and srun's exit code (the job-end hook; no Slurm query)."""
    from_files = state_from_files(run_dir)
    if from_files is not None and from_files[0] != FAILED:
        return from_files
    job = os.environ.get("SLURM_JOB_ID")
    log = slurm_log(job or "<job id>")
    line = slurmstepd_oom_line(job_logs(run_dir, [job]))
    oom = host_oom(KillEvidence(exit_code=returncode, slurmstepd_line=line))
    if oom:
        return OOM, oom + (f"; {from_files[1]}" if from_files else "")
    if from_files is not None:
        return from_files
    how = f"srun exited with code {returncode}"
    if returncode == 128 + SIGKILL:
        how += " (a task was SIGKILLed: also how Slurm without the memory cgroup enforces --mem)"
    return FAILED, f"{how} and no metrics.json was written (see {log})"


def classify(view: SlurmView, has_metrics: bool, errors: Sequence[RankError],
             slurmstepd_line: str = "", partial: str = "") -> Tuple[str, str]:
    """A run's state from Slurm's view of its job and the run's own files.

    Precedence: a measurement (metrics.json) is COMPLETED whatever happened after it; then what Slurm
    did to the job (scancel, time limit) — rank errors are only its consequences; then out-of-memory,
    from a rank's error record or on the host (harness.launch.oom: OUT_OF_MEMORY, a step that ended with
    SIG_OOM, slurmstepd's oom-kill or memory-limit line in the job's log); then a rank's error; then how
    Slurm saw the job end. A partial measurement (`partial`: the ranks stopped at the time limit's warning
    and wrote the steps they finished) is TIMEOUT, with the measurement kept, once the job has ended.
    """
    if has_metrics:
        return COMPLETED, ""
    if view.state in SLURM_WAITING:
        never = never_starts(view.reason) or view.never
        if never:
            return FAILED, f"slurm job {view.job_id} can never start: {never}; the harness cancelled it"
        requeued = f"requeued ({view.restart_count}x), " if view.restart_count else ""
        return PENDING, f"{requeued}slurm job {view.job_id} {view.state.lower()}: {pending_reason(view.reason)}"
    if view.state in SLURM_ACTIVE:
        return RUNNING, f"slurm job {view.job_id} {view.state.lower()}"
    if partial:
        return TIMEOUT, f"slurm job {view.job_id} {view.state}: {partial}"
    if view.state == "CANCELLED":
        return CANCELLED, f"slurm job {view.job_id} was cancelled (scancel)"
    if view.state in ("TIMEOUT", "DEADLINE"):
        return TIMEOUT, f"slurm job {view.job_id} reached its time limit ({view.state})"
    failure = rank_failure(errors)
    if failure is not None and failure[0] == OOM:
        return failure
    signals = (view.exit_signal, view.derived_signal)
    oom = host_oom(KillEvidence(signal=SIG_OOM if SIG_OOM in signals else view.exit_signal or view.derived_signal,
                                exit_code=view.exit_status or view.derived_status,
                                slurm_state=view.state, slurm_job=view.job_id, slurmstepd_line=slurmstepd_line))
    if oom:
        return OOM, oom
    if failure is not None:
        return failure
    if view.state in ("NODE_FAIL", "PREEMPTED", "BOOT_FAIL"):
        return FAILED, f"slurm job {view.job_id}: {view.state} and not requeued (no metrics.json)"
    if view.state == "COMPLETED":
        return FAILED, f"slurm job {view.job_id} exited 0 but no metrics.json was written"
    signal = view.exit_signal or view.derived_signal
    how = f"exit code {view.exit_status or view.derived_status}"
    if signal:
        how = f"signal {signal}" + (
            " (SIGKILL: also how Slurm without the memory cgroup enforces --mem; see the job's log)"
            if signal == SIGKILL else ""
        )
    return FAILED, f"slurm job {view.job_id} {view.state} ({view.reason or 'no reason given'}), {how}"


# ------------------------------------------------------------------------------------ finding a job


def task_ids(task_string: str) -> List[int]:
    """Indices of an array's pending remainder, as squeue prints them: '1-3%2', '2,4-8:2', '5'."""
    ids: List[int] = []
    for part in (task_string or "").split("%")[0].split(","):
        part = part.strip()
        if not part:
            continue
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        try:
            ids += range(int(first), int(last or first) + 1, int(step or 1))
        except ValueError:
            continue
    return ids


class SlurmIndex:
    """squeue --json records (and sacct rows) indexed the ways a run can refer to its job."""

    def __init__(self, jobs: Iterable[Mapping[str, Any]] = (), sacct: Iterable[Mapping[str, str]] = ()):
        self.by_task: Dict[Tuple[str, int], Mapping[str, Any]] = {}
        self.by_id: Dict[str, Mapping[str, Any]] = {}
        self.pending: Dict[str, List[Mapping[str, Any]]] = {}
        for job in jobs:
            array_id, task = job.get("array_job_id"), job.get("array_task_id")
            if array_id and task is not None:
                self.by_task[(str(array_id), int(task))] = job
            elif array_id and job.get("array_task_string"):
                self.pending.setdefault(str(array_id), []).append(job)
            self.by_id.setdefault(str(job.get("job_id")), job)
        self.sacct = {row.get("JobID", ""): row for row in sacct}

    def add_sacct(self, rows: Iterable[Mapping[str, str]]) -> None:
        self.sacct.update({row.get("JobID", ""): row for row in rows})

    def squeue_view(self, submission: Mapping[str, Any]) -> Optional[SlurmView]:
        array_id, task = submission.get("array_job_id"), submission.get("array_task_id")
        if array_id is not None and task is not None:
            if (str(array_id), int(task)) in self.by_task:
                return SlurmView.from_squeue(self.by_task[(str(array_id), int(task))])
            for meta in self.pending.get(str(array_id), []):
                if int(task) in task_ids(meta.get("array_task_string", "")):
                    view = SlurmView.from_squeue(meta)
                    return replace(view, job_id=f"{array_id}_{task}", start=None, end=None)
            return None
        job_id = submission.get("job_id")
        if job_id is None or str(job_id) not in self.by_id:
            return None
        return SlurmView.from_squeue(self.by_id[str(job_id)])

    def sacct_view(self, submission: Mapping[str, Any], job_record: Optional[Mapping[str, Any]]) -> Optional[SlurmView]:
        for key in sacct_keys(submission, job_record):
            if key in self.sacct:
                return SlurmView.from_sacct(self.sacct[key])
        return None


def sacct_keys(submission: Mapping[str, Any], job_record: Optional[Mapping[str, Any]]) -> List[str]:
    """JobID spellings of the run's job in sacct: `A_i` (accounting database), the raw id (`sacct -c`)."""
    keys = []
    if submission.get("array_job_id") is not None:
        keys.append(f"{submission['array_job_id']}_{submission['array_task_id']}")
    if job_record and _same_job(submission, job_record) and job_record.get("job_id"):
        keys.append(str(job_record["job_id"]))
    if submission.get("job_id") is not None:
        keys.append(str(submission["job_id"]))
    return keys


def _same_job(submission: Mapping[str, Any], job_record: Mapping[str, Any]) -> bool:
    """Was the job record (written inside the job) written by the submission's job (not an older one)?"""
    if submission.get("array_job_id") is not None:
        return (str(job_record.get("array_job_id")), str(job_record.get("array_task_id"))) == (
            str(submission["array_job_id"]), str(submission["array_task_id"]))
    return str(job_record.get("job_id")) == str(submission.get("job_id"))


def tracked_job(submission: Optional[Mapping[str, Any]], job_record: Optional[Mapping[str, Any]]):
    """The job to follow for a run: the one the sweep submitted, unless the run's job record (written
    inside the job) names another one — its job.sbatch re-submitted by hand — which is then followed."""
    if not job_record or not job_record.get("job_id"):
        return submission
    if submission is not None and _same_job(submission, job_record):
        return submission
    job_id = str(job_record["job_id"])
    return {**(submission or {}), "job_key": job_id, "job_id": job_id, "array_job_id": None,
            "array_task_id": None, "by_hand": True}


# ---------------------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class RunView:
    run_dir: Path
    state: str
    reason: str
    job_key: Optional[str] = None
    slurm_state: Optional[str] = None
    start: Optional[float] = None  # the job's start and end, as Slurm reports them
    end: Optional[float] = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def settled(self) -> bool:
        """Final (or CORRUPT: nothing more will happen to it by itself), and Slurm is done with its job too
        (a rank writes COMPLETED before the job ends), or the job is one that could never start (FAILED
        while waiting: the harness cancels it)."""
        done = self.slurm_state is None or self.slurm_state in SLURM_FINAL
        never = self.state == FAILED and self.slurm_state in SLURM_WAITING
        return (self.final or self.state == CORRUPT) and (done or never)


def run_view(run_dir: Path, submission: Optional[Mapping[str, Any]], job_record: Optional[Mapping[str, Any]],
             slurm: Optional[SlurmView], slurm_answered: bool) -> Tuple[RunView, bool]:
    """(where the run stands, whether that is a final state to write into its status.json). A run whose
    files cannot be read is CORRUPT, as in every other reader of run directories (rundir.read_run)."""
    files = read_run(run_dir)
    if files.state == CORRUPT:
        seen = dict(slurm_state=slurm.state, start=slurm.start, end=slurm.end) if slurm else {}
        return RunView(run_dir, CORRUPT, files.reason, (submission or {}).get("job_key"), **seen), False
    state, reason = files.status.state, files.status.reason
    if submission is None or state == PRUNED:
        note = reason or ("not submitted" if state == PENDING else "")
        return RunView(run_dir, state, note), False
    key = submission.get("job_key")
    if slurm is None:
        if state in FINAL_STATES or not slurm_answered:
            return RunView(run_dir, state, reason, key), False
        lost = f"slurm job {key} ended without a final state and Slurm no longer knows it (squeue, sacct)"
        return RunView(run_dir, FAILED, lost, key), True
    errors = files.errors
    line = ""
    if slurm.final and not metrics_written(run_dir):  # the job's own log, for slurmstepd's OOM line
        line = slurmstepd_oom_line(job_logs(run_dir, [slurm.job_id, (job_record or {}).get("job_id")]))
    new_state, new_reason = classify(slurm, metrics_written(run_dir), errors, line,
                                     partial_measurement(run_dir) or "")
    seen = dict(job_key=key, slurm_state=slurm.state, start=slurm.start, end=slurm.end)
    if not slurm.final:
        requeued = slurm.restart_count > int((job_record or {}).get("restart_count") or 0)
        if state in FINAL_STATES and not requeued:
            return RunView(run_dir, state, reason, **seen), False  # the run said so first
        # FAILED while waiting: a job that can never start, written so that the sweep returns.
        return RunView(run_dir, new_state, new_reason, **seen), new_state == FAILED
    if state == new_state or state == COMPLETED:
        return RunView(run_dir, state, reason or new_reason, **seen), False
    if state == FAILED and slurm.state == "CANCELLED" and job_record is None:
        # The job never started (no job record): the harness failed and cancelled it as unable to start.
        return RunView(run_dir, state, reason, **seen), False
    return RunView(run_dir, new_state, new_reason, **seen), True


# ---------------------------------------------------------------------------------------- a sweep


def queried_ids(submissions: Iterable[Optional[Mapping[str, Any]]]) -> List[str]:
    """The job ids to ask squeue for: each array once (its tasks come with it), each single job."""
    ids = {str(sub.get("array_job_id") or sub.get("job_id")) for sub in submissions if sub}
    return sorted(ids - {"None", ""})


def refresh(run_dirs: Sequence[Path], query_slurm: bool = True, now: Optional[float] = None) -> List[RunView]:
    """Every run's state; final states learnt from Slurm are written into that run's status.json. A job
    pending with ReqNodeNotAvail is judged against sinfo's node states (asked once, only then)."""
    now = time.time() if now is None else now
    records = {run: read_job_record(run) for run in run_dirs}
    submissions = {run: tracked_job(read_submission(run), records[run]) for run in run_dirs}
    index, answered = SlurmIndex(), False
    if query_slurm and any(submissions.values()):
        try:
            index, answered = SlurmIndex(slurm_commands.squeue_jobs(queried_ids(submissions.values()))), True
        except slurm_commands.SlurmError as error:
            print_fitted(f"[harness] squeue failed, showing the run directories' own state: {error}")
        missing = [run for run, sub in submissions.items() if sub and answered and index.squeue_view(sub) is None
                   and read_status(run).state not in FINAL_STATES]
        if missing:
            keys = sorted({key for run in missing for key in sacct_keys(submissions[run], records[run])})
            try:
                index.add_sacct(slurm_commands.sacct_rows(keys))
            except Exception as error:  # sacct absent or unconfigured: squeue's view is all there is
                print_fitted(f"[harness] sacct failed: {error}")
    slurm_views = {run: (index.squeue_view(sub) or index.sacct_view(sub, records[run])) if sub and answered else None
                   for run, sub in submissions.items()}
    slurm_views = _judge_unavailable_nodes(slurm_views, submissions, now)
    views = []
    for run in run_dirs:
        submission, slurm = submissions[run], slurm_views[run]
        view, write = run_view(run, submission, records[run], slurm, answered)
        if write:
            write_status(run, view.state, view.reason)
            if view.slurm_state in SLURM_WAITING:  # it can never start: out of the queue
                _cancel(view.job_key)
        views.append(view)
    return views


def _judge_unavailable_nodes(slurm_views: Dict[Path, Optional[SlurmView]], submissions: Mapping[Path, Any],
                             now: float) -> Dict[Path, Optional[SlurmView]]:
    """Each job pending with ReqNodeNotAvail, against its nodes (one sinfo for all): since when they have
    been short is kept in the run's slurm.json (a poll that finds them sufficient, or a job no longer
    pending for that reason, drops it); once past the grace the view carries why it will never start."""
    waiting = {run: view for run, view in slurm_views.items()
               if view is not None and view.state in SLURM_WAITING and view.reason.startswith(REQ_NODE_NOT_AVAIL)}
    for run, view in slurm_views.items():
        if view is not None and run not in waiting and (submissions.get(run) or {}).get(NODES_SHORT_SINCE) is not None:
            note_nodes_short(run, None)
    if not waiting:
        return slurm_views
    try:
        nodes = slurm_commands.sinfo_nodes()
    except slurm_commands.SlurmError as error:  # unknown node states: the jobs keep waiting
        print_fitted(f"[harness] sinfo failed, jobs waiting for nodes keep waiting: {error}")
        return slurm_views
    judged = dict(slurm_views)
    for run, view in waiting.items():
        since, never = nodes_never_come(view.nodes_asked, nodes, submissions[run].get(NODES_SHORT_SINCE), now)
        note_nodes_short(run, since)
        if never:
            judged[run] = replace(view, never=never)
    return judged


def _cancel(job_key: str) -> None:
    try:
        slurm_commands.scancel([job_key])
    except slurm_commands.SlurmError as error:
        print_fitted(f"[harness] scancel {job_key} failed: {error}")


def counts(views: Iterable[RunView]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for view in views:
        out[view.state] = out.get(view.state, 0) + 1
    return out


def timing(views: Sequence[RunView], submitted: Sequence[float]) -> Optional[str]:
    """The grid's wall time (first submission to last job end) against the sum of its jobs' own run
    times (Slurm start to end): what scheduling and queueing cost on top of the runs. Only jobs Slurm
    has finished count: a running job's end time in squeue is its start plus its time limit."""
    ran = [v for v in views if v.slurm_state in SLURM_FINAL and v.start and v.end and v.end >= v.start]
    if not ran or not submitted:
        return None
    wall = max(v.end for v in ran) - min(submitted)
    own = sum(v.end - v.start for v in ran)
    unfinished = sum(1 for v in views if v.slurm_state and v.slurm_state not in SLURM_FINAL)
    return (f"grid wall time {wall:.0f} s (first sbatch to last job end); the {len(ran)} jobs' own run times "
            f"sum to {own:.0f} s (longest {max(v.end - v.start for v in ran):.0f} s)"
            + (f"; {unfinished} more not finished" if unfinished else ""))


def one_line(views: Sequence[RunView]) -> str:
    active = [v for v in views if v.state != PRUNED]
    done = sum(v.final for v in active)
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts(views).items()))
    return f"{done}/{len(active)} final ({parts})"


# The measured figures of the final table, in their keys (harness.rundir.vocabulary names and formats them).
MEASURED_KEYS = ("tokens_per_s", "mfu", "mem_state_activation_gib")
MEASURED_HEADERS = tuple(header(key) for key in MEASURED_KEYS)
# The table's columns as keys of the vocabulary, with Slurm's own two.
STATUS_KEYS = ("run", "label", "status")
SLURM_HEADERS = ("slurm job", "slurm state")
# Priority of each column on a narrow terminal (harness.terminal): 0 always shown, higher numbers left out first.
STATUS_PRIORITY = {header("run"): 0, header("label"): 1, header("status"): 0, header("tokens_per_s"): 1,
                   header("mfu"): 2, header("mem_state_activation_gib"): 2, "slurm job": 3, "slurm state": 2,
                   header("reason"): 0}
BAR_WIDTH = 50
MIN_BAR_WIDTH = 10


def print_status(title: str, views: Sequence[RunView], labels: Optional[Mapping[str, str]] = None,
                 measured: Optional[Mapping[str, Sequence[str]]] = None, wide: bool = False,
                 width: Optional[int] = None) -> List[str]:
    """The grid as a table that fits the terminal, with a progress bar of the runs that reached a final state.
    `measured`: the cells of MEASURED_HEADERS per run name; Slurm's columns only where a run has a Slurm job.
    Returns the headers left out."""
    from harness.terminal import Column, print_table, terminal_width

    active = [v for v in views if v.state != PRUNED]
    done = sum(v.final for v in active)
    on_slurm = any(view.job_key for view in views)
    headers = [*(header(key) for key in STATUS_KEYS), *(MEASURED_HEADERS if measured is not None else ()),
               *(SLURM_HEADERS if on_slurm else ()), header("reason")]
    columns = [Column(h, STATUS_PRIORITY[h], "right" if h in MEASURED_HEADERS else "left", wrap=h == header("reason"))
               for h in headers]
    styles = {COMPLETED: "green", FAILED: "red", OOM: "red", TIMEOUT: "red", CANCELLED: "yellow",
              RUNNING: "cyan", PENDING: "white", PRUNED: "dim", CORRUPT: "magenta"}
    rows = []
    for view in views:
        name = view.run_dir.name
        # Text, not markup: a reason quotes a rank's error, which may hold brackets ("[.../pair.cc:553]").
        cells = [Text(name), Text((labels or {}).get(name, "")), Text(view.state, style=styles.get(view.state, "white"))]
        if measured is not None:
            cells += [Text(c) for c in measured.get(name, ("-",) * len(MEASURED_HEADERS))]
        if on_slurm:
            cells += [Text(view.job_key or "-"), Text(view.slurm_state or "-")]
        rows.append([*cells, Text(view.reason or "")])
    limit = None if wide else (width if width is not None else terminal_width())
    dropped = print_table(columns, rows, title, wide=wide, width=limit,
                          hint="--wide shows every column; summary.csv holds every field")
    line = one_line(views)
    room = (limit or BAR_WIDTH + 1 + len(line)) - 1 - len(line)
    console = Console(width=limit or BAR_WIDTH + 1 + len(line))
    bar_width = min(BAR_WIDTH, room if room >= MIN_BAR_WIDTH else (limit or BAR_WIDTH))
    bar = ProgressBar(total=max(len(active), 1), completed=done, width=bar_width)
    summary = Table.grid(padding=(0, 1))
    if room >= MIN_BAR_WIDTH:  # the bar beside the counts
        summary.add_column(width=bar_width, no_wrap=True)
        summary.add_column()
        summary.add_row(bar, Text(line))
    else:  # the bar above them
        summary.add_row(bar)
        summary.add_row(Text(line))
    console.print(summary)
    return dropped
