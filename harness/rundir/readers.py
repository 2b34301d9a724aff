"""Tolerant readers: a missing or unreadable file marks its run CORRUPT, naming the file, and nothing else fails."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from harness.rundir.files import CONFIG_FILE, ERRORS_DIR, METRICS_FILE, PLAN_FILE, STATUS_FILE, fatal_report_file
from harness.rundir.records import RankError, RecordError, RunResult, Status
from harness.rundir.states import COMPLETED, CORRUPT, FAILED, OOM, TIMEOUT, RunState

PathLike = Union[str, Path]


class CorruptFile(ValueError):
    """A run file that exists but cannot be read as its record; the message names the file and why."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path.name}: {why}")
        self.path = path


def load_json(path: PathLike) -> Optional[Any]:
    """The parsed file, None when it does not exist; CorruptFile when it cannot be read or parsed."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptFile(path, f"{type(error).__name__}: {error}") from None


def _record(path: Path, parse):
    data = load_json(path)
    if data is None:
        return None
    try:
        return parse(data)
    except (RecordError, TypeError, ValueError) as error:
        raise CorruptFile(path, str(error)) from None


def read_status(run_dir: PathLike) -> Status:
    """status.json; CORRUPT (naming the file) when it is missing or unreadable, never an exception."""
    path = Path(run_dir) / STATUS_FILE
    try:
        status = _record(path, Status.from_dict)
    except CorruptFile as error:
        return Status(CORRUPT, f"corrupt run directory: {error}")
    return status if status is not None else Status(CORRUPT, f"corrupt run directory: {STATUS_FILE} is missing")


def read_metrics(run_dir: PathLike) -> Optional[RunResult]:
    """metrics.json as a RunResult, None before the run wrote it; CorruptFile when unreadable."""
    return _record(Path(run_dir) / METRICS_FILE, RunResult.from_dict)


def read_errors(run_dir: PathLike) -> List[RankError]:
    """The failing ranks' records, by rank, each dated by its file; CorruptFile when one is unreadable.

    A rank's own exception record (rank<N>.json) wins over its fatal-signal report (rank<N>.fatal), which
    then only tells how the failing rank went down; an empty report is a rank that did not die that way."""
    folder = Path(run_dir) / ERRORS_DIR
    records: Dict[int, RankError] = {record.rank: record for record in read_fatal_reports(run_dir)}
    for path in sorted(folder.glob("rank*.json")) if folder.is_dir() else []:
        record = _record(path, RankError.from_dict)
        if record is not None:
            records[record.rank] = _dated(record, path)
    return [records[rank] for rank in sorted(records)]


def read_fatal_reports(run_dir: PathLike) -> List[RankError]:
    """Every rank's non-empty fatal-signal report as its record, dated."""
    folder = Path(run_dir) / ERRORS_DIR
    paths = sorted(folder.glob("rank*.fatal")) if folder.is_dir() else []
    return [record for record in (read_fatal_report(run_dir, _rank_of(path)) for path in paths) if record is not None]


