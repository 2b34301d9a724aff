"""Every key the console tables, summary.csv, the report and W&B emit is a figure of one vocabulary, and one
figure reads the same (header, unit, format) wherever it is shown."""

from __future__ import annotations

import json
import re
from html import unescape

import pandas as pd
import pytest

from harness.launch.status import MEASURED_HEADERS, MEASURED_KEYS, STATUS_KEYS, print_status, refresh
from harness.report.headline import headline
from harness.report.html import chart_labels, ordered, render_html
from harness.report.plots import memory_figure
from harness.report.table import MEASURED_CELLS, TERMINAL_COLUMNS, measured_cells, print_table, write_summary
from harness.report.wandb_report import HISTORY_KEYS
from harness.rundir import SUMMARY_CSV, run_dirs
from harness.rundir.stats import step_stats
from harness.rundir.vocabulary import (
    FIGURES,
    GROUPS,
    format_bytes,
    format_seconds,
    header,
    ordered_keys,
    sharding_words,
    unknown_keys,
)
from harness.runtime.bench import _flat_summary
from harness.runtime.progress import StepRecord
from tests.unit.report.synthetic_runs import make_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    sweep_dir = make_sweep(tmp_path_factory.mktemp("vocabulary") / "results", "grid")
    return sweep_dir, write_summary(sweep_dir)


def test_every_figure_has_one_key_one_header_and_a_known_group():
    keys = [figure.key for figure in FIGURES]
    headers = [figure.header for figure in FIGURES]
    assert len(set(keys)) == len(keys), "a key listed twice"
    assert len(set(headers)) == len(headers), [h for h in headers if headers.count(h) > 1]
    assert {figure.group for figure in FIGURES} <= set(GROUPS)


def test_every_summary_csv_and_parquet_column_is_in_the_vocabulary(sweep):
    sweep_dir, frame = sweep
    csv = pd.read_csv(sweep_dir / SUMMARY_CSV)
    assert unknown_keys(csv.columns) == []
    assert unknown_keys(frame.columns) == []


def test_every_wandb_summary_and_history_key_is_in_the_vocabulary(sweep):
    sweep_dir, _ = sweep
    payload = json.loads((sweep_dir / "0" / "metrics.json").read_text())
    measured = payload["measured"]
    # As a real run records them: the statistics, their intervals and the host's verdict.
    measured["step_stats"] = step_stats(measured["step_times_s"]).to_dict()
    measured["intervals"] = {"tokens_per_s": [1.0, 2.0], "mfu": [0.01, 0.02]}
    measured["host"] = {"disturbed": False, "disturbances": []}
    summary = _flat_summary(payload)
    assert unknown_keys(summary) == []
    # One key per figure: MFU is `mfu` (a fraction) in the summary, the history and summary.csv alike.
    assert "mfu_pct" not in summary and summary["mfu"] == pytest.approx(payload["measured"]["mfu"])
    record = StepRecord(3, 5, False, 5.25, 0.128, 2000.0, 0.5, 3 * 2**20)
    assert unknown_keys(record.wandb_row()) == [] and unknown_keys(HISTORY_KEYS) == []


def test_every_console_and_report_column_is_in_the_vocabulary(sweep):
    sweep_dir, frame = sweep
    assert unknown_keys([key for key, _ in TERMINAL_COLUMNS]) == []
    assert unknown_keys([*MEASURED_CELLS, *MEASURED_KEYS, *STATUS_KEYS]) == []
    page = render_html(frame, [sweep_dir])
    head = re.search(r'<table id="results-table".*?</thead>', page, re.S).group(0)
    keyed = re.findall(r'data-key="(\w+)"[^>]*>(.*?)</th>', head)
    assert keyed and unknown_keys(key for key, _ in keyed) == []
    # The report's header of each figure is the vocabulary's.
    assert all(unescape(text) == header(key) for key, text in keyed)


def test_one_figure_has_one_header_in_every_table_and_the_step_line(sweep, capsys, monkeypatch):
    sweep_dir, frame = sweep
    monkeypatch.delenv("COLUMNS", raising=False)
    print_table(frame.reset_index(drop=True), wide=True)
    run_table = capsys.readouterr().out
    print_status(str(sweep_dir), refresh(run_dirs(sweep_dir), query_slurm=False), measured=measured_cells(frame),
                 wide=True)
    sweep_table = capsys.readouterr().out
    line = StepRecord(3, 5, False, 5.25, 0.0314, 8155.0, 0.028, 2**20).line()
    for key in ("status", "tokens_per_s", "mfu", "mem_state_activation_gib"):
        assert header(key) in run_table and header(key) in sweep_table, key
    assert "state " not in sweep_table.splitlines()[1] and MEASURED_HEADERS == ("tokens/s", "MFU", "memory")
    for key in ("tokens_per_s", "mfu", "mem_state_activation_gib", "step_time_s"):
        assert header(key) in line, key
    assert line.endswith("| 8,155 tokens/s | MFU 2.8% | memory 1.0 MiB | step time 31.4 ms"), line


