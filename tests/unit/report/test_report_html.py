"""The headline's choice and the self-contained HTML report (content only; rendering: tests/integration)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from harness.report.headline import candidates, headline, headlines
from harness.rundir.vocabulary import format_bytes, format_gib
from harness.report.html import TITLES, render_html
from harness.report.plots import hover_text, noise_warning
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
    assert "tokens/s on 2 devices" in answer.text and "MFU" in answer.text and "of 8.00 GiB" in answer.text
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


def test_several_sweeps_get_one_answer(tmp_path):
    frame = summary_frame([make_sweep(tmp_path / "a", "sweep_a"), make_sweep(tmp_path / "b", "sweep_b")])
    (answer,) = headlines(frame)
    assert answer.sweep == "compared" and answer.best["series"] in ("sweep_a", "sweep_b")


def test_format_bytes():
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_gib(1.5) == "1.50 GiB"
    assert format_bytes(2048) == "0.0 MiB"
    assert format_bytes(None) == "-"


def test_report_has_every_section_and_the_answer(frame, sweep_dir):
    page = render_html(frame, [sweep_dir])
    for title in ("throughput", "mfu", "memory", "step_time_parts", "step_times", "status", "results"):
        assert TITLES[title] in page
    assert TITLES["compare"] not in page  # one sweep
    assert "Which layout should I use?" in page
    assert "Use dp2 tp1 zero2 mb2: " in page
    assert page.count('<div class="plot"') == 5 and page.count("Plotly.newPlot") == 5
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
    assert "sweep_a \\u00b7 dp2 tp1 zero2 mb2" in page  # a plot's label, inside plotly's JSON
    assert page.count('class="headline"') == 1  # one answer across the sweeps, naming its sweep
    # the two sweeps hold the same synthetic runs: the answer names the faster measurement, no winner
    assert re.search(r"Fastest measured: dp2 tp1 zero2 mb2 from sweep_[ab]: ", page)
    assert "No significant difference between dp2 tp1 zero2 mb2 (sweep_" in page
    assert "Best of each sweep: sweep_a: " in page
    # the compare view judges each layout across the sweeps with the same verdict
    assert ("<li>No significant difference between dp2 tp1 zero2 mb2 in sweep_a and dp2 tp1 zero2 mb2 in sweep_b "
            "at this sample size (0.0%") in page


def test_text_is_escaped(tmp_path):
    make_run(tmp_path / "s", "x", "FAILED", reason="<script>alert(1)</script>")
    page = render_html(summary_frame([tmp_path / "s"]), [tmp_path / "s"])
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_empty_report(tmp_path):
    page = render_html(pd.DataFrame(), [tmp_path])
    assert "No runs found." in page and "Plotly.newPlot" not in page


def test_noise_warning_for_few_steps_or_a_wide_spread():
    assert "only 3 timed steps" in noise_warning([0.1, 0.1, 0.1])
    assert "spread 50% of the median" in noise_warning([0.1] * 5 + [0.15])
    assert noise_warning([0.1, 0.101, 0.099, 0.1, 0.1]) is None and noise_warning([]) is None


def test_hover_shows_the_layout_and_the_numbers(frame):
    row = frame[frame["status"] == "COMPLETED"].iloc[0]
    text = hover_text(row)
    assert row["label"] in text and "tokens/s/device: " in text and "MFU: " in text and "step min / max: " in text
    assert "ZeRO-" in text  # the whole layout, not only what differs


def test_layout_columns_come_first_then_measured_and_the_rest_is_picked(frame, sweep_dir):
    page = render_html(frame, [sweep_dir])
    head = re.search(r'<table id="results-table".*?</thead>', page, re.S).group(0)
    cells = re.findall(r'<th data-kind="\w+" data-col="\d+" data-key="(\w+)"( class="off")?>(.*?)</th>', head)
    shown = [header for _, off, header in cells if not off]
    assert shown[:2] == ["layout", "status"]
    for layout in ("tp", "pp", "zero", "micro-batch", "sharding"):
        assert shown.index(layout) < shown.index("tokens/s") < shown.index("loss")
    hidden = [header for _, off, header in cells if off]
    assert "tokens/s CI low" in hidden and "FLOP convention" in hidden and "run" in hidden
    picker = re.search(r'<details class="picker" data-table="results-table">.*?</details>', page, re.S).group(0)
    assert picker.count('type="checkbox"') == len(cells) and picker.count(" checked") == len(shown)


def test_two_invocations_of_one_sweep_are_compared(tmp_path):
    roots = [make_sweep(tmp_path / "monday", "grid").parent, make_sweep(tmp_path / "tuesday", "grid").parent]
    page = render_html(summary_frame(roots), roots)
    assert page.count('class="headline"') == 1
    assert 'id="compare-table"' in page
    assert "grid (monday\\u002fgrid) \\u00b7 dp2 tp1 zero2 mb2" in page and "grid (tuesday/grid)" in page


def test_the_step_time_chart_stacks_the_predicted_parts_beside_the_measured_step(frame):
    from harness.report.html import chart_labels, ordered
    from harness.report.plots import step_time_parts_figure

    view = ordered(frame)
    fig = step_time_parts_figure(view, chart_labels(view))
    measured = next(t for t in fig.data if t.name.startswith("measured"))
    predicted = [t for t in fig.data if t.name.startswith("predicted")]
    assert [t.name for t in predicted] == ["predicted compute", "predicted exposed communication",
                                           "predicted optimizer step", "predicted offload traffic"]
    row = list(view["run"]).index("0")  # run 0 predicts 40 ms: its parts stack to that
    assert sum(t.x[row] for t in predicted) == pytest.approx(40.0)  # in ms: the largest bar is under 1 s
    assert fig.layout.xaxis.ticksuffix == " ms"
    run = frame.set_index("run").loc["0"]
    assert measured.x[row] == pytest.approx(run["step_time_s"] * 1e3)
    assert run["step_time_ratio"] == pytest.approx(run["step_time_s"] / 0.04)
    assert run["pred_time_exposed_comm_s"] == pytest.approx(0.25 * 0.04)


def test_every_measured_bar_has_its_interval_and_a_disturbed_run_is_marked(sweep_dir):
    import json

    metrics_file = sweep_dir / "1" / "metrics.json"
    metrics = json.loads(metrics_file.read_text())
    metrics["measured"]["host"] = {"disturbed": True, "disturbances": ["busy at start: stress (7) 1.0 cores"]}
    metrics_file.write_text(json.dumps(metrics))
    frame = summary_frame([sweep_dir])
    assert {"tokens_per_s_ci_low", "tokens_per_s_ci_high", "step_time_s_ci_low", "mfu_ci_high"} <= set(frame)
    done = frame[frame["status"] == "COMPLETED"]
    assert (done["tokens_per_s_ci_low"] <= done["tokens_per_s"]).all()
    assert (done["tokens_per_s"] <= done["tokens_per_s_ci_high"]).all()
    page = render_html(frame, [sweep_dir])
    assert page.count('"error_x":{') >= 3  # throughput, MFU, step time
    assert "DISTURBED" in page and "busy at start: stress (7) 1.0 cores" in page
