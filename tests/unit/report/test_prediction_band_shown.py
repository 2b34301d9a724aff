"""The band of a predicted tokens/s where predictions are shown: the `harness plan` table and its notes, the
report's run table with where the measurement fell, and the W&B summary."""

from __future__ import annotations

import json

import pytest

from harness.plan.uncertainty import band
from harness.report import plan_view
from harness.report.table import print_table, summary_frame
from harness.rundir import COMPLETED
from harness.runtime.bench import band_summary
from tests.unit.report.synthetic_runs import make_run

FSDP_GPU = band("fsdp", "hopper/data-parallel")


def test_the_plan_table_shows_the_predicted_tokens_per_s_with_its_band_and_says_what_it_is(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    points = plan_view.plan_points(["recipes=gpu_llama8b_fsdp_8gpu"])
    plan_view.print_plan_table(points)
    plan_view.print_messages(points, why=False)
    out = capsys.readouterr().out
    rate = f"{points[0].plan.tokens_per_s:,.0f} (±{FSDP_GPU.half_width:.0%})"
    assert "pred tokens/s (band)" in out and rate in out
    assert (f"note: band ±{FSDP_GPU.half_width:.0%} (hopper/data-parallel): the measured tokens/s lies within it for "
            f"{FSDP_GPU.coverage:.0%} of layouts like the {FSDP_GPU.rows} calibration runs") in out
    assert plan_view.export_rows(points)[0]["tokens_per_s_band"] == FSDP_GPU.half_width


def test_an_uncalibrated_band_is_said_to_be(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    # no public table runs FSDP compiled in FP8: its regime has no rows of its own
    points = plan_view.plan_points(["recipes=gpu_llama8b_fsdp_8gpu", "engine.compile=true", "layout.precision=fp8"])
    plan_view.print_plan_table(points)
    plan_view.print_messages(points, why=False)
    out = capsys.readouterr().out
    assert f"{points[0].plan.tokens_per_s:,.0f} (±" in out and "%*)" in out
    assert "note: * band ±" in out
    assert "(hopper/data-parallel+compile+fp8) is uncalibrated: no calibration run of this engine and regime" in out


def _with_prediction(run_dir, factor, width=0.09):
    """Give a completed run a predicted tokens/s of `factor` x its measured one, with a ±`width` band."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["predicted"].update(tokens_per_s=metrics["measured"]["tokens_per_s"] * factor, tokens_per_s_band=width,
                             band_regime="cpu/data-parallel", band_source="calibrated", band_rows=10)
    (run_dir / "plan.json").write_text(json.dumps(plan))


def test_the_report_puts_the_band_beside_the_measurement_and_says_where_it_fell(tmp_path, capsys, monkeypatch):
    sweep = tmp_path / "s"
    _with_prediction(make_run(sweep, "inside", COMPLETED, zero_stage=1), 1.05)
    _with_prediction(make_run(sweep, "below", COMPLETED, zero_stage=2), 1.5)  # measured a third under
    _with_prediction(make_run(sweep, "above", COMPLETED, zero_stage=3), 0.8)
    frame = summary_frame([sweep]).set_index("run", drop=False)
    assert frame.at["inside", "tokens_per_s_in_band"] == "inside"
    assert frame.at["below", "tokens_per_s_in_band"] == "below"
    assert frame.at["above", "tokens_per_s_in_band"] == "above"
    assert frame.at["inside", "tokens_per_s_band"] == 0.09 and frame.at["inside", "band_rows"] == 10
    monkeypatch.delenv("COLUMNS", raising=False)
    print_table(frame.reset_index(drop=True))
    out = capsys.readouterr().out
    assert "tokens/s pred" in out and "measured vs band" in out
    predicted = frame.at["inside", "tokens_per_s_predicted"]
    assert f"{predicted:,.0f} (±9%)" in out


def test_the_wandb_summary_holds_the_band_and_where_the_measurement_fell():
    predicted = {"tokens_per_s": 1000.0, "tokens_per_s_band": 0.09, "band_regime": "hopper/data-parallel",
                 "band_source": "calibrated", "band_rows": 10}
    assert band_summary(predicted, 950.0) == {**{k: v for k, v in predicted.items() if k != "tokens_per_s"},
                                              "tokens_per_s_predicted_low": pytest.approx(910.0),
                                              "tokens_per_s_predicted_high": pytest.approx(1090.0),
                                              "tokens_per_s_in_band": "inside"}
    assert band_summary(predicted, 800.0)["tokens_per_s_in_band"] == "below"
    assert band_summary({"tokens_per_s": 1000.0}, 800.0)["tokens_per_s_in_band"] is None


def test_the_throughput_plot_draws_each_prediction_with_its_band(tmp_path):
    from harness.report.plots import throughput_figure

    sweep = tmp_path / "s"
    _with_prediction(make_run(sweep, "a", COMPLETED, zero_stage=1), 1.05)
    frame = summary_frame([sweep]).reset_index(drop=True)
    fig = throughput_figure(frame, {i: f"run {i}" for i in frame.index}, set())
    predicted = next(trace for trace in fig.data if trace.name == "predicted (band)")
    per_device = frame.at[0, "tokens_per_s_predicted"] / frame.at[0, "world_size"]
    assert predicted.x[0] == pytest.approx(per_device)
    assert predicted.error_x.array[0] == pytest.approx(0.09 * per_device)
    assert "band: ±9%" in predicted.hovertext[0] and "measured vs band: inside" in predicted.hovertext[0]
