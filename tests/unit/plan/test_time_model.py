"""The time model: collectives, pipeline bubbles, per-engine traffic and the step-time breakdown."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.plan.comm import Group, axis_group, bus_factor, collective_time
from harness.plan.compute_time import gemm_time
from harness.plan.hardware import HARDWARE, achievable_peak
from harness.plan.planner import make_plan
from harness.plan.time_model import pipeline_time
from plan_helpers import run_config

H100 = HARDWARE["h100_sxm"]
H100_8X8 = dict(name="h100_8x8", nodes=8, accelerators_per_node=8, accelerator="h100_sxm",
                memory_per_accelerator_gib=None, host_memory_gib=2048.0)


@pytest.mark.parametrize("kind, n, factor", [("all_reduce", 8, 2 * 7 / 8), ("all_gather", 8, 7 / 8),
                                             ("reduce_scatter", 4, 3 / 4), ("p2p", 2, 1.0)])
def test_bus_factor_is_the_nccl_tests_one(kind, n, factor):
    # nccl-tests PERFORMANCE.md: busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for (reduce-)scatter/gather
    assert bus_factor(kind, n) == pytest.approx(factor)


def test_large_all_reduce_runs_at_the_bus_bandwidth_and_small_ones_at_the_latency():
    group = Group(8, 1)
    big = 1 << 30
    assert collective_time("all_gather", big, group, H100) == pytest.approx(
        big * 7 / 8 / H100.intra_node_bandwidth, rel=0.02)
    small = collective_time("all_reduce", 1024, group, H100)
    assert 5e-6 < small < 60e-6  # NCCL's tuning model: tens of microseconds for a few KiB
    # the achieved bus bandwidth falls for small messages
    assert 1024 * 2 * 7 / 8 / small < 0.01 * H100.intra_node_bandwidth


def test_crossing_nodes_with_one_rank_per_node_costs_one_nic():
    inside, across = Group(8, 1), Group(4, 4)
    assert collective_time("all_gather", 1 << 30, across, H100) > 5 * collective_time("all_gather", 1 << 30, inside, H100)


def test_traffic_that_leaves_on_each_ranks_own_nic_is_not_spread_over_the_node():
    # A send to a peer on another node, and an all-to-all's share for the ranks off the node, leave on the
    # sender's NIC (50 GB/s at 90%): 1.12 GB of a 1.28 GB all-to-all over 64 ranks on 8 nodes takes 25 ms, besides
    # its latency
    nic = H100.inter_node_bandwidth * 0.9
    big = 1.28e9
    assert collective_time("all_to_all", big, Group(64, 8), H100) == pytest.approx(big * 56 / 64 / nic, rel=0.03)
    assert collective_time("all_to_all", big, Group(16, 2), H100) == pytest.approx(big * 8 / 16 / nic, rel=0.02)
    assert collective_time("p2p", big, Group(16, 2), H100) == pytest.approx(big / nic, rel=0.02)
    # a ring collective forwards over NVLink and crosses the node at every rank it has there: 8 NICs
    assert collective_time("all_gather", big, Group(16, 2), H100) == pytest.approx(big * 15 / 16 / (8 * nic),
                                                                                     rel=0.05)


def test_axis_groups_stay_inside_a_node_while_they_fit():
    assert axis_group(8, 1, 8) == Group(8, 1)  # tp 8 on one node
    assert axis_group(4, 8, 8) == Group(4, 4)  # dp over tp=8: one rank per node
    assert axis_group(4, 2, 8) == Group(4, 1)
    assert axis_group(8, 2, 8) == Group(8, 2)


def test_pipeline_bubbles_per_schedule():
    f, b, m, p = 1.0, 2.0, 8, 4
    assert pipeline_time("1F1B", p, 1, m, f, b) == pytest.approx((m + p - 1) * (f + b))
    assert pipeline_time("GPipe", p, 1, m, f, b) == pytest.approx((m + p - 1) * (f + b))
    # interleaving divides the bubble by the chunks per rank (Narayanan et al. 2021, sec. 2.2)
    assert pipeline_time("Interleaved1F1B", p, 2, m, f, b) - m * (f + b) == pytest.approx((p - 1) * (f + b) / 2)
    # ZB-H1 leaves (p-1)(F + I - W) = (p-1) F with I = W = B/2 (Qi et al. 2023)
    assert pipeline_time("InterleavedZeroBubble", p, 1, m, f, b) - m * (f + b) == pytest.approx((p - 1) * f)
    assert pipeline_time("ZBVZeroBubble", p, 2, m, f, b) == pytest.approx(m * (f + b))
    # with fewer micro-batches than stages there is nothing to fill the bubble with
    assert pipeline_time("ZBVZeroBubble", p, 2, 4, f, b) - 4 * (f + b) == pytest.approx((p - 1) * (f + b) / 2)
    assert pipeline_time("1F1B", 1, 1, m, f, b) == m * (f + b)
    # W is the weight-gradient GEMMs alone: a recomputation (here 1.0 of the 2.0) belongs to I, before it
    w = 0.5
    assert pipeline_time("InterleavedZeroBubble", p, 1, m, f, b, w) - m * (f + b) == \
        pytest.approx((p - 1) * (f + (b - w) - w))
    assert pipeline_time("ZBVZeroBubble", p, 2, m, f, b, w) - m * (f + b) == \
        pytest.approx((p - 1) * (f + (b - w) - 2 * w) / 2)


def test_gemm_efficiency_falls_for_thin_shapes():
    peak = achievable_peak(H100, "h100_sxm", "bf16")
    square = 2 * 8192**3 / gemm_time(8192, 8192, 8192, 2, H100, peak)
    thin = 2 * 8 * 8192 * 8192 / gemm_time(8, 8192, 8192, 2, H100, peak)
    assert square == pytest.approx(peak * 8192 / (8192 + H100.gemm_half_rate_dim), rel=0.01)
    assert thin < 0.05 * peak  # a decode-like GEMM is bandwidth-bound


def llama70b(**layout):
    fields = dict(dp_shard=4, tp=8, pp=2, zero_stage=3, grad_accum=8, micro_batch=1, seq_len=8192,
                  activation_checkpointing="selective")
    fields.update(layout)
    return run_config(model="llama3_1_70b", engine=dict(name="nd", sequence_parallel=True), cluster=H100_8X8,
                      **fields)


def test_a_plan_carries_step_time_throughput_mfu_and_breakdown():
    plan = make_plan(llama70b())
    assert plan.valid and plan.time is not None and plan.time_source == "datasheet"
    assert plan.tokens_per_s == pytest.approx(plan.tokens_per_step / plan.step_time_s)
    # 70B on H100: published runs of fused, overlapped stacks report 35-50% MFU; nd's eager DTensor TP8 spends
    # as long on unfused elementwise work as on its GEMMs here, and its TP collectives block
    assert 0.15 < plan.predicted_mfu < 0.6
    # nd's selective checkpointing reruns elementwise work only, which no FLOP convention counts
    assert plan.predicted_hfu == plan.predicted_mfu and plan.time.compute_s["recompute"] > 0
    assert make_plan(llama70b(activation_checkpointing="full")).predicted_hfu > plan.predicted_mfu
    t = plan.time
    parts = (sum(t.compute_s.values()) + sum(c["exposed"] for c in t.comm_s.values()) + t.bubble_s
             + t.optimizer_s + t.offload_s)
    assert parts == pytest.approx(t.step_time_s, rel=1e-6)
    assert t.comm_s["tp"]["exposed"] > 0 and t.comm_s["pp"]["total"] > 0 and t.bubble_s > 0
    assert t.comm_s["dp"]["exposed"] <= t.comm_s["dp"]["total"]
    d = plan.to_dict()
    assert d["step_time_s"] == t.step_time_s and d["time"]["overlap"]["tp"].startswith("none")


def test_more_micro_batches_shrink_the_bubble_share():
    few, many = make_plan(llama70b(grad_accum=2)), make_plan(llama70b(grad_accum=32))
    assert few.time.bubble_s / few.step_time_s > many.time.bubble_s / many.step_time_s
    assert many.predicted_mfu > few.predicted_mfu


def test_full_checkpointing_costs_one_more_forward():
    none = make_plan(llama70b(activation_checkpointing="none", micro_batch=1))
    full = make_plan(llama70b(activation_checkpointing="full", micro_batch=1))
    c = none.time.compute_s
    # backward = 2 x forward for GEMMs and elementwise work, 2.5 x for the fused attention kernel
    forward = c["gemm"] / 3 + c["elementwise"] / 3 + c["attention"] / 3.5
    assert full.time.compute_s["recompute"] == pytest.approx(forward, rel=0.05)
    assert full.step_time_s - none.step_time_s >= full.time.compute_s["recompute"]  # + its TP traffic, bubble
    assert none.time.compute_s["recompute"] == 0
    assert full.predicted_hfu / full.predicted_mfu > 1.3 > none.predicted_hfu / none.predicted_mfu


def test_optimizer_offload_adds_host_traffic():
    cfg = run_config(model="llama3_1_8b", engine=dict(name="deepspeed"), cluster=H100_8X8, dp_shard=64,
                     zero_stage=3, micro_batch=1, seq_len=4096)
    device = make_plan(cfg)
    offloaded = make_plan(replace(cfg, layout=replace(cfg.layout, offload_optimizer="cpu")))
    assert offloaded.time.offload_s > 0 == device.time.offload_s
    assert offloaded.step_time_s > device.step_time_s


def test_unknown_hardware_says_why_and_predicts_nothing():
    cfg = run_config(model="llama3_1_8b", engine=dict(name="fsdp"),
                     cluster=dict(H100_8X8, accelerator="l40s", nodes=1, accelerators_per_node=2),
                     dp_shard=2, zero_stage=3)
    plan = make_plan(cfg)
    assert plan.time is None and plan.predicted_mfu is None
    assert any("no hardware profile for accelerator='l40s'" in w for w in plan.warnings)


def test_the_prediction_record_carries_tflops_and_the_breakdown_like_the_measurement():
    from harness.launch.prepare import prediction

    plan = make_plan(llama70b())
    predicted = prediction(plan)
    # the runtime's definition (harness/runtime/bench.py): model FLOPs per token x tokens/s / devices
    assert predicted.tflop_per_s_per_device == pytest.approx(
        plan.tokens_per_s * plan.flops_per_token / plan.world_size / 1e12)
    assert predicted.tflop_per_s_per_device / (plan.peak_flops_per_device / 1e12) == pytest.approx(plan.predicted_mfu)
    assert sum(predicted.time_parts().values()) == pytest.approx(plan.step_time_s)


def test_selective_recomputation_reruns_what_each_engine_drops():
    """Megatron's selective recomputation reruns the attention core (counted by HFU); the torch engines'
    op-level policy keeps matmul and attention outputs and reruns the elementwise work (counted by no convention).
    nd had been charged Megatron's attention rerun and its FLOPs."""
    nd = make_plan(llama70b(tp=1, pp=1, dp_shard=64))
    megatron = make_plan(run_config(model="llama3_1_70b", engine=dict(name="megatron_lm", sequence_parallel=True),
                                    cluster=H100_8X8, dp_shard=8, tp=8, pp=1, zero_stage=1, grad_accum=8,
                                    micro_batch=1, seq_len=8192, activation_checkpointing="selective"))
    assert nd.valid and megatron.valid
    assert nd.predicted_hfu == nd.predicted_mfu and megatron.predicted_hfu > megatron.predicted_mfu
    # a forward's share of each: the elementwise work for nd, the attention for Megatron-LM
    assert 0 < nd.time.compute_s["recompute"] < nd.time.compute_s["elementwise"]
    assert 0 < megatron.time.compute_s["recompute"] < megatron.time.compute_s["attention"]


