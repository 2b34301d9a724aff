"""A sweep's orchestration: run its prepared points locally or as Slurm job arrays, follow them to a final
state, resume what did not complete, cancel. Reporting is handed in by the caller (launch never imports report)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from harness.launch.job_records import archive_attempt, note_previous_attempt, read_submission, submit
from harness.launch.points import Point, load_point, render_pruned, sweep_record
from harness.launch.run import run_prepared
from harness.launch.run_lock import RunLock, RunLocked, live_holder
from harness.launch.sbatch import Submission, group_runs, write_group, write_job_script
from harness.launch.follow import FOLLOW_INTERVAL_S, StepFollower
from harness.launch.slurm_commands import check_reachable, scancel
from harness.launch.status import SLURM_FINAL, RunView, print_status, refresh, timing
from harness.launch.sweep_progress import SweepProgress
from harness.rundir import (
    CANCELLED,
    COMPLETED,
    CORRUPT,
    FAILED,
    JOB_SCRIPT,
    OOM,
    PENDING,
    PRUNED,
    RUNNING,
    TIMEOUT,
    FINAL_STATES,
    CorruptFile,
    RecordError,
    run_dirs,
    read_status,
    write_status,
)
from harness.runtime.sinks import wandb_environment
from harness.terminal import print_fitted

RESUBMIT_STATES = (FAILED, OOM, TIMEOUT, CANCELLED)
# Seconds between two looks at Slurm (squeue, then sacct for forgotten jobs) while a sweep or run is
# followed. Each look is an RPC to a controller every user of the cluster shares, and a benchmark job
# runs for minutes: 30 s adds at most 30 s to a wait (Snakemake's Slurm executor checks job status every
# 30 s for the same reason: snakemake/snakemake#2136). --poll=SECONDS changes it (tests use 1).
POLL_S = 30.0


@dataclass
class Reported:
    """What writing a sweep's summary and reports gives the final table: each run's layout label, its
    measured cells (status.MEASURED_HEADERS: tokens/s, MFU, memory) and the lines to print (where the files are)."""

    labels: Dict[str, str]
    measured: Dict[str, Tuple[str, ...]]
    lines: List[str]


Reporter = Callable[[Path], Reported]


@dataclass
class Options:
    """What `harness sweep` was asked to do (parsed by harness/commands/sweep.py)."""

    command: str = "new"
    target: Optional[Path] = None
    overrides: Tuple[str, ...] = ()
    dry_run: bool = False
    submit_pruned: bool = False
    wait: bool = True
    watch: bool = False
    as_json: bool = False
    poll_s: float = POLL_S
    wide: bool = False  # every column of the final table, however wide


def _echo(text: str) -> None:
    print_fitted(text)


def print_pruned(points: Sequence[Point]) -> None:
    for point in points:
        if point.rendered is None:
            print_fitted(f"[harness] {point.run_dir.name}: PRUNED {point.reason}")


def run_local(points: Sequence[Point]) -> None:
    """One run after another, each run's step lines and the sweep's bar (done, failed, ETA) on the console."""
    from harness.launch.sweep_progress import SweepProgress

    runnable = [point for point in points if point.rendered is not None]
    with SweepProgress(len(runnable), len(points) - len(runnable)) as progress:
        for point in runnable:
            state, reason = run_prepared(point.run_dir, point.cfg, point.rendered, say=progress.echo)
            progress.finished(point.run_dir.name, state, reason)


def print_job_scripts(scripts_of: Sequence[Path]) -> None:
    """The first task's job.sbatch in full, then each other task's lines that differ from it."""
    first = (scripts_of[0] / JOB_SCRIPT).read_text()
    print(f"# task 0: {scripts_of[0]}/{JOB_SCRIPT}\n{first}")
    known = set(first.splitlines())
    for index, run_dir in enumerate(scripts_of[1:], start=1):
        lines = [line for line in (run_dir / JOB_SCRIPT).read_text().splitlines() if line not in known]
        print(f"# task {index}: {run_dir}/{JOB_SCRIPT} differs from task 0 in:")
        print("\n".join(f"#   {line}" for line in lines))


def _submit_one(submission: Submission) -> None:
    runs = ", ".join(run.name for run in submission.run_dirs)
    try:
        done = submit(submission)
    except Exception as error:
        for run_dir in submission.run_dirs:
            write_status(run_dir, FAILED, f"sbatch refused the job: {error}")
        print_fitted(f"[harness] sbatch {submission.script} failed: {error}", sys.stderr)
        return
    kind = "array" if done.is_array else "job"
    print_fitted(f"[harness] submitted {kind} {done.job_id}: {submission.script} ({runs})")


def submit_slurm(sweep_dir: Path, points: Sequence[Point], sweep_name: str, dry_run: bool) -> List[Submission]:
    """Write each run's job.sbatch, group the runs by resource shape, write and (unless dry) submit."""
    runnable = [p for p in points if p.rendered is not None]
    for point in runnable:
        write_job_script(point.cfg, point.rendered, wandb_environment(point.run_dir, point.cfg.tracking))
    groups = group_runs([(p.run_dir, p.cfg, p.rendered) for p in runnable])
    submissions = [write_group(group, sweep_dir, sweep_name) for group in groups]
    unreachable = check_reachable() if submissions and not dry_run else None
    if unreachable:  # said once, here; each run's status keeps the short form
        print_fitted(f"[harness] {unreachable}", sys.stderr)
        for submission in submissions:
            for run_dir in submission.run_dirs:
                write_status(run_dir, FAILED, "not submitted: Slurm was not reachable (`harness doctor` says why)")
        return []
    for submission in submissions:
        if not dry_run:
            _submit_one(submission)
            continue
        runs = ", ".join(run.name for run in submission.run_dirs)
        print(f"\n# would submit: sbatch {submission.script}   ({len(submission.run_dirs)} run(s): {runs})")
        print(submission.script.read_text())
        if submission.is_array:
            print_job_scripts(submission.run_dirs)
    return submissions


