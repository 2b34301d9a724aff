"""Writing a run's records: status.json, errors/rank<N>.json, metrics.json (through the one atomic writer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Union

from harness.rundir.files import METRICS_FILE, STATUS_FILE, error_file
from harness.rundir.records import RankError, RunResult, Status
from harness.rundir.states import RunState
from harness.rundir.writer import write_json


def write_status(run_dir: Union[str, Path], state: RunState, reason: str = "") -> None:
    write_json(Path(run_dir) / STATUS_FILE, Status.now(state, reason).to_dict())


def write_error(run_dir: Union[str, Path], rank: int, error: BaseException) -> None:
    """One structured record per failing rank, so a failure is classified without reading logs."""
    write_json(Path(run_dir) / error_file(rank), RankError.from_exception(rank, error).to_dict())


def write_metrics(run_dir: Union[str, Path], result: Union[RunResult, Dict[str, Any]]) -> None:
    payload = result.to_dict() if isinstance(result, RunResult) else result
    write_json(Path(run_dir) / METRICS_FILE, payload)
