"""Aggregation: one row per run dir of a sweep caught mid-way (completed, failed, OOM, pruned, running, pending)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from harness.report.table import (
    SUMMARY_CSV,
    SUMMARY_PARQUET,
    print_rows,
    print_table,
    run_dirs,
    run_row,
    summary_frame,
    write_frame,
    write_summary,
)
from harness.rundir import write_status
from tests.unit.report.synthetic_runs import GIB, make_run, make_sweep

EXPECTED_COLUMNS = [
    "sweep", "run", "label", "status", "reason", "engine", "model", "cluster", "world_size", "layout",
    "dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch", "grad_accum", "seq_len",
    "activation_checkpointing", "precision", "tokens_per_s", "tokens_per_s_per_device", "step_time_s",
    "tflop_per_s_per_device", "mfu", "hfu", "flop_convention", "mem_state_activation_gib", "mem_allocated_peak_gib",
    "mem_measured_gib", "mem_predicted_gib", "mem_ratio", "mfu_predicted", "mfu_ratio", "device_memory_gib",
    "fits", "loss_final", "step_times_s",
]


@pytest.fixture
def frame(sweep_dir):
    return summary_frame([sweep_dir]).set_index("run", drop=False)


def test_one_row_per_run_dir_with_every_column(frame, sweep_dir):
    assert len(run_dirs(sweep_dir)) == 8
    assert list(frame["run"]) == [str(i) for i in range(8)]
    assert [c for c in EXPECTED_COLUMNS if c not in frame.columns] == []


def test_states_and_reasons(frame):
    assert dict(frame["status"]) == {"0": "COMPLETED", "1": "COMPLETED", "2": "COMPLETED", "3": "FAILED",
                                     "4": "OOM", "5": "PRUNED", "6": "RUNNING", "7": "PENDING"}
    # FAILED with no reason in status.json: the failing rank's structured error is the reason.
    assert frame.at["3", "reason"] == "rank 1: RuntimeError: NCCL timeout in all_reduce"
    assert frame.at["4", "reason"].startswith("rank 1: OutOfMemoryError")
    assert frame.at["5", "reason"] == "tp=3 must divide num_attention_heads=4"
    assert frame.at["6", "reason"] == "" and frame.at["7", "reason"] == ""


def test_unfinished_runs_have_layout_but_no_measurement(frame):
    for run in ("3", "4", "5", "6", "7"):
        assert pd.isna(frame.at[run, "tokens_per_s"]), run
        assert frame.at[run, "step_times_s"] is None
    assert frame.at["6", "micro_batch"] == 4 and frame.at["7", "zero_stage"] == 3
    assert frame.at["5", "tp"] == 3


def test_measured_numbers_come_from_metrics_json(frame, sweep_dir):
    metrics = json.loads((sweep_dir / "0" / "metrics.json").read_text())
    measured = metrics["measured"]
    row = frame.loc["0"]
    assert row["tokens_per_s"] == measured["tokens_per_s"]
    assert row["tokens_per_s_per_device"] == pytest.approx(row["tokens_per_s"] / 2)
    assert row["step_time_s"] == measured["step_time_s"]
    assert row["step_time_min_s"] == min(measured["step_times_s"])
    assert row["mfu"] == measured["mfu"] and row["hfu"] == measured["hfu"]
    assert row["flop_convention"] == metrics["flop_convention"]
    assert row["loss_final"] == measured["loss_final"]
    assert list(row["step_times_s"]) == measured["step_times_s"]
    assert row["engine"] == "deepspeed" and row["model"] == "tiny_llama" and row["cluster"] == "cpu"
    assert row["world_size"] == 2


def test_memory_is_the_largest_rank_sum_beside_the_prediction(frame):
    row = frame.loc["0"]
    # rank 1 holds 1000 more activation bytes than rank 0
    largest_rank = 213632 + 106816 + 640896 + 833004
    assert row["mem_state_activation_gib"] * GIB == pytest.approx(largest_rank)
    assert row["mem_measured_gib"] == row["mem_state_activation_gib"]  # CPU: no allocator peak
    predicted_terms = 213632 + 106816 + (213632 + 427264) + 832004
    assert row["mem_ratio"] == pytest.approx(largest_rank / predicted_terms)
    assert row["mem_predicted_gib"] * GIB == pytest.approx(predicted_terms + 179334)
    assert row["device_memory_gib"] == 8.0
    assert row["fits"] is True or row["fits"] == True  # noqa: E712


def test_allocator_peak_is_the_measured_memory_where_present(tmp_path):
    run_dir = make_run(tmp_path, "gpu", "COMPLETED", peak_allocated_bytes=3 * GIB)
    row = run_row(run_dir)
    assert row["mem_allocated_peak_gib"] == 3.0
    assert row["mem_measured_gib"] == 3.0
    assert row["mem_peak_ratio"] == pytest.approx(3 * GIB / (row["mem_predicted_gib"] * GIB))


def test_predicted_mfu_and_ratio(frame):
    assert frame.at["0", "mfu_predicted"] == 0.02
    assert frame.at["0", "mfu_ratio"] == pytest.approx(frame.at["0", "mfu"] / 0.02)
    assert pd.isna(frame.at["2", "mfu_predicted"]) and pd.isna(frame.at["2", "mfu_ratio"])


def test_fit_is_measured_or_predicted(frame):
    assert frame.at["4", "fits"] is False  # OOM
    assert frame.at["5", "fits"] is None  # pruned, plan could not say
    assert frame.at["6", "fits"] is True  # running: the plan's verdict


def test_labels_name_the_axes_that_vary(frame):
    assert frame.at["0", "label"] == "dp2 tp1 zero2 mb2"
    assert frame.at["5", "label"] == "dp1 tp3 zero2 mb1"
    assert frame.at["4", "label"] == "dp2 tp1 zero0 mb8"
    assert frame["label"].str.contains("bf16").sum() == 0  # precision is the same everywhere


def test_folder_names_are_never_read(tmp_path):
    run_dir = make_run(tmp_path / "zero3_mb8_sweepX", "zero3_mb8", "COMPLETED", sweep="real_sweep", zero_stage=1)
    row = run_row(run_dir)
    assert row["zero_stage"] == 1 and row["micro_batch"] == 1 and row["sweep"] == "real_sweep"


def test_a_run_dir_with_only_a_status_file(tmp_path):
    write_status(tmp_path / "sweep" / "bare", "PENDING")
    frame = summary_frame([tmp_path / "sweep"])
    assert list(frame["status"]) == ["PENDING"] and frame.at[0, "engine"] is None


def test_several_sweeps_at_once(tmp_path):
    first, second = make_sweep(tmp_path / "a", "sweep_a"), make_sweep(tmp_path / "b", "sweep_b")
    frame = summary_frame([first, second])
    assert sorted(frame["sweep"].unique()) == ["sweep_a", "sweep_b"]
    assert len(frame) == 16
    a, b = (frame[frame["sweep"] == s].set_index("run")["label"] for s in ("sweep_a", "sweep_b"))
    assert (a == b).all()  # the same layout gets the same label in both sweeps


def test_csv_and_parquet(frame, tmp_path):
    out = tmp_path / "out"
    paths = write_frame(frame.reset_index(drop=True), out)
    csv = pd.read_csv(paths["csv"])
    parquet = pd.read_parquet(paths["parquet"])
    assert len(csv) == len(parquet) == 8
    assert "step_times_s" not in csv.columns and "step_times_s" in parquet.columns
    assert list(parquet["step_times_s"][0]) == list(frame.at["0", "step_times_s"])
    assert csv.loc[csv["run"] == 3, "reason"].item().startswith("rank 1: RuntimeError")
    assert math.isclose(csv.loc[csv["run"] == 0, "tokens_per_s"].item(), frame.at["0", "tokens_per_s"])
    assert sorted(p.name for p in out.iterdir()) == [SUMMARY_CSV, SUMMARY_PARQUET]  # no temporary left


def test_write_summary_keeps_its_contract(sweep_dir):
    frame = write_summary(sweep_dir)
    assert (sweep_dir / SUMMARY_CSV).exists() and (sweep_dir / SUMMARY_PARQUET).exists()
    assert len(frame) == 8


def test_terminal_table(frame, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # not a terminal, no COLUMNS: every column
    print_table(frame.reset_index(drop=True), title="synthetic")
    out = capsys.readouterr().out
    for text in ("synthetic", "COMPLETED", "PRUNED", "RUNNING", "tokens/s/device", "MFU pred", "step time pred"):
        assert text in out
    print_rows([{"a": 1, "b": 0.5}], title="rows")
    assert "rows" in capsys.readouterr().out


def test_one_sweep_name_in_two_folders_is_two_series(tmp_path):
    first, second = make_sweep(tmp_path / "monday", "grid"), make_sweep(tmp_path / "tuesday", "grid")
    frame = summary_frame([first.parent.parent.parent / "monday", second.parent.parent.parent / "tuesday"])
    assert set(frame["sweep"]) == {"grid"}
    assert sorted(frame["series"].unique()) == ["grid (monday)", "grid (tuesday)"]
    assert summary_frame([first])["series"].unique().tolist() == ["grid"]


def test_a_standin_row_names_its_recipe_and_the_status_table_what_it_did_not_execute(tmp_path):
    from harness.report.html import status_table

    run_dir = make_run(tmp_path, "000-standin", "COMPLETED")
    config = json.loads((run_dir / "config.json").read_text())
    config["standin"] = {"of": "gpu_x", "not_executed": ["NCCL collectives (gloo; on CPU)", "CUDA memory statistics"]}
    (run_dir / "config.json").write_text(json.dumps(config))
    make_run(tmp_path, "001-plain", "COMPLETED")
    frame = summary_frame([tmp_path]).set_index("run", drop=False)
    assert frame.loc["000-standin", "standin_of"] == "gpu_x"
    assert frame.loc["000-standin", "not_executed"] == "NCCL collectives (gloo; on CPU) | CUDA memory statistics"
    assert pd.isna(frame.loc["001-plain", "standin_of"])
    html = status_table(frame)
    assert "CPU stand-in: not executed" in html and "of gpu_x: NCCL collectives; CUDA memory statistics" in html
    assert "not executed" not in status_table(frame[frame["run"] == "001-plain"])
