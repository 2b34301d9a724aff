"""Rank 0's live step line and W&B row, the launcher's copy of them, and a sweep's counts and ETA."""

from __future__ import annotations

import io

import pytest

from harness.launch.sweep_progress import SweepProgress, clock, eta_s
from harness.plan.utilization import mfu
from harness.runtime.progress import PROGRESS_FILE, PROGRESS_PREFIX, StepRecord, StepReporter


class FakeTracker:
    def __init__(self):
        self.rows = []

    def log_step(self, row):
        self.rows.append(row)


def reporter(rank=0, tracker=None):
    return StepReporter(rank, total_steps=5, warmup_steps=2, tokens_per_step=256, flops_per_token=1e6,
                        world_size=2, tracker=tracker, kind=None, peak_flops=1e9)


def test_timed_step_line_and_row_carry_throughput_mfu_memory(capsys):
    tracker = FakeTracker()
    report = reporter(tracker=tracker)
    report.metered_bytes = 3 * 2**20
    record = report(2, 5.25, 0.128)
    assert record.tokens_per_s == pytest.approx(2000.0)
    assert record.mfu == pytest.approx(mfu(2000.0, 1e6, 1e9, 2))
    line = capsys.readouterr().out.strip()
    assert line == "[step 3/5] loss 5.2500 | 2,000 tokens/s | MFU 100.0% | memory 3.0 MiB | step time 128 ms"
    assert tracker.rows == [{"step": 3, "loss": 5.25, "step_time_s": 0.128, "tokens_per_s": 2000.0,
                             "mfu": pytest.approx(1.0), "memory_gib": pytest.approx(3 / 1024)}]


def test_warmup_steps_have_loss_only_and_other_ranks_stay_silent(capsys):
    tracker = FakeTracker()
    assert reporter(tracker=tracker)(0, 5.5, None).line() == "[step 1/5 warm-up] loss 5.5000"
    assert tracker.rows == [{"step": 1, "loss": 5.5}]
    capsys.readouterr()
    assert reporter(rank=1, tracker=tracker)(3, 5.0, 0.1) is None
    assert capsys.readouterr().out == "" and len(tracker.rows) == 1


def test_eta_is_mean_run_time_times_runs_left():
    assert eta_s(60.0, 2, 3) == pytest.approx(90.0)
    assert eta_s(5.0, 0, 3) is None
    assert clock(3725) == "1:02:05" and clock(None) == "?"


def test_sweep_progress_counts_done_failed_pruned_remaining():
    from rich.console import Console

    out = io.StringIO()
    with SweepProgress(3, 1, console=Console(file=out, width=120)) as progress:
        progress.finished("000-a", "COMPLETED", "")
        progress.finished("001-b", "FAILED", "rank 1: boom")
    text = out.getvalue()
    assert "1 done, 1 failed, 1 pruned, 1 remaining" in text and "ETA" in text


def test_rank0_appends_each_record_to_the_run_directorys_progress_file(tmp_path, capsys):
    path = tmp_path / PROGRESS_FILE
    path.write_text("an earlier attempt's line\n")
    first = StepReporter(0, 5, 2, 256, 1e6, 2, None, None, 1e9, progress_path=path)
    StepReporter(1, 5, 2, 256, 1e6, 2, None, None, 1e9, progress_path=path)(0, 9.0, None)  # rank 1 writes nothing
    records = [first(0, 5.5, None), first(2, 5.25, 0.128)]
    lines = path.read_text().splitlines()
    assert [StepRecord.from_json_line(line) for line in lines] == records
    assert capsys.readouterr().out.splitlines() == [r.line() for r in records]