def test_times_and_memory_follow_one_rule_each():
    assert format_seconds(0.0314) == "31.4 ms" and format_seconds(4.02) == "4.02 s"
    assert format_seconds(1234.0) == "1,234 s" and format_seconds(None) == "-"
    assert format_bytes(812.3 * 2**20) == "812.3 MiB" and format_bytes(1.5 * 2**30) == "1.50 GiB"


def test_the_headline_says_a_long_step_in_seconds(sweep):
    _, frame = sweep
    slow = frame.copy()
    slow["step_time_s"] = slow["step_time_s"] * 100  # about 4 s per step
    text = headline(slow).text
    assert re.search(r"step time \d\.\d\d s", text), text
    assert "e+" not in text


def test_the_memory_axis_is_binary_not_decimal(sweep):
    _, frame = sweep
    view = ordered(frame)
    fig, _ = memory_figure(view, chart_labels(view))
    assert fig.layout.xaxis.ticksuffix in (" MiB", " GiB")
    assert "s" not in (fig.layout.xaxis.tickformat or "")  # plotly's `s` format is decimal SI (kB, MB)
    bytes_row = view.iloc[0]
    bar = next(trace for trace in fig.data if trace.name == "measured parameters")
    scale = 2**20 if fig.layout.xaxis.ticksuffix == " MiB" else 2**30
    assert bar.x[0] == pytest.approx(bytes_row["param_bytes"] / scale)


def test_layout_columns_come_before_the_measured_ones():
    keys = ordered_keys(["mfu", "tp", "step_time_predicted_s", "label", "zero_stage", "flop_convention"])
    assert keys == ["label", "tp", "zero_stage", "mfu", "step_time_predicted_s", "flop_convention"]


@pytest.mark.parametrize("engine, stage, replicas, words", [
    ("deepspeed", 2, 1, "ZeRO-2"), ("deepspeed", 3, 1, "ZeRO-3"),
    ("fsdp", 2, 1, "SHARD_GRAD_OP"), ("fsdp", 3, 1, "FULL_SHARD"), ("fsdp", 3, 2, "HYBRID_SHARD"),
    ("nd", 3, 1, "FSDP2 reshard"), ("nd", 2, 1, "FSDP2 keep"), ("nd", 3, 2, "HSDP (FSDP2 reshard)"),
    ("nd", 0, 1, "replicate"), ("megatron_lm", 1, 1, "distributed optimizer"), (None, 2, 1, "-"),
    # a refused zero_stage=1 point was labelled SHARD_GRAD_OP (or replicate), a strategy it never ran under
    ("fsdp", 1, 1, "zero_stage 1"), ("fsdp", 1, 2, "zero_stage 1"), ("nd", 1, 1, "zero_stage 1"),
])
def test_sharding_is_named_in_the_engines_own_words(engine, stage, replicas, words):
    assert sharding_words(engine, stage, replicas) == words


def test_the_report_names_each_runs_sharding_in_its_engines_words(sweep):
    sweep_dir, frame = sweep
    page = render_html(frame, [sweep_dir])
    body = re.search(r'<table id="results-table".*?</table>', page, re.S).group(0)
    assert 'data-key="sharding"' in body
    engines = set(frame["engine"].dropna())
    expected = {sharding_words(e, s, r) for e, s, r in zip(frame["engine"], frame["zero_stage"], frame["dp_replicate"])
                if e in engines}
    for words in expected - {"-"}:
        assert f'data-key="sharding">{words}<' in body



def test_the_layout_in_words_names_fsdp_sharding_as_fsdp_does():
    from harness.report.headline import layout_summary

    assert "SHARD_GRAD_OP" in layout_summary({"engine": "fsdp", "dp_shard": 2, "zero_stage": 2})
    assert "ZeRO" not in layout_summary({"engine": "nd", "dp_shard": 2, "zero_stage": 3})


def test_the_step_time_box_axis_follows_the_time_rule(sweep):
    from harness.report.plots import step_time_figure

    _, frame = sweep
    view = ordered(frame)
    done = view[view["status"] == "COMPLETED"]
    fig = step_time_figure(done, chart_labels(view))
    assert fig.layout.xaxis.ticksuffix == " ms"  # 30-60 ms steps
    assert max(max(trace.x) for trace in fig.data) == pytest.approx(1e3 * max(max(t) for t in done["step_times_s"]))


def test_fsdp_and_nd_runs_are_not_labelled_by_a_zero_stage():
    from harness.report.table import layout_labels

    frame = pd.DataFrame([{"engine": "fsdp", "zero_stage": 2, "dp_replicate": 1, "tp": 1},
                          {"engine": "nd", "zero_stage": 3, "dp_replicate": 1, "tp": 2},
                          {"engine": "deepspeed", "zero_stage": 2, "dp_replicate": 1, "tp": 1}])
    assert list(layout_labels(frame)) == ["fsdp tp1 SHARD_GRAD_OP", "nd tp2 FSDP2-reshard", "deepspeed tp1 zero2"]
