"""The CPU stand-in rules: smallest splitting degree per axis, a world that fits the local cluster, a tiny
model of the same family (GQA ratio, layers per stage, experts >= ep), and every axis CPU cannot run named."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.config.compose import compose_run_config
from harness.config.standin import (
    CPUS_PER_NODE,
    MAX_RANKS,
    make_standin,
    stage_layers,
    standin_degree,
    tiny_model,
)
from harness.engines import engine_module
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
    standin = make_standin(recipe, cfg)
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
    assert not (engine.check(small)[0] if hasattr(engine, "check") else [])