def run_line(view: RunView) -> str:
    """One run's state as it changes while it is followed: its state, Slurm's state and why (in words)."""
    # A run's own final state is written before its job step ends: Slurm's view lags it by a poll, and
    # "COMPLETED [slurm RUNNING]" would read as a contradiction, so a lagging Slurm state is not shown.
    lagging = view.final and view.slurm_state not in SLURM_FINAL
    slurm = f" [slurm {view.slurm_state}]" if view.slurm_state and not lagging else ""
    return f"[harness] {view.run_dir.name}: {view.state}{slurm} {view.reason}".rstrip()


def wait_for(runs: Sequence[Path], poll_s: float, say: Optional[Callable[[str], None]] = None,
             progress: Optional[SweepProgress] = None, follow_s: float = FOLLOW_INTERVAL_S) -> List[RunView]:
    """Follow submitted runs until every one is settled, as a local run is followed: each run's step lines
    as rank 0 appends them to its progress.jsonl (read every `follow_s` from the shared run directory),
    a line whenever a run's state or reason changes, and with `progress` the sweep's bar, counts and ETA.
    Slurm itself is asked every `poll_s` only (each look is an RPC to the shared controller)."""
    say = progress.echo if progress is not None else (say or _echo)
    followers = [StepFollower(run, say, prefix=f"[{Path(run).name}] ") for run in runs]
    seen: Dict[Path, Tuple[str, str]] = {}
    while True:
        views = refresh(runs)
        for view, follower in zip(views, followers):
            if view.run_dir not in seen and view.final:
                follower.skip_written()  # ended before this wait: its steps are history, not progress
            follower.read_new_lines()
        for view in views:
            now = (view.state, view.reason)  # not Slurm's state alone: a run's COMPLETED is said once
            before = seen.get(view.run_dir)
            if now == before:
                continue
            seen[view.run_dir] = now
            if view.state == PRUNED:
                continue
            say(run_line(view))
            if progress is None or not view.final or (before is not None and before[0] in FINAL_STATES):
                continue
            if before is None:
                progress.already(view.state)  # final before this wait began: counted, its time not in the ETA
            else:
                progress.finished(view.run_dir.name, view.state, view.reason)
        if all(v.settled or v.job_key is None for v in views):
            return views
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline:
            time.sleep(min(follow_s, max(0.0, deadline - time.monotonic())))
            for follower in followers:
                follower.read_new_lines()


