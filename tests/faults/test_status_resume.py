"""Status and resume read a run's state as the report does: a damaged run is CORRUPT everywhere, and resumed."""

import json
import sys

import pytest

from harness import cli
from harness.rundir import COMPLETED, run_dirs, write_status


def _harness(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["harness", *args])
    code = cli.main()
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return code, out.out, out.err


@pytest.fixture
def local_sweep(tmp_path, monkeypatch, capsys):
    """A prepared one-point local sweep (nothing run)."""
    code, out, err = _harness(monkeypatch, capsys, "sweep", "recipes=cpu_zero2", "tracking=disabled",
                              f"results_dir={tmp_path}", "--dry-run")
    assert code == 0, out + err
    (run,) = run_dirs(tmp_path)
    return run.parent, run


def test_a_truncated_metrics_file_is_corrupt_for_status_and_resumed(local_sweep, monkeypatch, capsys):
    sweep_dir, run = local_sweep
    write_status(run, COMPLETED)
    (run / "metrics.json").write_text('{"run_id": "x", "measured": {"step_')
    code, out, _ = _harness(monkeypatch, capsys, "sweep", "status", str(sweep_dir), "--json")
    (view,) = json.loads(out)
    assert view["state"] == "CORRUPT" and "metrics.json" in view["reason"], view
    code, out, err = _harness(monkeypatch, capsys, "sweep", "status", str(sweep_dir))
    assert "CORRUPT" in out and "COMPLETED" not in out.replace("completed", ""), out
    assert "not completed" in err
    code, out, _ = _harness(monkeypatch, capsys, "sweep", "resume", str(sweep_dir), "--dry-run")
    assert f"resume {run.name} (was CORRUPT)" in out and "# would run: " in out, out
    assert "nothing to resume" not in out


@pytest.mark.parametrize("damage", ["{", "[]", '{"points": []}'])
def test_a_corrupt_sweep_record_is_one_line(local_sweep, monkeypatch, capsys, damage):
    sweep_dir, _ = local_sweep
    (sweep_dir / "sweep.json").write_text(damage)
    code, out, err = _harness(monkeypatch, capsys, "sweep", "resume", "--dry-run", str(sweep_dir))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "sweep.json" in err, err
