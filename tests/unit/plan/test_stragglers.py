"""Stragglers: a rank that stalls on its own (garbage collector, OS noise) holds up every rank that waits for it at
each layer, so FSDP / ZeRO-3 steps stretch with the size of the shard group (time_model.straggler_stretch)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.config.schema import LayoutConfig, engine_config
from harness.plan.hardware import HARDWARE, RANK_STALL_SHARE
from harness.plan.planner import clear_caches, make_plan
from harness.plan.time_model import lockstep_ranks, straggler_stretch
from plan_helpers import run_config

H100 = HARDWARE["h100_sxm"]


def layout(**fields) -> LayoutConfig:
    return LayoutConfig(**{"micro_batch": 1, "seq_len": 2048, **fields})


@pytest.mark.parametrize("engine, fields, ranks", [
    # parameters gathered layer by layer: the shard group waits for each gather
    ("fsdp", dict(dp_shard=512, zero_stage=3), 512),
    ("fsdp", dict(dp_shard=512, zero_stage=2), 512),  # SHARD_GRAD_OP gathers in every forward
    ("deepspeed", dict(dp_shard=64, zero_stage=3), 64),
    ("fsdp", dict(dp_shard=8, dp_replicate=12, zero_stage=3), 8),  # HSDP: the replicas meet once a step
    # gradient reductions the compute does not wait for: once a step
    ("deepspeed", dict(dp_shard=64, zero_stage=2), 1),
    ("deepspeed", dict(dp_shard=64, zero_stage=0), 1),
    ("megatron_lm", dict(dp_shard=8, tp=8, pp=4, zero_stage=1), 1),
])
def test_lockstep_ranks_are_the_shard_group_where_every_layer_waits_for_its_gather(engine, fields, ranks):
    assert lockstep_ranks(layout(**fields), engine_config(engine)) == ranks


def test_each_other_rank_of_the_group_adds_its_stall_share():
    fsdp = engine_config("fsdp")
    assert straggler_stretch(layout(dp_shard=1, zero_stage=3), fsdp, H100) == 1.0
    assert straggler_stretch(layout(dp_shard=2, zero_stage=3), fsdp, H100) == pytest.approx(1 / (1 - RANK_STALL_SHARE))
    # 512 ranks: the step moves on while none of the other 511 stalls, (1 - s)^511 of the time
    assert straggler_stretch(layout(dp_shard=512, zero_stage=3), fsdp, H100) == \
        pytest.approx((1 - RANK_STALL_SHARE) ** -511)
    assert 1.11 < (1 - RANK_STALL_SHARE) ** -511 < 1.13
    assert straggler_stretch(layout(dp_shard=512, zero_stage=3), fsdp, replace(H100, rank_stall_share=0.0)) == 1.0


@pytest.fixture
def fresh_profiles():
    clear_caches()
    yield
    clear_caches()


def test_the_planned_step_stretches_by_it(monkeypatch, fresh_profiles):
    config = run_config("llama3_1_8b", engine=dict(name="fsdp"), dp_shard=512, zero_stage=3, micro_batch=2,
                        seq_len=2048, cluster=dict(name="h100_sxm", accelerator="h100_sxm", nodes=64,
                                                   accelerators_per_node=8, memory_per_accelerator_gib=80.0))
    with_stalls = make_plan(config).time
    monkeypatch.setitem(HARDWARE, "h100_sxm", replace(H100, rank_stall_share=0.0))
    clear_caches()  # the planner keeps each cluster's profile
    without = make_plan(config).time
    assert with_stalls.step_time_s / without.step_time_s == pytest.approx((1 - RANK_STALL_SHARE) ** -511)
    # the ranks' own work does not grow with their number: the wait is shown as its own part
    assert with_stalls.compute_s["gemm"] == pytest.approx(without.compute_s["gemm"])
    assert with_stalls.compute_s["stragglers"] == pytest.approx(with_stalls.step_time_s - without.step_time_s)
    assert "stragglers" not in without.compute_s