def follow(runs: Sequence[Path], poll_s: float) -> List[RunView]:
    """A Slurm sweep followed to the end with the local sweep's view: step lines, run lines, bar and ETA."""
    pruned = sum(1 for run in runs if read_status(run).state == PRUNED)
    with SweepProgress(len(runs) - pruned, pruned) as progress:
        return wait_for(runs, poll_s, progress=progress)


def watch_command(sweep_dir: Path) -> str:
    """The command that follows a submitted sweep (or run) live, later or from another shell."""
    return f"harness sweep status --watch {sweep_dir}"


def finish(sweep_dir: Path, report: Reporter, since: float = 0.0, query_slurm: bool = True,
           wide: bool = False) -> int:
    """The whole grid's state, its reports, the table, and the exit code: 0 when every run that ran
    completed. `since`: time of this invocation's first sbatch (the timing line covers those jobs)."""
    views = refresh(run_dirs(sweep_dir), query_slurm=query_slurm)
    reported = report(sweep_dir)
    print_status(str(sweep_dir), views, reported.labels, reported.measured, wide=wide)
    records = {v.run_dir: read_submission(v.run_dir) for v in views}
    ours = [v for v in views if records[v.run_dir] and records[v.run_dir].get("submitted", 0) >= since]
    line = timing(ours, [records[v.run_dir]["submitted"] for v in ours])
    if line:
        print_fitted(f"[harness] {line}")
    print_fitted("\n".join(reported.lines))
    bad = [v.run_dir.name for v in views if v.state == CORRUPT or (v.final and v.state not in (COMPLETED, PRUNED))]
    if bad:
        print_fitted(f"[harness] not completed: {', '.join(bad)}  (re-run them: harness sweep resume {sweep_dir})",
                     sys.stderr)
    return 1 if bad else 0


def _launch_local(sweep_dir: Path, points: Sequence[Point], opts: Options, report: Reporter) -> int:
    if opts.dry_run:
        for point in points:
            if point.rendered is not None:
                print(f"# would run: {point.rendered.command_line()}")
        print_fitted(f"[harness] dry run: prepared {sweep_dir}; run it with `harness sweep resume {sweep_dir}`")
        return 0
    try:
        # one local launcher a sweep: a second (a resume beside the first) would run its points at the same
        # time on the same host, and both would measure the contention
        with RunLock(sweep_dir):
            run_local(points)
    except RunLocked as error:
        print_fitted(f"[harness] {error}: its sweep is running; nothing launched", sys.stderr)
        return 1
    except KeyboardInterrupt:  # SIGINT / SIGTERM: the running point is CANCELLED; the summary still builds
        finish(sweep_dir, report, query_slurm=False, wide=opts.wide)
        raise
    return finish(sweep_dir, report, query_slurm=False, wide=opts.wide)


