"""The headline's choice and the self-contained HTML report (content only; rendering: tests/integration)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from harness.report.headline import candidates, format_bytes, headline, headlines
from harness.report.html import TITLES, render_html
from harness.report.svg import Row, Series, bar_chart, distribution_chart, nice_ticks
from harness.report.table import summary_frame
from tests.unit.report.synthetic_runs import make_run, make_sweep


@pytest.fixture
def frame(sweep_dir):
    return summary_frame([sweep_dir])


def test_the_fastest_completed_layout_that_fits_is_chosen(frame):
    answer = headline(frame, "synthetic")
    assert answer.best["run"] == "0"  # 256 tokens / 40 ms beats 128 / 30 ms and 256 / 60 ms
    assert answer.runner_up["run"] in ("1", "2")
    assert answer.text.startswith("Use dp2 tp1 zero2 mb2: ")
    assert "tokens/s on 2 devices" in answer.text and "MFU" in answer.text and "of 8 GiB" in answer.text
    assert "2 of 8 runs have not finished" in answer.detail


def test_a_layout_that_does_not_fit_is_never_chosen(frame):
    frame.loc[frame["run"] == "0", "fits"] = False
    assert headline(frame).best["run"] != "0"
    assert "0" not in set(candidates(frame)["run"])


def test_no_completed_run(tmp_path):
    make_run(tmp_path / "s", "a", "RUNNING")
    make_run(tmp_path / "s", "b", "PRUNED", reason="predicted OOM", fits=False)
    answer = headline(summary_frame([tmp_path / "s"]))
    assert answer.best is None
    assert answer.text == "No layout has completed and fit yet."
    assert "1 running, 1 pruned" in answer.detail


def test_one_headline_per_sweep(tmp_path):
    frame = summary_frame([make_sweep(tmp_path / "a", "sweep_a"), make_sweep(tmp_path / "b", "sweep_b")])
    assert [h.sweep for h in headlines(frame)] == ["sweep_a", "sweep_b"]


def test_format_bytes():
    assert format_bytes(3 * 2**30) == "3 GiB"
    assert format_bytes(1.5, gib=True) == "1.5 GiB"
    assert format_bytes(2048) == "2 KiB"
    assert format_bytes(None) == "-"


def test_report_has_every_section_and_the_answer(frame, sweep_dir):
    page = render_html(frame, [sweep_dir])
    for title in ("throughput", "mfu", "memory", "step_times", "status", "results"):
        assert TITLES[title] in page
    assert TITLES["compare"] not in page  # one sweep
    assert "Which layout should I use?" in page
    assert "Use dp2 tp1 zero2 mb2: " in page
    assert page.count('<svg class="plot"') == 4
    assert "rank 1: RuntimeError: NCCL timeout in all_reduce" in page
    assert "tp=3 must divide num_attention_heads=4" in page
    for state in ("COMPLETED", "FAILED", "OOM", "PRUNED", "RUNNING", "PENDING"):
        assert state in page
    results = re.search(r'<table id="results-table".*?</table>', page, re.S).group(0)
    assert results.count("<tr") == 1 + 8
    assert '<tr class="best">' in results


def test_report_is_self_contained(frame, sweep_dir):
    page = render_html(frame, [sweep_dir])
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert "http://" not in page and "https://" not in page


def test_several_sweeps_are_compared(tmp_path):
    roots = [make_sweep(tmp_path / "a", "sweep_a"), make_sweep(tmp_path / "b", "sweep_b")]
    page = render_html(summary_frame(roots), roots)
    assert TITLES["compare"] in page and 'id="compare-table"' in page
    assert "sweep_a · dp2 tp1 zero2 mb2" in page
    assert page.count('class="headline"') == 2


def test_text_is_escaped(tmp_path):
    make_run(tmp_path / "s", "x", "FAILED", reason="<script>alert(1)</script>")
    page = render_html(summary_frame([tmp_path / "s"]), [tmp_path / "s"])
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_empty_report(tmp_path):
    page = render_html(pd.DataFrame(), [tmp_path])
    assert "No runs found." in page and "<svg" not in page


def test_nice_ticks():
    assert nice_ticks(9.2) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.036)[-1] >= 0.036 and len(nice_ticks(0.036)) <= 7
    assert nice_ticks(0) == [0.0, 1.0]


def test_charts_draw_bars_markers_and_dots():
    rows = [Row("a", [[("x", 1.0), ("y", 2.0)], [("z", 2.5)]], [("m", 2.8)]), Row("b", [[]], note="OOM")]
    chart = bar_chart("T", rows,
                      [Series("x", "#111"), Series("y", "#222"), Series("z", "#333"), Series("m", "#444", dashed=True),
                       Series("unused", "#555")], str, "units", "c1")
    assert chart.count('class="bar"') == 3 and chart.count('class="marker"') == 1 and "OOM" in chart
    assert "unused" not in chart  # the legend lists only what is drawn
    dots = distribution_chart("D", [("r", [1.0, 2.0, 3.0]), ("empty", [])], str, "s", "c2")
    assert dots.count('class="dot"') == 3 and "empty" not in dots


def test_two_invocations_of_one_sweep_are_compared(tmp_path):
    roots = [make_sweep(tmp_path / "monday", "grid").parent, make_sweep(tmp_path / "tuesday", "grid").parent]
    page = render_html(summary_frame(roots), roots)
    assert 'id="compare-table"' in page
    assert "grid (monday/grid) · dp2 tp1 zero2 mb2" in page and "grid (tuesday/grid)" in page
