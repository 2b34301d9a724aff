"""Tolerant readers: a corrupt, truncated or missing file marks its run CORRUPT naming the file, and a
report, summary and sweep status over a sweep holding such a run still build."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.launch.status import refresh
from harness.report.build import build_report
from harness.report.table import write_summary
from harness.rundir import (
    CORRUPT,
    CorruptFile,
    read_errors,
    read_metrics,
    read_run,
    read_status,
    run_dirs,
    state_from_files,
)
from tests.unit.report.synthetic_runs import make_sweep

DAMAGE = {
    "truncated": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "binary": lambda text: "\udcff\x00garbage",
    "wrong type": lambda text: "[1, 2, 3]\n",
}


def _damage(path: Path, how: str) -> None:
    data = DAMAGE[how](path.read_text()).encode("utf-8", "surrogateescape")
    path.write_bytes(data)


@pytest.fixture
def sweep(tmp_path):
    return make_sweep(tmp_path / "results")


@pytest.mark.parametrize("how", sorted(DAMAGE))
@pytest.mark.parametrize("name", ["status.json", "metrics.json", "config.json", "plan.json"])
def test_a_damaged_file_makes_its_run_corrupt_and_names_the_file(sweep, name, how):
    run = sweep / "0"  # completed: it has all four
    _damage(run / name, how)
    files = read_run(run)
    assert files.state == CORRUPT and name in files.reason, files.reason
    others = [read_run(other) for other in run_dirs(sweep) if other != run]
    assert CORRUPT not in {o.state for o in others}


def test_missing_status_or_metrics_of_a_completed_run(sweep):
    (sweep / "0" / "metrics.json").unlink()
    files = read_run(sweep / "0")
    assert files.state == CORRUPT and "metrics.json is missing although the run is COMPLETED" in files.reason
    (sweep / "1" / "status.json").unlink()
    status = read_status(sweep / "1")
    assert status.state == CORRUPT and "status.json is missing" in status.reason


def test_a_run_without_config_or_plan_is_not_corrupt(sweep):
    """A point rejected before its config was resolved has only status.json: that is a valid run dir."""
    (sweep / "5" / "config.json").unlink()
    (sweep / "5" / "plan.json").unlink()
    assert read_run(sweep / "5").state == "PRUNED"


def test_strict_readers_raise_one_error_naming_the_file(sweep):
    _damage(sweep / "0" / "metrics.json", "truncated")
    with pytest.raises(CorruptFile, match=r"^metrics\.json: JSONDecodeError"):
        read_metrics(sweep / "0")
    _damage(sweep / "3" / "errors" / "rank1.json", "empty")
    with pytest.raises(CorruptFile, match=r"^rank1\.json"):
        read_errors(sweep / "3")
    state, reason = state_from_files(sweep / "3")
    assert state == CORRUPT and "rank1.json" in reason


def test_report_summary_and_status_build_over_a_sweep_with_one_corrupt_run(sweep, tmp_path):
    _damage(sweep / "1" / "metrics.json", "truncated")
    _damage(sweep / "3" / "status.json", "binary")
    frame = write_summary(sweep)
    rows = frame.set_index("run")
    assert len(frame) == 8 and rows.at["1", "status"] == "CORRUPT" and rows.at["3", "status"] == "CORRUPT"
    assert "metrics.json" in rows.at["1", "reason"] and "status.json" in rows.at["3", "reason"]
    assert rows.at["0", "status"] == "COMPLETED" and rows.at["0", "tokens_per_s"] > 0
    assert rows.at["1", "engine"] == "deepspeed"  # the readable files of a corrupt run still fill its row
    paths = build_report([sweep], tmp_path / "out", publish_timeout_s=0)
    html = paths["html"].read_text()
    assert "CORRUPT" in html and paths["csv"].exists()
    views = {v.run_dir.name: v for v in refresh(run_dirs(sweep), query_slurm=False)}
    assert views["3"].state == "CORRUPT" and "status.json" in views["3"].reason
    assert views["0"].state == "COMPLETED"
