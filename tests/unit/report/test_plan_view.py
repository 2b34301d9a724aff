"""`harness plan`: a table that fits the terminal, sorted by fit, -1 filling the world, labels from values."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.config.fill import DegreeFillError, fill_data_parallel
from harness.report import plan_view
from harness.plan.units import format_bytes, memory_unit


def harness_plan(*args, columns=100, env=None):
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "plan", *args], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "COLUMNS": str(columns), **(env or {})},
    )  # fmt: skip


def test_minus_one_fills_the_world_left_by_the_other_degrees():
    run = compose_run_config(["layout.dp_shard=-1", "layout.tp=2"])
    assert (run.layout.dp_shard, run.layout.tp) == (1, 2)
    run = compose_run_config(["layout.dp_replicate=-1", "layout.dp_shard=1", "cluster.accelerators_per_node=4"])
    assert run.layout.dp_replicate == 4


def test_minus_one_that_cannot_fill_names_the_numbers():
    run = compose_run_config([])
    with pytest.raises(DegreeFillError, match=r"= 2 is not a multiple of .*tp=4 .* = 4"):
        fill_data_parallel(replace(run, layout=replace(run.layout, dp_shard=-1, tp=4)))
    with pytest.raises(DegreeFillError, match="only one degree"):
        fill_data_parallel(replace(run, layout=replace(run.layout, dp_shard=-1, dp_replicate=-1)))


def test_memory_unit_by_magnitude():
    assert memory_unit(3 * 2**30) == ("GiB", 2**30)
    assert memory_unit(5 * 2**20) == ("MiB", 2**20)
    assert format_bytes(1.5 * 2**30) == "1.50 GiB" and format_bytes(812.25 * 2**20) == "812.2 MiB"
    assert format_bytes(None) == "-"


def _point(fit, tokens=None, margin=None, label="x"):
    plan = SimpleNamespace(fits=fit, tokens_per_s=tokens, margin_bytes=margin)
    return plan_view.PlannedPoint(label, plan, [] if fit is not None else [], [], {})


def test_sort_fits_first_then_throughput_then_margin():
    invalid = plan_view.PlannedPoint("bad", None, ["rule"], [], {})
    points = [invalid, _point(False, label="oom", margin=-5), _point(True, margin=1, label="small"),
              _point(True, margin=9, label="roomy"), _point(True, tokens=10.0, margin=0, label="fast")]
    assert [p.label for p in plan_view.sort_points(points)] == ["fast", "roomy", "small", "oom", "bad"]


def test_sweeping_tp_with_filled_dp_keeps_every_layout_valid_and_fits_100_columns():
    # engine=deepspeed (the default): AutoTP trains at ZeRO 0-2
    out = harness_plan("layout.tp=1,2", "layout.zero_stage=1,2", "layout.dp_shard=-1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, out.stdout
    assert "4 layout(s) on 2 ranks: 4 fits" in out.stdout
    header = next(line for line in lines if line.lstrip().startswith("layout"))
    assert "mem/rank (MiB)" in header and "fit" in header
    # Labels come from the values that differ, never from the preset's name.
    assert "dp2_zero2" not in out.stdout and "dp1 tp2 zero2" in out.stdout


def test_invalid_layouts_collapse_to_one_line_and_why_shows_all():
    args = ("model=llama3_1_70b", "cluster=h100_8x8", "launcher=slurm_gpu", "engine=nd", "layout.tp=8", "layout.pp=4",
            "layout.dp_shard=-1", "layout.grad_accum=8", "layout.zero_stage=1,3")
    short, full = harness_plan(*args), harness_plan(*args, "--why")
    assert short.returncode == 1, short.stderr  # one of the two layouts is refused
    invalid_rows = [line for line in short.stdout.splitlines() if line.startswith(" zero1")]
    assert len(invalid_rows) == 1 and "engine=nd" in invalid_rows[0]
    assert "add --why" in short.stdout
    assert "zero1: error: engine=nd rejects zero_stage=1 with pp=4" in full.stdout
    rows = [line for line in short.stdout.splitlines() if line.startswith(" zero")]
    assert rows[0].startswith(" zero3") and "fits" in rows[0]  # the fitting layout is listed first


def test_json_and_csv_carry_every_column():
    as_json = harness_plan("layout.tp=1,2", "layout.dp_shard=-1", "--json")
    rows = json.loads(as_json.stdout)
    assert [row["fit"] for row in rows] == ["fits", "fits"]
    assert {"memory_per_rank(GiB)", "flops_per_token(GFLOP)", "errors", "warnings", "label"} <= set(rows[0])
    as_csv = list(csv.DictReader(io.StringIO(harness_plan("layout.tp=1,2", "layout.dp_shard=-1", "--csv").stdout)))
    assert [row["label"] for row in as_csv] == [row["label"] for row in rows]


def test_no_valid_layout_exits_one():
    out = harness_plan("layout.tp=4")
    assert out.returncode == 1
    assert "must equal cluster.nodes=1" in out.stdout and "Traceback" not in out.stderr


def test_hub_id_unreachable_is_refused_clearly():
    out = harness_plan("model.hub_id=meta-llama/Llama-3.1-8B", env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2
    assert "model.hub_id='meta-llama/Llama-3.1-8B'" in out.stderr and "Traceback" not in out.stderr


def test_hub_id_fields_are_planned_not_the_preset(monkeypatch):
    import harness.config.hub as hub

    base = plan_view.plan_points([])[0]
    wider = {"hidden_size": 128, "intermediate_size": 256}
    monkeypatch.setattr(hub, "fetch_hub_config", lambda hub_id: wider)
    point = plan_view.plan_points(["model.hub_id=org/wider"])[0]
    assert point.row["model"] == "org/wider"
    assert point.plan.model.total_params > base.plan.model.total_params


def test_a_multi_node_cluster_is_planned_as_the_slurm_job_it_needs_unless_a_launcher_is_named():
    """`harness plan model=... cluster=h100_8x8` with no layout and no launcher: the layout is filled for the
    cluster and the plan is the Slurm job the nodes need, said on stderr; a launcher the user names is kept."""
    out = harness_plan("model=llama3_1_70b", "cluster=h100_8x8")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 fits" in out.stdout
    assert "planned with launcher=slurm_gpu, which cluster.nodes=8 needs" in out.stderr
    named = harness_plan("model=llama3_1_70b", "cluster=h100_8x8", "launcher=local", columns=400)
    assert named.returncode == 1 and "launcher.backend=local starts one node, but cluster.nodes=8" in named.stdout
    assert "planned with launcher" not in named.stderr


def test_a_refused_layout_exports_no_prediction_and_is_not_valid():
    """An engine's refusal (fsdp has no selective checkpointing) came out of --csv / --json with valid=True and a
    tokens/s that a file sorted by throughput would rank; an OOM keeps its memory."""
    from harness.report.plan_view import PREDICTION_COLUMNS, export_rows, plan_points

    rows = export_rows(plan_points(["model=llama3_2_1b", "cluster=gpu_h100_1x8", "engine=fsdp",
                                    "layout.activation_checkpointing=selective,full"]))
    refused, admitted = sorted(rows, key=lambda row: row["fit"] == "fits")
    assert refused["fit"] == "invalid" and refused["valid"] is False and "selective" in refused["errors"]
    assert all(refused[column] is None for column in PREDICTION_COLUMNS if column in refused)
    assert admitted["valid"] is True and admitted["tokens_per_s"] > 0
    assert admitted["params"] == 1_235_814_400 and admitted["flops_per_token(GFLOP)"] == float(
        f"{admitted['flops_per_token(GFLOP)']:.6g}")


def test_layouts_that_run_differently_never_share_a_label():
    """compile, FSDP1 against FSDP2 and virtual stages ran differently under one label (207,422 against 60,176
    tokens/s for `fsdp dp8 z3 mb1x1 s1024 ckpt-full bf16`)."""
    from harness.config.compose import compose_run_config
    from harness.config.naming import run_label
    from harness.report.plan_view import plan_points

    for grid in (["model=gpt2", "engine=fsdp", "engine.compile=true,false"],
                 ["model=llama3_1_8b", "engine=fsdp,fsdp1"]):
        labels = [point.label for point in plan_points([*grid, "cluster=gpu_h100_1x8"])]
        assert len(set(labels)) == 2, labels
    layout = ["model=llama3_1_70b", "cluster=h100_8x8", "engine=nd", "layout.tp=8", "layout.pp=4", "layout.dp_shard=2",
              "layout.pp_schedule=Interleaved1F1B", "layout.grad_accum=8", "launcher=slurm"]
    two, four = (run_label(compose_run_config([*layout, f"layout.pp_virtual_stages={v}"])) for v in (2, 4))
    assert "Interleaved1F1B vpp2" in two and "Interleaved1F1B vpp4" in four
    assert run_label(compose_run_config(["model=gpt2", "engine=fsdp1", "cluster=gpu_h100_1x8",
                                         "engine.compile=true"])).startswith("fsdp1 ")


def test_plan_takes_hydras_multirun_flag_as_run_does(capsys):
    """`harness plan -m ...` said "unknown option -m" though `harness run -m` takes it and plan's commas are a
    grid anyway."""
    from harness.cli import plan_command

    args = ["model=gpt2", "engine=fsdp", "cluster=gpu_h100_1x8", "layout.micro_batch=1,2", "--json"]
    assert plan_command(["-m", *args]) == 0
    with_flag = capsys.readouterr().out
    assert plan_command(args) == 0
    assert with_flag == capsys.readouterr().out and len(json.loads(with_flag)) == 2
