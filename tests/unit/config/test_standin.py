"""The CPU stand-in rules: smallest splitting degree per axis, a world that fits the local cluster, a tiny
model of the same family (GQA ratio, layers per stage, experts >= ep), and every axis CPU cannot run named."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.config.errors import ConfigRejected, explain
from harness.config.standin import (
    CPUS_PER_NODE,
    MAX_RANKS,
    make_standin,
    stage_layers,
    standin_banner,
    standin_degree,
    tiny_model,
)
from harness.engines import engine_module
from harness.plan.construction import resolved_model_init
from harness.plan.parallel_dims import ParallelDims
from harness.plan.planner import make_plan

GPU_RECIPES = sorted(p.stem for p in (REPO_ROOT / "recipes").glob("gpu_*.yaml"))
AXES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")


@pytest.mark.parametrize("degree,expected", [(1, 1), (2, 2), (8, 2), (16, 2), (32, 2)])
def test_each_used_axis_keeps_the_smallest_split(degree, expected):
    assert standin_degree(degree) == expected


def test_uneven_split_stays_uneven():
    assert stage_layers([7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7], 2) == [1, 2]
    assert stage_layers([], 2) == []


def test_tiny_model_keeps_the_gqa_ratio_and_enough_experts():
    llama70 = compose_run_config(["model=llama3_1_70b"]).model.hf_config  # 64 heads, 8 kv heads
    tiny = tiny_model(llama70, {"tp": 2, "ep": 1}, 10)
    assert tiny["num_attention_heads"] // tiny["num_key_value_heads"] == 64 // 8
    assert tiny["num_key_value_heads"] % 2 == 0 and tiny["num_hidden_layers"] == 10
    assert tiny["model_type"] == "llama" and tiny["rope_theta"] == llama70["rope_theta"]
    mixtral = compose_run_config(["model=mixtral_8x7b"]).model.hf_config
    moe = tiny_model(mixtral, {"tp": 2, "ep": 2}, 2)
    assert moe["num_local_experts"] >= 2 and moe["num_local_experts"] > moe["num_experts_per_tok"] == 2


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_gpu_recipe_has_a_valid_standin(recipe, tmp_path):
    cfg = compose_run_config([f"recipes={recipe}"])
    standin = make_standin(recipe, cfg, resolved_model_init(cfg))
    small = compose_run_config([f"recipes={recipe}", *standin.overrides])
    layout = small.layout
    # Same engine, launcher, schedule, virtual stages, ZeRO stage, offload, checkpointing, precision.
    for key in ("pp_schedule", "pp_virtual_stages", "zero_stage", "offload_optimizer", "offload_params",
                "activation_checkpointing", "precision"):
        assert getattr(layout, key) == getattr(cfg.layout, key), key
    assert (small.engine.name, small.engine.launcher, small.engine.sequence_parallel, small.engine.loss_parallel) \
        == (cfg.engine.name, cfg.engine.launcher, cfg.engine.sequence_parallel, cfg.engine.loss_parallel)
    assert small.model.hf_config["model_type"] == cfg.model.hf_config["model_type"]
    if small.engine.compiled_ops != cfg.engine.compiled_ops:
        assert any("compiled CPU Adam" in item for item in standin.not_executed)
    # Every axis the recipe splits is split on the stand-in, unless named as not executed.
    for axis in AXES:
        if getattr(cfg.layout, axis) > 1 and getattr(layout, axis) == 1:
            assert any(item.startswith(f"{axis}=") for item in standin.not_executed), axis
    assert 1 <= standin.world <= MAX_RANKS and standin.ranks_per_node <= CPUS_PER_NODE
    assert (small.cluster.nodes, small.cluster.accelerators_per_node) == (standin.nodes, standin.ranks_per_node)
    assert (small.cluster.accelerator, small.launcher.backend, small.launcher.partition) == ("cpu", "slurm", "debug")
    assert small.model.hf_config["num_hidden_layers"] >= layout.pp * layout.pp_virtual_stages
    assert small.standin.of == recipe and small.standin.not_executed == standin.not_executed
    assert any("NCCL" in item for item in standin.not_executed)
    plan = make_plan(small)
    assert not plan.errors and plan.fits, plan.errors
    engine = engine_module(small.engine.name)
    assert not engine.check(small)[0]


def test_the_layout_name_says_what_the_standin_runs_and_what_it_stands_in_for():
    small = compose_run_config(["recipes=gpu_llama70b_nd_tp8_pp4", "standin=cpu"])
    dims = ParallelDims.of(small.layout)
    assert (small.layout.tp, small.layout.pp, dims.dp) == (2, 2, 2)
    assert small.layout.name == "tp2_pp2_dp2-standin-of-nd_tp8_pp4_fsdp2"
    one_rank = compose_run_config(["recipes=gpu_llama8b_zero3_offload_1gpu", "standin=cpu"])
    assert one_rank.layout.name == "1rank-standin-of-zero3_offload_1gpu"


# The switch: `standin=cpu` on the command line (run, plan, sweep: every composition goes through it).


def test_the_switch_applies_the_standin_overrides_after_the_recipe():
    recipe = "gpu_llama70b_nd_tp8_pp4"
    cfg = compose_run_config([f"recipes={recipe}"])
    standin = make_standin(recipe, cfg, resolved_model_init(cfg))
    expected = compose_run_config([f"recipes={recipe}", *standin.overrides])
    assert compose_run_config([f"recipes={recipe}", "standin=cpu"]) == expected


def test_overrides_before_the_switch_shape_the_recipe_and_after_it_the_standin():
    before = compose_run_config(["recipes=gpu_llama8b_fsdp_8gpu", "layout.dp_shard=1", "standin=cpu"])
    assert before.layout.dp_shard == 1 and before.cluster.accelerators_per_node == 1  # nothing to split
    after = compose_run_config(["recipes=gpu_llama8b_fsdp_8gpu", "standin=cpu", "launcher=local", "bench.steps=3"])
    assert (after.launcher.backend, after.bench.steps, after.layout.dp_shard) == ("local", 3, 2)
    assert after.standin.of == "gpu_llama8b_fsdp_8gpu"


def test_without_a_recipe_the_standin_names_the_engine_and_layout():
    cfg = compose_run_config(["engine=nd", "layout=nd_tp2", "standin=cpu"])
    assert cfg.standin.of == "nd/nd_tp2" and cfg.layout.tp == 2


@pytest.mark.parametrize("args", [["standin=gpu"], ["standin=cpu", "standin=cpu"]])
def test_a_bad_switch_is_one_line_naming_it(args):
    with pytest.raises(ConfigRejected) as error:
        compose_run_config(["recipes=gpu_llama8b_fsdp_8gpu", *args])
    line = explain(error.value)
    assert line.startswith("standin=") and "standin=cpu" in line and "\n" not in line


def test_run_refuses_the_switch_in_a_hydra_grid_and_plan_accepts_it(capsys):
    from harness.cli import check_points, standin_point

    assert standin_point(["-m"], ["recipes=gpu_llama8b_fsdp_8gpu", "standin=cpu", "bench.seed=0,1"]) is None
    assert "harness sweep" in capsys.readouterr().err
    assert standin_point([], ["recipes=cpu_zero2"]) == ["recipes=cpu_zero2"]
    assert check_points("plan", ["-m"], ["recipes=gpu_llama8b_fsdp_8gpu,gpu_qwen3_32b_fsdp_16gpu", "standin=cpu"])
    assert not check_points("plan", ["-m"], ["recipes=gpu_llama8b_fsdp_8gpu", "standin=tpu"])
    assert "standin='tpu'" in capsys.readouterr().err


def test_the_banner_names_the_recipe_and_every_item():
    text = standin_banner("gpu_x", ["A (why)", "B"])
    assert text.splitlines() == ["[standin] CPU stand-in of gpu_x; not executed on the stand-in:",
                                 "[standin]   - A (why)", "[standin]   - B"]


# FP8: a device without FP8 refuses it for a run of its own, and runs it as a GPU recipe's stand-in.


def test_an_fp8_recipe_standin_plans_on_cpu_with_fp8_widths_and_names_the_gemms_it_does_not_run():
    cfg = compose_run_config(["recipes=gpu_llama8b_nd_tp4_cp2", "layout.precision=fp8", "standin=cpu"])
    hf = cfg.model.hf_config
    assert cfg.layout.precision == "fp8" and hf["head_dim"] == 16  # one kv head a tp rank: 16 wide
    assert all(hf[key] % 16 == 0 for key in ("hidden_size", "intermediate_size"))
    assert any(item.startswith("FP8 tensor-core GEMMs") for item in cfg.standin.not_executed)
    plan = make_plan(cfg)
    assert plan.valid, plan.errors
    # No FP8 peak on a CPU: the converted GEMMs are timed at the bf16 rate, not twice it.
    assert plan.time is None or plan.mfu_by_peak.get("fp8_peak") is None
    bf16 = compose_run_config(["recipes=gpu_llama8b_nd_tp4_cp2", "standin=cpu"])
    assert bf16.model.hf_config["head_dim"] == 8


def test_fp8_on_a_cpu_cluster_of_its_own_is_still_refused():
    cfg = compose_run_config(["engine=nd", "layout.dp_shard=2", "layout.precision=fp8",
                              "model.hf_config.hidden_size=64", "model.hf_config.intermediate_size=128"])
    assert any(e.startswith("layout.precision=fp8 on accelerator=cpu: it has no FP8 tensor cores")
               for e in make_plan(cfg).errors)
