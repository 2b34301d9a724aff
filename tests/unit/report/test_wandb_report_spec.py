"""The W&B report spec: panels, the sweep's group filter, built and reloaded with no network."""

from __future__ import annotations

import json
from pathlib import Path
import time

import pytest
import wandb
import wandb_workspaces.reports.v2 as wr

from harness.report.table import summary_frame
from harness.report.wandb_report import (
    MEMORY_KEYS,
    PANEL_TITLES,
    THROUGHPUT_KEY,
    group_filter,
    load_spec,
    online,
    publish_environment,
    publish_with_timeout,
    report_spec,
    spec_dict,
    write_spec,
)
from tests.unit.report.synthetic_runs import make_sweep


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any W&B API call fails the test: the spec must build from local files alone."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    def refuse(*args, **kwargs):
        raise AssertionError("the report spec touched the W&B API")

    monkeypatch.setattr(wandb, "Api", refuse)


@pytest.fixture
def report(sweep_dir):
    return report_spec(summary_frame([sweep_dir]))


def _grid(report):
    grids = [block for block in report.blocks if isinstance(block, wr.PanelGrid)]
    assert len(grids) == 1
    return grids[0]


def test_heading_and_description(report):
    assert isinstance(report.blocks[0], wr.H1) and report.blocks[0].text == "Which layout should I use?"
    assert "Use dp2 tp1 zero2 mb2" in report.description
    assert report.title == "Benchmark sweep synthetic"
    assert report.project == "harness" and report.entity == ""


def test_runset_is_the_sweeps_group(report):
    (runset,) = _grid(report).runsets
    assert runset.name == "synthetic"
    assert "Group" in runset.filters and "synthetic" in runset.filters
    assert runset.entity == "" and runset.project == ""  # filled at serialisation would mean a lookup
    spec = spec_dict(report)
    (grid,) = [b for b in spec["spec"]["blocks"] if b["type"] == "panel-grid"]
    (runset_spec,) = grid["metadata"]["runSets"]
    assert runset_spec["filters"]["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": "synthetic", "disabled": False}]
    grouping = {g["name"] for g in runset_spec["grouping"]}
    assert {"layout.value.zero_stage", "layout.value.micro_batch", "layout.value.tp"} <= grouping


def test_panels(report):
    panels = _grid(report).panels
    bars = {p.title: p for p in panels if isinstance(p, wr.BarPlot)}
    assert set(bars) == {PANEL_TITLES[k] for k in ("throughput", "mfu", "memory", "predicted_throughput",
                                                   "predicted_time", "predicted_parts")}
    # measured tokens/s beside the predicted one and its band's ends (harness/runtime/bench.py band_summary)
    assert [m.name for m in bars[PANEL_TITLES["predicted_throughput"]].metrics] == [
        "tokens_per_s", "tokens_per_s_predicted_low", "tokens_per_s_predicted", "tokens_per_s_predicted_high"]
    # the runtime's summary keys (harness/runtime/bench.py _flat_summary): measured beside predicted
    assert [m.name for m in bars[PANEL_TITLES["predicted_time"]].metrics] == ["step_time_s", "step_time_predicted_s"]
    assert [m.name for m in bars[PANEL_TITLES["predicted_parts"]].metrics] == [
        "pred_time_compute_s", "pred_time_exposed_comm_s", "pred_time_bubble_s",
        "pred_time_optimizer_s", "pred_time_offload_s"]
    # a panel draws only keys a run's summary has: every one is a figure of the one vocabulary
    from harness.rundir.vocabulary import BY_KEY
    unknown = [m.name for bar in bars.values() for m in bar.metrics if m.name not in BY_KEY]
    assert not unknown, f"W&B panels name keys no run writes: {unknown}"
    assert [m.name for m in bars[PANEL_TITLES["throughput"]].metrics] == [THROUGHPUT_KEY]
    assert [m.name for m in bars[PANEL_TITLES["mfu"]].metrics] == ["mfu", "hfu"]
    assert [m.name for m in bars[PANEL_TITLES["memory"]].metrics] == list(MEMORY_KEYS)
    (parallel,) = [p for p in panels if isinstance(p, wr.ParallelCoordinatesPlot)]
    assert parallel.title == PANEL_TITLES["parallel"]
    axes = [c.metric.name for c in parallel.columns]
    assert {"layout.zero_stage", "layout.micro_batch", "layout.tp", THROUGHPUT_KEY, "mfu"} <= set(axes)
    assert len([p for p in panels if isinstance(p, wr.RunComparer)]) == 1
    spec = json.dumps(spec_dict(report))
    for view in ("Bar Chart", "Parallel Coordinates Plot", "Run Comparer"):
        assert f'"viewType": "{view}"' in spec
    assert "summary_metrics.tokens_per_s_per_device" in spec
    assert "config:layout.value.zero_stage" in spec