def launch(sweep_dir: Path, points: Sequence[Point], backend: str, sweep_name: str, opts: Options,
           report: Reporter) -> int:
    """Run the points (locally, or submitted to Slurm and waited for unless --no-wait), then report."""
    print_pruned(points)
    if backend == "local":
        return _launch_local(sweep_dir, points, opts, report)
    since = time.time()
    submit_slurm(sweep_dir, points, sweep_name, opts.dry_run)
    if opts.dry_run:
        print_fitted(f"[harness] dry run: nothing submitted; prepared {sweep_dir}; submit with "
              f"`harness sweep resume {sweep_dir}`")
        return 0
    if not opts.wait:
        print_fitted(f"[harness] submitted; follow with `{watch_command(sweep_dir)}`")
        return 0
    try:
        follow(sorted(p.run_dir for p in points), opts.poll_s)
    except KeyboardInterrupt:
        print_fitted(f"\n[harness] stopped waiting; the jobs go on: harness sweep status {sweep_dir}", sys.stderr)
        return 130
    return finish(sweep_dir, report, since, wide=opts.wide)


def to_resume(views: Sequence[RunView], submit_pruned: bool, backend: str) -> List[RunView]:
    """What did not complete: final non-completed runs, never-submitted runs (and pruned ones on request).
    Queued or running Slurm jobs are left alone; a local run left RUNNING was interrupted."""
    chosen = []
    for view in views:
        if view.state in RESUBMIT_STATES:
            chosen.append(view)
        elif view.state == CORRUPT and (view.slurm_state is None or view.slurm_state in SLURM_FINAL):
            chosen.append(view)  # what it measured cannot be read: measure it again (the files set aside)
        elif view.state == PRUNED and submit_pruned:
            chosen.append(view)
        elif view.state in (PENDING, RUNNING) and (view.job_key is None if backend == "slurm" else True):
            chosen.append(view)
    return chosen


def _resumable(view: RunView, opts: Options) -> Optional[Point]:
    """The point to run again (its earlier attempt set aside), or None when it cannot be rendered."""
    try:
        point = load_point(view.run_dir, view.state, view.reason)
    except (CorruptFile, RecordError, TypeError, ValueError) as error:
        print_fitted(f"[harness] {view.run_dir.name}: not resumed, its launch cannot be read back: {error}")
        return None
    if point.rendered is None:
        if not opts.submit_pruned:
            return None
        point = render_pruned(point)
        if point.rendered is None:
            return None
    holder = live_holder(view.run_dir)
    if holder:  # never a second launch beside a live one
        print_fitted(f"[harness] {view.run_dir.name}: {holder}; not resumed")
        return None
    if not opts.dry_run and view.state in (*RESUBMIT_STATES, RUNNING, CORRUPT):
        note_previous_attempt(view.run_dir, view.state, view.reason)
        archive_attempt(view.run_dir)
        write_status(view.run_dir, PENDING, f"resubmitted after {view.state}")
    print_fitted(f"[harness] resume {view.run_dir.name} (was {view.state})")
    return point


def resume(opts: Options, report: Reporter) -> int:
    sweep_dir = opts.target.resolve()
    record = sweep_record(sweep_dir)
    backend = record["launcher"]
    holder = live_holder(sweep_dir) if backend == "local" else None
    if holder:
        print_fitted(f"[harness] {sweep_dir.name}: its sweep is {holder}: nothing resumed (a second launcher "
                     "would run points beside the first's); resume once it has ended", sys.stderr)
        return 1
    views = refresh(run_dirs(sweep_dir), query_slurm=backend == "slurm")
    chosen = to_resume(views, opts.submit_pruned, backend)
    if not chosen:
        print_fitted("[harness] nothing to resume: every run completed, is pruned, or is still queued/running")
        return finish(sweep_dir, report, query_slurm=backend == "slurm", wide=opts.wide)
    points = [point for point in (_resumable(view, opts) for view in chosen) if point is not None]
    return launch(sweep_dir, points, backend, record["sweep_name"], opts, report)


def cancel(opts: Options) -> int:
    views = refresh(run_dirs(opts.target.resolve()))
    keys = [v.job_key for v in views if v.job_key and not v.final]
    scancel(keys)
    print_fitted(f"[harness] scancel {' '.join(keys) or '(nothing queued or running)'}")
    return 0
