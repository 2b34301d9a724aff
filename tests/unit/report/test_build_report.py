"""build_report: the four files of a sweep, and the `harness report` entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.report.build import build_report, default_out_dir, report_main
from tests.unit.report.synthetic_runs import make_run, make_sweep


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_build_writes_the_four_files(sweep_dir):
    paths = build_report([sweep_dir], sweep_dir)
    assert set(paths) == {"csv", "parquet", "html", "wandb_report"}
    assert [p.name for p in paths.values()] == ["summary.csv", "summary.parquet", "report.html", "wandb_report.json"]
    assert all(p.parent == sweep_dir and p.stat().st_size > 0 for p in paths.values())
    assert len(pd.read_csv(paths["csv"])) == 8
    assert json.loads(paths["wandb_report"].read_text())["displayName"] == "Benchmark sweep synthetic"
    assert "Use dp2 tp1 zero2 mb2" in paths["html"].read_text()


def test_a_second_build_sees_new_runs(sweep_dir):
    build_report([sweep_dir], sweep_dir)
    make_run(sweep_dir, "extra", "COMPLETED", step_time_s=0.001, zero_stage=1, micro_batch=2)
    paths = build_report([sweep_dir], sweep_dir)
    assert len(pd.read_csv(paths["csv"])) == 9
    assert "zero1 mb2" in paths["html"].read_text().split("Which layout should I use?")[1][:400]


def test_default_out_dir(tmp_path):
    assert default_out_dir([tmp_path / "a"]) == tmp_path / "a"
    (tmp_path / "x" / "a").mkdir(parents=True)
    (tmp_path / "x" / "b").mkdir(parents=True)
    compared = (tmp_path / "x" / "compare" / "a_vs_b").resolve()
    assert default_out_dir([tmp_path / "x" / "a", tmp_path / "x" / "b"]) == compared
    (tmp_path / "x" / "c").mkdir()
    assert default_out_dir([tmp_path / "x" / "a", tmp_path / "x" / "c"]) != compared  # never overwritten


def test_report_main_writes_where_out_says(tmp_path):
    root = make_sweep(tmp_path / "a", "sweep_a")
    assert report_main([root, Path("--out"), tmp_path / "mine"]) == 0
    assert (tmp_path / "mine" / "report.html").exists() and (tmp_path / "mine" / "plotly.min.js").exists()


def test_report_main_compares_sweeps(tmp_path, capsys):
    roots = [make_sweep(tmp_path / "a", "sweep_a"), make_sweep(tmp_path / "b", "sweep_b")]
    assert report_main(roots, tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert "sweep_a" in out and "sweep_b" in out and "publish it with" in out
    assert (tmp_path / "out" / "report.html").exists()


def test_report_main_rejects_a_missing_dir(tmp_path, capsys):
    assert report_main([tmp_path / "nope"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_a_folder_given_twice_and_a_folder_without_runs_are_left_out(tmp_path, capsys):
    """`report A A` compared A with itself and wrote A/compare/A_vs_A; `report results/x/*` took the report's
    own compare/ folder for a sweep and named its output ..._vs_compare."""
    a = make_sweep(tmp_path / "r", "x")
    b = a.with_name("2026-01-02_00-00-00")
    make_sweep(tmp_path / "r2", "x").rename(b)
    assert report_main([a, b]) == 0
    compare = a.parent / "compare"
    assert compare.is_dir() and capsys.readouterr()
    assert report_main(sorted(a.parent.iterdir())) == 0  # a, b and compare/
    err = capsys.readouterr().err
    assert f"{compare} holds no run folder" in err and "_vs_compare" not in " ".join(
        p.name for p in compare.iterdir())
    assert report_main([a, a]) == 0
    err = capsys.readouterr().err
    assert f"{a} is given twice; reported once" in err and not (a / "compare").exists()
