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
from harness.plan.host_work import HOST_OPS, host_mechanisms, host_work_s
from harness.plan.time_model import predict_step_time, ranks_per_core, step_scalars
from plan_helpers import REAL_SHAPES, run_config

MS = 1e-3
# every collective 1 ms, whatever its size: an all-reduce is two algorithm steps on two ranks, the rest one
COUNTING = replace(HARDWARE["h100_sxm"], name="counting", overlaps_comm=False, gpus_per_node=2, rank_stall_share=0.0,
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


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("layers, units", [(2, 2), (4, 3)])
@pytest.mark.parametrize("grad_accum", [2, 4])
def test_nd_pipeline_stage_gathers_and_reduces_each_unit_once_per_step(zero, layers, units, grad_accum):
    # profiled (nd, pp2 x dp_shard2 1F1B, ZeRO-2 or 3, pipeline rank 0: 1 / 2 layers + the root): 2 / 3 all-gathers
    # and 2 / 3 reduce-scatters per step with 2 or 4 micro-batches. Resharding after forward gathered each unit
    # again in every micro-batch: 6 / 9 all-gathers with 2 micro-batches, 10 with 4 (1 layer).
    calls = comm_calls(layers, dict(name="nd"), pp=2, dp_shard=2, zero_stage=zero, micro_batch=1,
                       grad_accum=grad_accum)
    assert calls["dp"] == 2 * units


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
    # profiled (DeepSpeed PipelineModule pp2, one data rank): ZeRO-1 two scalars over the stages (norm and
    # overflow), ZeRO-0 one (clip_grad_norm_ sums the stages' squares)
    assert [step_scalars(engine, z, 1, pp=2) for z in (0, 1)] == [1, 2]


@pytest.mark.parametrize("engine, broadcasts", [("nd", 1), ("deepspeed", 1), ("megatron_lm", 0)])
def test_a_pipeline_step_sends_each_micro_batch_and_gives_every_stage_the_loss(engine, broadcasts):
    # profiled (pp2, 4 micro-batches of 1, rank 0): 4 activations sent and 4 gradients received (DeepSpeed's
    # p2p.send / recv; nd's batch_isend_irecv), then 1 broadcast of the loss over the stages (DeepSpeed's
    # _aggregate_total_loss; nd_session._pipeline); Megatron-LM keeps the loss on the last stage
    zero = 1 if engine != "nd" else 0
    layout = dict(pp=2, dp_shard=1, zero_stage=zero, micro_batch=1, grad_accum=4, pp_schedule="1F1B")
    assert comm_calls(2, dict(name=engine), **layout) == {"pp": 2 * 4 + broadcasts}


@pytest.mark.parametrize("engine, zero, scalars", [("nd", 0, 1), ("deepspeed", 1, 2), ("deepspeed", 0, 1)])
def test_the_clip_all_reduces_over_every_pipeline_stage(engine, zero, scalars):
    # profiled (pp2, one data rank): the norm's scalars are all-reduced over both stages (nd's clip over the
    # world, DeepSpeed's over its model-parallel group); with one data rank there was nothing to all-reduce before
    cfg = run_config(engine=dict(name=engine), pp=2, dp_shard=1, zero_stage=zero, micro_batch=1, grad_accum=4,
                     pp_schedule="1F1B")
    # an all-reduce one unit dearer adds one unit per scalar to the optimizer step (the squared sums aside)
    dearer = replace(COUNTING, collective_links={**COUNTING.collective_links, "all_reduce": (MS, 1e30)})
    steps = [predict_step_time(tiny(2), cfg.layout, cfg.engine, hw, peak=1e12) for hw in (COUNTING, dearer)]
    assert steps[1].optimizer_s - steps[0].optimizer_s == pytest.approx(scalars * MS)


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


@pytest.mark.parametrize("engine, layout, rows", [
    (dict(name="deepspeed"), dict(zero_stage=0), ["deepspeed_zero0"]),
    (dict(name="deepspeed"), dict(zero_stage=2), ["deepspeed_zero12"]),
    (dict(name="deepspeed"), dict(zero_stage=1, tp=2, dp_shard=1), ["deepspeed_zero12", "deepspeed_autotp"]),
    (dict(name="deepspeed"), dict(zero_stage=3), ["deepspeed_zero3"]),
    (dict(name="fsdp"), dict(zero_stage=3), ["fsdp2_reshard"]),
    (dict(name="fsdp"), dict(zero_stage=2), ["fsdp2"]),
    (dict(name="fsdp", fsdp_version=1), dict(zero_stage=3), ["fsdp1"]),
    (dict(name="nd", sequence_parallel=True), dict(zero_stage=0, tp=2, dp_shard=1), ["dtensor_tp"]),
    (dict(name="nd"), dict(zero_stage=3, tp=1, dp_shard=2), ["fsdp2_reshard"]),
    (dict(name="nd"), dict(zero_stage=3, pp=2, dp_shard=2, grad_accum=2), ["fsdp2", "pipelining"]),
])
def test_host_work_rows_follow_the_engine_mechanism(engine, layout, rows):
    cfg = run_config(engine=engine, **layout)
    assert host_mechanisms(cfg.engine, cfg.layout) == rows


def test_host_work_is_in_op_latencies_on_cpu_ranks_and_hidden_on_gpus():
    cfg = run_config(engine=dict(name="deepspeed"), zero_stage=3)
    per_tensor, per_step = HOST_OPS["deepspeed_zero3"]
    cpu = replace(COUNTING, overlaps_comm=False, op_latency_s=2e-6)
    assert host_work_s(cfg.engine, cfg.layout, cpu, 21) == pytest.approx((per_tensor * 21 * 2e-6, per_step * 2e-6))
    assert host_work_s(cfg.engine, cfg.layout, replace(cpu, op_latency_s=4e-6), 21)[0] == pytest.approx(
        2 * per_tensor * 21 * 2e-6)
    assert host_work_s(cfg.engine, cfg.layout, HARDWARE["h100_sxm"], 21) == (0.0, 0.0)
    step = predict_step_time(tiny(2), cfg.layout, cfg.engine, cpu, peak=1e12)
    # in the breakdown as compute "framework": every micro-batch's tensors plus the step's own work
    assert step.compute_s["framework"] == pytest.approx((per_tensor * 21 + per_step) * 2e-6)
    parts = (sum(step.compute_s.values()) + sum(c["exposed"] for c in step.comm_s.values()) + step.bubble_s
             + step.optimizer_s + step.offload_s)
    assert parts == pytest.approx(step.step_time_s)


def test_pipeline_engines_have_their_own_host_work():
    ds = run_config(engine=dict(name="deepspeed"), zero_stage=1, pp=2, dp_shard=1, grad_accum=4, micro_batch=1)
    nd = run_config(engine=dict(name="nd"), zero_stage=0, pp=2, dp_shard=1, grad_accum=4, micro_batch=1)
    assert host_mechanisms(ds.engine, ds.layout) == ["deepspeed_pipe"]
    assert host_mechanisms(nd.engine, nd.layout) == ["pipelining"]
