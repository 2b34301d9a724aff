"""What a run directory records about its Slurm jobs: the submission, the job itself, earlier attempts.

- `<run>/slurm.json` — the submitter's record: job key (`A_i` for an array task, `J` for a job),
  attempt number and the earlier attempts' final states; while the job waits with ReqNodeNotAvail
  and too few of its nodes are usable, since when (`nodes_short_since`, kept between polls).
- `<run>/slurm_job.json` — written inside the job: raw job id, nodes, rendezvous address and port.
- `<run>/attempts/<n>/` — an earlier attempt's metrics, rank errors and job record, moved aside.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Optional

from harness.launch.sbatch import Submission
from harness.launch.slurm_commands import sbatch
from harness.runtime.progress import PROGRESS_FILE
from harness.rundir import (
    ATTEMPTS_DIR,
    ERRORS_DIR,
    JOB_RECORD_FILE,
    METRICS_FILE,
    SUBMISSION_FILE,
    CorruptFile,
    load_json,
    write_json,
)


def submit(submission: Submission) -> Submission:
    """sbatch the script and record, in each run's own directory, which job (or array task) runs it."""
    submitted = time.time()
    job_id = sbatch(submission.script)
    done = Submission(submission.name, submission.script, job_id, submission.run_dirs, submission.is_array)
    for index, run_dir in enumerate(done.run_dirs):
        record_submission(run_dir, done, index, submitted)
    return done


def record_submission(run_dir: Path, submission: Submission, index: int, submitted: float) -> None:
    previous = read_submission(run_dir)
    write_json(Path(run_dir) / SUBMISSION_FILE, {
        "job_key": submission.job_key(index),
        "job_id": submission.job_id if not submission.is_array else None,
        "array_job_id": submission.job_id if submission.is_array else None,
        "array_task_id": index if submission.is_array else None,
        "script": str(submission.script),
        "submitted": submitted,
        "attempt": (previous or {}).get("attempt", 0) + 1,
        "history": (previous or {}).get("history", []),
    })


def read_submission(run_dir: Path) -> Optional[Dict[str, Any]]:
    return _read_json(Path(run_dir) / SUBMISSION_FILE)


def read_job_record(run_dir: Path) -> Optional[Dict[str, Any]]:
    return _read_json(Path(run_dir) / JOB_RECORD_FILE)


def _read_json(path: Path) -> Optional[Dict[str, Any]]:
    """The record, or None when it is absent or unreadable (the run is then followed as never submitted)."""
    try:
        record = load_json(path)
    except CorruptFile:
        return None
    return record if isinstance(record, dict) else None


def note_previous_attempt(run_dir: Path, state: str, reason: str) -> None:
    """Before a resubmission: the last attempt's outcome goes into the history of slurm.json."""
    record = read_submission(run_dir)
    if record is None:
        return
    record["history"] = [*record.get("history", []),
                         {"job_key": record.get("job_key"), "state": state, "reason": reason}]
    write_json(Path(run_dir) / SUBMISSION_FILE, record)


NODES_SHORT_SINCE = "nodes_short_since"


def note_nodes_short(run_dir: Path, since: Optional[float]) -> None:
    """Keep (or, with None, drop) since when the pending job's nodes have been too few, in slurm.json:
    every poll of every `harness sweep` or `sweep status` sees the same clock. Written only on a change."""
    record = read_submission(run_dir)
    if record is None or record.get(NODES_SHORT_SINCE) == since:
        return
    if since is None:
        record.pop(NODES_SHORT_SINCE, None)
    else:
        record[NODES_SHORT_SINCE] = since
    write_json(Path(run_dir) / SUBMISSION_FILE, record)


def note_requeue(run_dir: Path, restart_count: int, archived: Optional[Path]) -> None:
    """Inside a job that Slurm requeued (node failure, preemption: same job, SLURM_RESTART_COUNT > 0): the
    interrupted attempt goes into slurm.json's history, with where its files were set aside, and this
    is the next attempt."""
    record = read_submission(run_dir)
    if record is None or restart_count < 1:
        return
    entry = {"job_key": record.get("job_key"), "state": "REQUEUED",
             "reason": f"requeued by Slurm (restart {restart_count}: node failure or preemption)"}
    if archived is not None:
        entry["files"] = str(archived.relative_to(run_dir))
    record["history"] = [*record.get("history", []), entry]
    record["attempt"] = int(record.get("attempt", 0)) + 1
    write_json(Path(run_dir) / SUBMISSION_FILE, record)


def archive_attempt(run_dir: Path) -> Optional[Path]:
    """Move what an earlier attempt measured or reported (metrics, rank errors, job record) aside, so
    that the next attempt is classified from its own files only."""
    run_dir = Path(run_dir)
    leftovers = [run_dir / name for name in (METRICS_FILE, ERRORS_DIR, JOB_RECORD_FILE, PROGRESS_FILE) if (run_dir / name).exists()]
    if not leftovers:
        return None
    attempts = run_dir / ATTEMPTS_DIR
    attempts.mkdir(exist_ok=True)
    target = attempts / str(1 + sum(1 for p in attempts.iterdir() if p.is_dir()))
    target.mkdir()
    for path in leftovers:
        path.rename(target / path.name)
    return target