def test_a_recomputed_layer_issues_its_expert_dispatch_and_context_ring_again():
    # Mixtral over 8 expert ranks; Llama 8B over a context ring of 8: full checkpointing reruns the forward's
    # all-to-alls (4 -> 6 a layer) and ring passes (3 -> 4 a step); Megatron's selective recomputation of the
    # attention core reruns the ring alone
    moe = dict(model="mixtral_8x7b", engine=dict(name="megatron_lm", sequence_parallel=True), cluster=H100_8X8,
               dp_shard=64, ep=8, zero_stage=1, seq_len=4096, micro_batch=1)
    none, full = (make_plan(run_config(activation_checkpointing=c, **moe)).time.comm_s["ep"]["total"]
                  for c in ("none", "full"))
    assert full == pytest.approx(none * 6 / 4)
    ring = dict(model="llama3_1_8b", engine=dict(name="megatron_lm"), cluster=H100_8X8, dp_shard=8, cp=8,
                zero_stage=1, seq_len=32768, micro_batch=1)
    none, full, core = (make_plan(run_config(activation_checkpointing=c, **ring)).time.comm_s["cp"]["total"]
                        for c in ("none", "full", "selective"))
    assert full == pytest.approx(none * 4 / 3) and core == pytest.approx(full)


def test_routed_experts_run_as_grouped_gemms_of_their_own_rows():
    from harness.config.compose import compose_run_config
    from harness.plan.compute_time import gemm_time, grouped_gemm_time, layer_time
    from harness.plan.planner import spec_for

    peak = achievable_peak(H100, "h100_sxm", "bf16")
    # never faster than one GEMM of all the rows; 256 experts of 128 rows each read their weights: memory-bound
    assert grouped_gemm_time(256, 128, 7168, 2048, 2, H100, peak) >= gemm_time(256 * 128, 7168, 2048, 2, H100, peak)
    weights = 256 * 7168 * 2048 * 2
    assert grouped_gemm_time(256, 128, 7168, 2048, 2, H100, peak) >= weights / (H100.memory_bandwidth * 0.9)
    # Mixtral's 8 experts on one rank get an eighth of the rows each; spread over 8 expert ranks, one expert all
    mixtral = spec_for(compose_run_config(["model=mixtral_8x7b"]).model)
    one, eight = (layer_time(mixtral, 4096, 4096, 1, 2, H100, peak, backward=False, ep=ep).gemm for ep in (8, 1))
    assert eight > one
    # DeepSeek-V3's shared expert is timed beside its routed ones
    ds = spec_for(compose_run_config(["model=deepseek_v3"]).model)
    assert ds.shared_ffn_size == 2048
