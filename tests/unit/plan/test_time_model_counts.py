"""The collectives each engine issues, counted: on a profile where every collective costs exactly one unit of
latency (1 ms, bandwidth unbounded), the predicted communication of a step is its number of collectives.
The expected counts are those torch.profiler recorded (gloo events of one step) on two CPU ranks of a
1- and a 2-layer tiny Llama: they are facts about the engines, not fitted numbers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.plan.comm import Group, collective_time
from harness.plan.compute_time import attention_time
from harness.plan.hardware import HARDWARE
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.time_model import predict_step_time, ranks_per_core, step_scalars
from plan_helpers import REAL_SHAPES, run_config

MS = 1e-3
# every collective 1 ms, whatever its size: an all-reduce is two algorithm steps on two ranks, the rest one
COUNTING = replace(HARDWARE["h100_sxm"], name="counting", overlaps_comm=False, gpus_per_node=2,
                   collective_links={"all_reduce": (MS / 2, 1e30), "all_gather": (MS, 1e30),
                                     "reduce_scatter": (MS, 1e30), "p2p": (MS, 1e30)})


def tiny(layers: int):
    return model_spec_from_hf("tiny_llama", dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=layers))


def comm_calls(layers: int, engine: dict, **layout) -> dict:
    cfg = run_config(engine=engine, **layout)
    step = predict_step_time(tiny(layers), cfg.layout, cfg.engine, COUNTING, peak=1e12)
    return {axis: round(c["total"] / MS, 6) for axis, c in step.comm_s.items() if c["total"]}


def test_every_collective_costs_one_unit_on_the_counting_profile():
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        assert collective_time(kind, 1 << 20, Group(2, 1), COUNTING) == pytest.approx(MS)


@pytest.mark.parametrize("layers, gathers", [(1, 3), (2, 5)])
def test_fsdp2_gathers_each_unit_and_again_for_backward_but_the_root(layers, gathers):
    # profiled (FSDP2 FULL_SHARD): 3 / 5 all-gathers and 2 / 3 reduce-scatters for 1 / 2 layers
    units = layers + 1
    assert comm_calls(layers, dict(name="fsdp"), zero_stage=3) == {"dp": gathers + units}
    # SHARD_GRAD_OP keeps every unit gathered from forward to backward: one gather per unit
    assert comm_calls(layers, dict(name="fsdp"), zero_stage=2) == {"dp": 2 * units}


@pytest.mark.parametrize("layers", [1, 2])
def test_deepspeed_zero3_fetches_every_module_once_while_they_stay_live(layers):
    # profiled: 12 / 21 all-gathers (9 parameter tensors a layer, embedding, final norm, head), one bucket
    assert comm_calls(layers, dict(name="deepspeed"), zero_stage=3) == {"dp": 9 * layers + 3 + 1}


@pytest.mark.parametrize("zero", [1, 2])
def test_deepspeed_zero12_reduce_one_bucket_and_gather_once(zero):
    # profiled: 1 all-gather and 1 gradient reduction whatever the layers (buckets of 5e8 elements)
    assert comm_calls(2, dict(name="deepspeed"), zero_stage=zero) == {"dp": 2}


@pytest.mark.parametrize("layers, gathers, reductions", [(1, 6, 15), (2, 10, 24)])
def test_nd_sequence_parallel_collectives_per_layer(layers, gathers, reductions):
    # profiled (nd, tp2, sequence + loss parallel): 6 / 10 all-gathers, 15 / 24 reduce-scatters and all-reduces
    # besides the clip's: per layer 2 gathers and 2 reduce-scatters forward, 2 gathers and an all-reduce of
    # each column-parallel matrix's input gradient (q, k, v, gate, up) backward, each norm weight's gradient
    calls = comm_calls(layers, dict(name="nd", sequence_parallel=True, loss_parallel=True), dp_shard=1, tp=2,
                       zero_stage=0)
    assert calls == {"tp": gathers + reductions}


@pytest.mark.parametrize("layers", [1, 2])
def test_autotp_all_reduces_each_row_output_and_each_column_input_gradient(layers):
    # profiled (DeepSpeed AutoTP tp2, ZeRO-1 over one data rank): 13 / 20 all-reduces, 1 all-gather in all;
    # 7 per layer, the head's output, the norm and overflow scalars over both groups, one bucket
    cfg = run_config(engine=dict(name="deepspeed"), dp_shard=1, tp=2, zero_stage=1)
    step = predict_step_time(tiny(layers), cfg.layout, cfg.engine, COUNTING, peak=1e12)
    tp = step.comm_s["tp"]["total"] / MS
    assert tp == pytest.approx(7 * layers + 1)
    assert step_scalars(cfg.engine, 1, 2) == 4


def test_step_scalars_per_engine():
    engine = run_config(engine=dict(name="deepspeed")).engine
    assert [step_scalars(engine, z, 1) for z in (0, 1, 2, 3)] == [0, 2, 2, 1]
    assert step_scalars(run_config(engine=dict(name="fsdp")).engine, 3, 1) == 1


def test_ranks_beyond_the_cores_stretch_the_step():
    cfg = run_config(engine=dict(name="fsdp"), dp_shard=2, dp_replicate=2, zero_stage=3)
    two_cores = replace(COUNTING, cores_per_node=2, gpus_per_node=4)
    assert ranks_per_core(cfg.layout, two_cores) == 2.0
    assert ranks_per_core(cfg.layout, replace(two_cores, cores_per_node=4)) == 1.0
    assert ranks_per_core(cfg.layout, replace(two_cores, cores_per_node=0)) == 1.0  # accelerators
    slow = predict_step_time(tiny(2), cfg.layout, cfg.engine, two_cores, peak=1e12)
    fast = predict_step_time(tiny(2), cfg.layout, cfg.engine, replace(two_cores, cores_per_node=4), peak=1e12)
    assert slow.step_time_s == pytest.approx(2 * fast.step_time_s)
    assert sum(slow.compute_s.values()) == pytest.approx(2 * sum(fast.compute_s.values()))


def test_attention_pays_its_fixed_cost_per_sequence_and_head():
    spec = tiny(1)
    hw = replace(COUNTING, attention_head_latency_s=10e-6, attention_backward_head_latency_s=100e-6, op_latency_s=0)
    none = replace(hw, attention_head_latency_s=0.0, attention_backward_head_latency_s=0.0)
    # 2 sequences of 64 tokens, 4 heads on one rank: 8 (sequence, head) pairs; half of them under tp=2
    for tp, pairs in ((1, 8), (2, 4)):
        fwd = attention_time(spec, 128, 64, tp, 2, hw, 1e12, backward=False)
        bwd = attention_time(spec, 128, 64, tp, 2, hw, 1e12, backward=True)
        assert fwd - attention_time(spec, 128, 64, tp, 2, none, 1e12, backward=False) == pytest.approx(pairs * 10e-6)
        assert bwd - attention_time(spec, 128, 64, tp, 2, none, 1e12, backward=True) == pytest.approx(pairs * 100e-6)