def read_fatal_report(run_dir: PathLike, rank: int) -> Optional[RankError]:
    """A rank's fatal-signal report as its record, dated; None while it is empty or once it is removed
    (the rank did not die of a fatal signal)."""
    path = Path(run_dir) / fatal_report_file(rank)
    try:
        record = RankError.from_fatal_report(rank, path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return _dated(record, path) if record is not None else None


def _rank_of(path: Path) -> int:
    try:
        return int(path.stem.removeprefix("rank"))
    except ValueError:
        raise CorruptFile(path, "not named rank<N>") from None


def _dated(record: RankError, path: Path) -> RankError:
    try:
        record.time = path.stat().st_mtime
    except OSError:
        pass
    return record


# Errors a launcher's cleanup causes after the root failure (the watchdog's names, harness.launch.watchdog):
# they sort after a failure recorded at the same time.
CLEANUP_ERRORS = {"SIGTERM": 2, "killed": 1}


def rank_failure(errors: Sequence[RankError]) -> Optional[Tuple[RunState, str]]:
    """The root cause among the ranks' records: an out-of-memory record (its peers' errors are
    consequences), else the earliest one (a rank's death makes its peers fail after it, "Connection closed
    by peer"), cleanup after a failure last among records of the same time, then the lowest rank."""
    if not errors:
        return None
    root = min(errors, key=lambda error: (not error.out_of_memory, error.time if error.time is not None else 0.0,
                                          CLEANUP_ERRORS.get(error.type, 0), error.rank))
    return (OOM if root.out_of_memory else FAILED), root.reason()


def partial_measurement(run_dir: PathLike) -> Optional[str]:
    """Why the run's metrics.json holds only some of its timed steps (its `partial` record), or None."""
    try:
        data = load_json(Path(run_dir) / METRICS_FILE)
    except CorruptFile:
        return None
    partial = data.get("partial") if isinstance(data, dict) else None
    if not isinstance(partial, dict):
        return None
    return (f"partial measurement: {partial.get('steps_measured')} of {partial.get('steps_planned')} timed steps "
            f"({partial.get('reason')})")


def metrics_written(run_dir: PathLike) -> bool:
    """Rank 0 wrote metrics.json (atomically, after the measurement) and it is not partial: the run measured
    what it should."""
    return (Path(run_dir) / METRICS_FILE).exists() and partial_measurement(run_dir) is None


def state_from_files(run_dir: PathLike, metrics_count: bool = True) -> Optional[Tuple[RunState, str]]:
    """A run's final state from its own files: COMPLETED once metrics.json exists (when `metrics_count`: the
    launcher's exit does not contradict it), TIMEOUT when the ranks stopped at the time limit's warning and
    wrote a partial one, else the ranks' error records; None when the files say nothing (the caller then says
    how the launcher ended). An unreadable error record is CORRUPT, named."""
    if metrics_count and metrics_written(run_dir):
        return COMPLETED, ""
    partial = partial_measurement(run_dir)
    if partial:
        return TIMEOUT, partial
    try:
        return rank_failure(read_errors(run_dir))
    except CorruptFile as error:
        return CORRUPT, f"corrupt run directory: {error}"


@dataclass
class RunFiles:
    """Everything a run directory holds, read once; `problems` names each missing or unreadable file."""

    run_dir: Path
    status: Status
    config: Dict[str, Any] = field(default_factory=dict)
    plan: Dict[str, Any] = field(default_factory=dict)
    metrics: Optional[RunResult] = None
    errors: List[RankError] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)

    @property
    def state(self) -> RunState:
        return CORRUPT if self.problems else self.status.state

    @property
    def reason(self) -> str:
        if self.problems:
            return "corrupt run directory: " + "; ".join(self.problems)
        return self.status.reason


def _object(path: Path, problems: List[str]) -> Dict[str, Any]:
    """A JSON object file; absent is allowed (a run rejected before its config was resolved has none)."""
    try:
        data = load_json(path)
    except CorruptFile as error:
        problems.append(str(error))
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(f"{path.name}: a {type(data).__name__}, not an object")
        return {}
    return data


def read_run(run_dir: PathLike) -> RunFiles:
    """One run directory, tolerantly: each unreadable file (and a missing status.json, or a missing
    metrics.json of a COMPLETED run) becomes a problem that makes the run CORRUPT; the rest is still read."""
    run_dir = Path(run_dir)
    status = read_status(run_dir)
    files = RunFiles(run_dir, status)
    if status.state == CORRUPT:
        files.problems.append(status.reason.removeprefix("corrupt run directory: "))
    files.config = _object(run_dir / CONFIG_FILE, files.problems)
    files.plan = _object(run_dir / PLAN_FILE, files.problems)
    try:
        files.metrics = read_metrics(run_dir)
    except CorruptFile as error:
        files.problems.append(str(error))
    if files.metrics is None and status.state == COMPLETED and not any(METRICS_FILE in p for p in files.problems):
        files.problems.append(f"{METRICS_FILE} is missing although the run is {COMPLETED}")
    try:
        files.errors = read_errors(run_dir)
    except CorruptFile as error:
        files.problems.append(str(error))
    return files


def run_dirs(root: PathLike) -> List[Path]:
    """Every run directory below `root` (a run directory is one holding a status file)."""
    return sorted(path.parent for path in Path(root).rglob(STATUS_FILE))
