"""Corrupt and truncated run files: the run is CORRUPT with the file named; the report and summary still build."""

import csv
import sys

import pytest

from harness import cli
from tests.unit.report.synthetic_runs import make_sweep


def _damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(b"\x00\xff not json at all")
    elif how == "wrong shape":
        path.write_text('["a list where a record belongs"]')
    elif how == "missing":
        path.unlink()


@pytest.mark.parametrize("run, file, how", [
    ("0", "metrics.json", "truncated"),
    ("1", "status.json", "garbage"),
    ("0", "plan.json", "wrong shape"),
    ("1", "status.json", "truncated"),
])
def test_one_damaged_file_marks_its_run_corrupt_and_the_report_builds(run, file, how, tmp_path, monkeypatch,
                                                                       capsys):
    sweep_dir = make_sweep(tmp_path)
    runs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    _damage(sweep_dir / run / file, how)
    monkeypatch.setattr(sys, "argv", ["harness", "report", str(sweep_dir)])
    code = cli.main()
    out = capsys.readouterr()
    assert code == 0 and "Traceback" not in out.out + out.err
    rows = {row["run"]: row for row in csv.DictReader(open(sweep_dir / "summary.csv"))}
    assert sorted(rows) == runs, "every run keeps its row"
    assert rows[run]["status"] == "CORRUPT" and file in rows[run]["reason"]
    healthy = [name for name in runs if name != run and rows[name]["status"] == "COMPLETED"]
    assert healthy, "the other completed runs are still reported"
    assert (sweep_dir / "report.html").exists()
