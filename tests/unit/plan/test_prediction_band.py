"""The band of a predicted throughput: the half-width rule on known residuals, the regime of a layout, the fallback
where an engine and regime has too few rows, the committed table against what the current model gives, and the
band on a plan."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.plan import uncertainty
from harness.plan.planner import make_plan
from harness.plan.uncertainty import (
    BAND_FILE,
    Band,
    band,
    device_class,
    half_width,
    overlaps,
    regime,
    regime_of,
    residual,
    uncalibrated_width,
    versus_band,
)


def _tool():
    spec = importlib.util.spec_from_file_location("prediction_band_tool", REPO_ROOT / "tools" / "prediction_band.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_half_width_is_the_conformal_order_statistic_of_the_absolute_residuals():
    # 19 rows: k = ceil(0.9 * 20) = 18, the 18th smallest |residual|, holding 18/20 = 90% of new layouts
    residuals = [(-1) ** i * i / 100 for i in range(1, 20)]
    assert half_width(residuals) == (0.18, 0.9)
    # 10 rows: k = ceil(9.9) = 10, the largest, 10/11
    assert half_width([i / 100 for i in range(1, 11)]) == (0.10, pytest.approx(10 / 11))
    # 3 rows: k would be 4 > 3: the largest, which holds only 3/4; the sign does not matter
    assert half_width([0.02, -0.3, 0.1]) == (0.3, 0.75)
    with pytest.raises(ValueError):
        half_width([])


def test_residual_is_measured_over_predicted_and_converts_the_published_error():
    assert residual(100.0, 91.0) == pytest.approx(-0.09)
    # a published error e = predicted / measured - 1 of +25% is a measurement 20% below the prediction
    assert residual(1.25, 1.0) == pytest.approx(-0.2)


def _layout(**fields):
    base = dict(tp=1, pp=1, cp=1, ep=1, offload_optimizer="none", offload_params="none", precision="bf16")
    return SimpleNamespace(**{**base, **fields})


def test_regime_by_accelerator_family_split_span_and_training_regime():
    assert regime("h100_sxm", _layout()) == "hopper/data-parallel"
    assert regime("cpu", _layout()) == "cpu/data-parallel"
    for axis in ("tp", "pp", "cp", "ep"):
        assert regime("a100_sxm", _layout(**{axis: 2})) == "ampere/model-parallel"
    assert regime("h100_sxm", _layout(tp=2, offload_optimizer="cpu")) == "hopper/offload"
    assert regime("h100_sxm", _layout(offload_params="nvme")) == "hopper/offload"
    assert regime("h100_sxm", _layout(precision="fp8"), compiled=True) == "hopper/data-parallel+compile+fp8"
    # a run over several nodes crosses the network: its own population of errors, one node is the default
    assert regime("h100_sxm", _layout(), nodes=1) == "hopper/data-parallel"
    assert regime("h100_sxm", _layout(), nodes=2) == "hopper/data-parallel+multi-node"
    assert regime("cpu", _layout(tp=2), nodes=2) == "cpu/model-parallel+multi-node"
    assert regime("h100_sxm", _layout(precision="fp8"), compiled=True, nodes=8) == \
        "hopper/data-parallel+multi-node+compile+fp8"


def test_one_gpu_generation_is_one_family_and_any_other_accelerator_stands_alone():
    # the H200 computes as the H100 (harness.plan.hardware), both A100s are one generation
    assert regime("h200", _layout()) == regime("h100_sxm", _layout())
    assert regime("a100_sxm_40gb", _layout()) == regime("a100_sxm", _layout()) == "ampere/data-parallel"
    assert regime("mi300x", _layout()) == "mi300x/data-parallel"
    assert [device_class(regime(a, _layout())) for a in ("cpu", "a100_sxm", "h200", "mi300x")] == \
        ["cpu", "gpu", "gpu", "gpu"]


def test_rows_of_one_family_do_not_calibrate_another(table):
    # hopper's five fsdp rows stand behind a hopper layout; an ampere layout of the same engine and split is
    # uncalibrated: the pooled gpu band widened, every family's rows pooled
    assert band("fsdp", "hopper/data-parallel").calibrated
    ampere = band("fsdp", "ampere/data-parallel")
    assert (ampere.half_width, ampere.rows, ampere.source) == (pytest.approx(0.405), 0, "uncalibrated")


TABLE = {"groups": {
    "fsdp": {"hopper/data-parallel": {"residuals": [-0.05, 0.02, -0.08, 0.01, -0.03]},
             "hopper/model-parallel": {"residuals": [0.3, -0.2]}},
    "nd": {"ampere/model-parallel": {"residuals": [0.1, 0.12, 0.09, 0.11]}},
    "deepspeed": {"cpu/data-parallel": {"residuals": [0.2, -0.1, 0.05]}},
}}


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(uncertainty, "band_table", lambda: TABLE)
    uncertainty.band.cache_clear()
    yield TABLE
    uncertainty.band.cache_clear()


def test_a_group_with_enough_rows_stands_on_its_own(table):
    assert band("fsdp", "hopper/data-parallel") == Band(0.08, 5, "calibrated", "hopper/data-parallel", 5 / 6)
    assert band("nd", "ampere/model-parallel") == Band(0.12, 4, "calibrated", "ampere/model-parallel", 0.8)


def test_a_group_with_too_few_or_no_rows_takes_the_pooled_band_widened(table):
    pooled = [-0.05, 0.02, -0.08, 0.01, -0.03, 0.3, -0.2, 0.1, 0.12, 0.09, 0.11]  # every gpu row, both families
    # 11 rows: k = ceil(10.8) = 11, the largest (0.3); widened by the largest calibrated bias, nd's median 0.105
    assert uncalibrated_width(pooled, [-0.03, 0.105]) == (pytest.approx(0.405), 11 / 12)
    sparse = band("fsdp", "hopper/model-parallel")
    assert (sparse.half_width, sparse.rows, sparse.source) == (pytest.approx(0.405), 2, "uncalibrated")
    unknown = band("megatron_lm", "hopper/model-parallel+fp8")
    assert (unknown.half_width, unknown.rows, unknown.source) == (pytest.approx(0.405), 0, "uncalibrated")
    # cpu: only deepspeed's three rows, none calibrated: the pooled band unwidened
    assert band("nd", "cpu/model-parallel").half_width == 0.2


def test_an_uncalibrated_band_holds_its_own_engines_rows_where_they_miss_by_more(monkeypatch):
    # forty close fsdp rows and four deepspeed rows 18-25% off, none of deepspeed's groups with 4 rows
    small = [(-1) ** i * (i % 5 + 1) / 100 for i in range(40)]
    groups = {"fsdp": {"hopper/data-parallel": {"residuals": small}},
              "deepspeed": {"ampere/data-parallel": {"residuals": [-0.19, -0.2, -0.18]},
                            "hopper/data-parallel": {"residuals": [-0.25]}}}
    monkeypatch.setattr(uncertainty, "band_table", lambda: {"groups": groups})
    uncertainty.band.cache_clear()
    try:
        pooled = uncertainty.pooled_residuals(groups, "gpu")
        # 44 rows: k = ceil(0.9 * 45) = 41, the first of deepspeed's (0.18); widened by fsdp's median bias
        widened, _ = uncalibrated_width(pooled, uncertainty.calibrated_medians(groups, "gpu"))
        assert widened < 0.25
        # deepspeed's four gpu rows, any regime: the largest, 0.25, holding 4/5; every deepspeed gpu regime takes it
        for name in ("hopper/data-parallel", "ampere/data-parallel", "hopper/offload+multi-node"):
            assert band("deepspeed", name) == Band(0.25, len(groups["deepspeed"].get(name, {}).get("residuals", [])),
                                                   "uncalibrated", name, 0.8)
        # an engine without gpu rows, and fsdp's own uncalibrated regimes, keep the widened pooled band
        assert band("nd", "hopper/model-parallel").half_width == pytest.approx(widened)
        assert band("fsdp", "ampere/data-parallel").half_width == pytest.approx(widened)
    finally:
        uncertainty.band.cache_clear()


def test_no_band_without_any_row_of_the_device_class(monkeypatch):
    monkeypatch.setattr(uncertainty, "band_table", lambda: {"groups": {}})
    uncertainty.band.cache_clear()
    try:
        assert band("fsdp", "hopper/data-parallel") is None
    finally:
        uncertainty.band.cache_clear()


def test_where_a_measurement_falls_against_its_band():
    assert versus_band(100.0, 92.0, 0.09) == "inside"
    assert versus_band(100.0, 90.0, 0.09) == "below"
    assert versus_band(100.0, 110.0, 0.09) == "above"
    assert versus_band(100.0, None, 0.09) is None and versus_band(100.0, 95.0, float("nan")) is None


def test_bands_overlap_when_their_intervals_meet():
    nine = Band(0.09, 10, "calibrated", "hopper/data-parallel", 10 / 11)
    assert overlaps(100.0, nine, 84.0, nine)  # 91.0 <= 91.56
    assert not overlaps(100.0, nine, 83.0, nine)  # 91.0 > 90.47
    assert not overlaps(100.0, None, 99.0, None)


def test_the_committed_table_is_what_the_current_model_and_rows_give():
    committed = json.loads(BAND_FILE.read_text())
    assert committed == _tool().current(), "stale: run python tools/prediction_band.py"


def test_the_committed_table_goes_stale_when_a_prediction_moves(monkeypatch):
    tool = _tool()
    rows = tool.gpu_rows()
    moved = [rows[0]._replace(residual=rows[0].residual + 0.01), *rows[1:]]
    monkeypatch.setattr(tool, "gpu_rows", lambda: moved)
    assert json.loads(BAND_FILE.read_text()) != tool.current()


def test_the_recorded_cpu_rows_name_the_engine_and_regime_their_overrides_compose_to():
    with open(REPO_ROOT / "tests" / "data" / "cpu_time_model_residuals.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    assert len(rows) == 27
    for row in rows:
        cfg = compose_run_config(row["overrides"].split())
        assert (cfg.engine.name, regime_of(cfg)) == (row["engine"], row["regime"]), row["run"]


def test_a_plan_carries_the_band_of_its_engine_and_regime():
    cfg = compose_run_config(["recipes=gpu_llama8b_fsdp_8gpu"])
    plan = make_plan(cfg)
    assert plan.prediction_band == band("fsdp", "hopper/data-parallel")
    assert plan.prediction_band.calibrated and plan.to_dict()["prediction_band"]["regime"] == "hopper/data-parallel"
    tp = make_plan(replace(cfg, layout=replace(cfg.layout, tp=2, dp_shard=4)))
    assert tp.prediction_band.regime == "hopper/model-parallel" and not tp.prediction_band.calibrated
    assert make_plan(cfg, predict_time=False).prediction_band is None
    two_nodes = make_plan(compose_run_config(["recipes=gpu_qwen3_32b_fsdp_16gpu"]))
    assert two_nodes.prediction_band == band("fsdp", "hopper/data-parallel+multi-node")
    assert two_nodes.prediction_band.calibrated and two_nodes.prediction_band.rows >= uncertainty.MIN_ROWS


def test_the_published_runs_module_is_read_with_each_rows_engine_regime_and_residual(monkeypatch):
    # tests/published/runs.py's interface: published_runs() -> runs with table, label, engine, config;
    # prediction_error(run) -> predicted / measured - 1
    cfg = compose_run_config(["recipes=gpu_llama8b_fsdp_tp2_8gpu"])
    run = SimpleNamespace(table="a_table", label="row 1", engine=cfg.engine.name, config=cfg)
    fake = SimpleNamespace(published_runs=lambda: [run], prediction_error=lambda r: 0.25)
    monkeypatch.setitem(sys.modules, "tests.published.runs", fake)
    (row,) = _tool().published_rows()
    assert (row.table, row.label, row.engine, row.regime) == ("a_table", "row 1", "fsdp", "hopper/model-parallel")
    assert row.residual == pytest.approx(-0.2)  # 25% optimistic: the measurement 20% under the prediction