def test_several_sweeps_get_one_runset_each(tmp_path):
    frame = summary_frame([make_sweep(tmp_path / "a", "sweep_a"), make_sweep(tmp_path / "b", "sweep_b")])
    runsets = _grid(report_spec(frame)).runsets
    assert [r.name for r in runsets] == ["sweep_a", "sweep_b"]
    assert [json.loads(r.filters.split("==")[1]) for r in runsets] == ["sweep_a", "sweep_b"]


def test_group_filter_quotes():
    assert group_filter(["a"]) == "Metric('Group') == \"a\""
    assert group_filter(["a", "b"]) == "Metric('Group') in [\"a\", \"b\"]"


def test_spec_round_trips_through_its_json(report, tmp_path):
    path = write_spec(report, tmp_path / "wandb_report.json")
    loaded = load_spec(path)
    assert loaded.title == report.title and loaded.description == report.description
    assert [type(p).__name__ for p in _grid(loaded).panels] == [type(p).__name__ for p in _grid(report).panels]
    assert spec_dict(loaded)["spec"]["blocks"] == spec_dict(report)["spec"]["blocks"]


def test_online_only_with_a_key_and_online_runs(sweep_dir):
    frame = summary_frame([sweep_dir])
    assert not online(frame, {})
    assert not online(frame, {"WANDB_API_KEY": "k"})  # runs tracked offline
    frame["wandb_mode"] = "online"
    assert online(frame, {"WANDB_API_KEY": "k"})
    assert not online(frame, {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"})


def test_publishing_without_a_server_gives_up_in_time(report, tmp_path, monkeypatch):
    path = write_spec(report, tmp_path / "wandb_report.json")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: wandb retries
    start = time.monotonic()
    assert publish_with_timeout(path, timeout_s=4, entity="someone") is None
    assert time.monotonic() - start < 15


def test_publishing_writes_no_wandb_file_outside_the_report_folder(report, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    folder = tmp_path / "sweep"
    path = write_spec(report, folder / "wandb_report.json")
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR",
                 "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    assert publish_with_timeout(path, timeout_s=20, entity="someone") is None
    assert not any(home.rglob("*")), sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    environment = publish_environment(path, {})
    assert all(Path(value).is_relative_to(folder) for value in environment.values() if value.startswith("/"))


def test_untracked_runs_are_said(sweep_dir):
    frame = summary_frame([sweep_dir])
    frame["wandb_mode"] = "disabled"
    texts = [b.text for b in report_spec(frame).blocks if isinstance(b, wr.P)]
    assert any("8 of 8 runs had tracking disabled" in t for t in texts)
    assert not any("tracking disabled" in t for t in (b.text for b in report_spec(summary_frame([sweep_dir])).blocks
                                                      if isinstance(b, wr.P)))


def test_runsets_filter_on_each_sweep_invocations_group(sweep_dir):
    """Runs carry their W&B group in metrics.json (sweep name and timestamp folder): two invocations of one
    sweep are two runsets, never mixed."""
    frame = summary_frame([sweep_dir])
    frame["wandb_group"] = ["synthetic-20261123-101010"] * (len(frame) - 1) + ["synthetic-20261124-090000"]
    runsets = _grid(report_spec(frame)).runsets
    assert [r.name for r in runsets] == ["synthetic-20261123-101010", "synthetic-20261124-090000"]
    assert all(r.name in r.filters for r in runsets)
