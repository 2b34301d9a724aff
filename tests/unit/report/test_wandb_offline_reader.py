"""A W&B offline run made the way the runtime makes it (sinks.WandbRun, its environment) reads back with
the numbers of metrics.json."""

from __future__ import annotations

import json

import pytest

from harness.config.schema import TrackingConfig
from harness.report.wandb_offline import (
    WandbFileError,
    offline_run_files,
    read_offline_config,
    read_offline_run,
    read_offline_run_info,
    record_payloads,
    run_finished,
    wait_until_finished,
)
from harness.report.wandb_report import HISTORY_KEYS, MEMORY_KEYS, THROUGHPUT_KEY, UTILIZATION_KEYS
from harness.rundir import COMPLETED, RUNNING
from harness.runtime.progress import StepReporter
from harness.runtime.sinks import WandbRun, wandb_environment

from tests.unit.report.synthetic_runs import make_run

WARMUP_STEPS = 2


def _rows_and_summary(payload):
    """What the runtime hands the W&B run: rank 0's row per step, made by the same StepReporter (step times,
    throughput and MFU for the timed steps only), and the summary bench.write_result adds at the end."""
    measured = payload["measured"]
    timed = [None] * WARMUP_STEPS + measured["step_times_s"]
    tracker = Rows()
    reporter = StepReporter(0, len(timed), WARMUP_STEPS, payload["tokens_per_step"], payload["flops_per_token"],
                            payload["world_size"], tracker, None, measured["peak_flop_per_s_per_device"])
    reporter.metered_bytes = measured["param_bytes"] + measured["activation_bytes"]
    for step, (loss, seconds) in enumerate(zip(measured["losses"], timed)):
        reporter(step, loss, seconds)
    summary = {k: v for k, v in measured.items() if not isinstance(v, (list, dict))}
    summary.update(flop_convention=payload["flop_convention"], flops_per_token=payload["flops_per_token"])
    return tracker.rows, summary


class Rows:
    def __init__(self):
        self.rows = []

    def log_step(self, row):
        self.rows.append(row)


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """One completed run dir with metrics.json and the W&B offline run that rank 0 writes beside it."""
    root = tmp_path_factory.mktemp("wandb_offline")
    run_dir = make_run(root / "sweep", "0", RUNNING, sweep="offline_sweep", zero_stage=2)
    make_run(root / "sweep", "0", COMPLETED, sweep="offline_sweep", zero_stage=2)
    payload = json.loads((run_dir / "metrics.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    tracking = TrackingConfig(mode="offline")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("WANDB_API_KEY", raising=False)
        for key, value in wandb_environment(run_dir, tracking).items():
            patch.setenv(key, value)
        run = WandbRun(run_dir, tracking, name=run_dir.name, group=config["sweep_name"],
                       job_type=config["engine"]["name"], config=config)
        assert run.run is not None, run.error
        rows, summary = _rows_and_summary(payload)
        for row in rows:
            run.log_step(row)
        run.finish(summary)
        assert run.error is None, run.error
    files = offline_run_files(run_dir)
    assert len(files) == 1, files
    assert wait_until_finished(files[0], timeout_s=60), "no exit record in the .wandb file after 60 s"
    return run_dir, files[0], payload, config


def test_files_stay_inside_the_run_dir(offline_run):
    run_dir, path, _, _ = offline_run
    assert path.is_relative_to(run_dir / "wandb")


def test_history_holds_every_loss_and_timed_step(offline_run):
    _, path, payload, _ = offline_run
    history, _ = read_offline_run(path)
    measured = payload["measured"]
    assert [row["_step"] for row in history] == list(range(len(measured["losses"])))
    assert [row["loss"] for row in history] == pytest.approx(measured["losses"], rel=1e-12)
    timed = [row["step_time_s"] for row in history if "step_time_s" in row]
    assert timed == pytest.approx(measured["step_times_s"], rel=1e-12)


@pytest.mark.parametrize("key", ["tokens_per_s", "tokens_per_s_per_device", "tflop_per_s_per_device", "mfu", "hfu",
                                 "param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes",
                                 "loss_first", "loss_final", "peak_flop_per_s_per_device"])
def test_summary_holds_the_measured_numbers(offline_run, key):
    _, path, payload, _ = offline_run
    _, summary = read_offline_run(path)
    assert summary[key] == pytest.approx(payload["measured"][key], rel=1e-12)


def test_summary_holds_the_flop_convention(offline_run):
    _, path, payload, _ = offline_run
    _, summary = read_offline_run(path)
    assert summary["flop_convention"] == payload["flop_convention"]
    assert summary["flops_per_token"] == payload["flops_per_token"]
    assert summary["peak_allocated_bytes"] is None  # CPU: no allocator, logged as null


def test_summary_step_time_is_the_median(offline_run):
    _, path, payload, _ = offline_run
    _, summary = read_offline_run(path)
    assert summary["step_time_s"] == pytest.approx(payload["measured"]["step_time_s"], rel=1e-12)


def test_every_key_the_report_spec_plots_is_in_the_run(offline_run):
    _, path, _, _ = offline_run
    history, summary = read_offline_run(path)
    for key in (THROUGHPUT_KEY, *UTILIZATION_KEYS, *MEMORY_KEYS):
        assert key in summary, key
    for key in HISTORY_KEYS:
        assert any(key in row for row in history), key


def test_config_and_run_record(offline_run):
    _, path, _, config = offline_run
    logged = read_offline_config(path)
    assert logged["layout"] == config["layout"]
    assert logged["sweep_name"] == "offline_sweep"
    info = read_offline_run_info(path)
    assert info["group"] == "offline_sweep"
    assert info["job_type"] == config["engine"]["name"]
    assert info["name"] == "0"


def test_a_torn_tail_reads_up_to_the_last_whole_record(offline_run, tmp_path):
    _, path, _, _ = offline_run
    whole = list(record_payloads(path))
    torn = tmp_path / "torn.wandb"
    torn.write_bytes(path.read_bytes()[: path.stat().st_size - 10])
    read = list(record_payloads(torn))
    assert read == whole[: len(read)] and 0 < len(read) < len(whole)
    assert run_finished(path) and not run_finished(torn)


def test_a_flipped_byte_is_reported(offline_run, tmp_path):
    _, path, _, _ = offline_run
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    bad = tmp_path / "bad.wandb"
    bad.write_bytes(bytes(data))
    with pytest.raises(WandbFileError, match="corrupt chunk"):
        list(record_payloads(bad))


def test_not_a_wandb_file(tmp_path):
    other = tmp_path / "x.wandb"
    other.write_bytes(b"PK\x03\x04 not a transaction log")
    with pytest.raises(WandbFileError, match="header"):
        list(record_payloads(other))
