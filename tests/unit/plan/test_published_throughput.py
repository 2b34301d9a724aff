"""The time model against every public throughput table (tests/data/*.csv, mapped by tests.published.runs): one
test per table printing each row and the median and max |error|, and, where a table gives model FLOPs, a check
that the harness's FLOPs per token under the table's convention agree with the table's (a mis-mapped shape
shows there first).

Throughput (tokens/s per GPU) is convention-free, so no FLOP normalisation is needed to compare it. The error
bounds record where the model stands today, not the goal (median <= 7 %, max <= 15 % per engine): tighten
them as the model improves."""

from __future__ import annotations

import math
import statistics

import pytest

from harness.plan.hardware import RANK_STALL_SHARE
from harness.plan.planner import make_plan
from harness.plan.time_model import lockstep_ranks
from tests.published.runs import (SAME_SITE, TABLES, PublishedRun, beyond_site, flagperf_megatron_config, gpus_of,
                                  predicted_tokens_per_s_per_gpu, prediction_error, published_runs, read_rows,
                                  repeated_layouts, weak_scaling_groups)

# table -> (median |error|, max |error|) bounds: the current state plus headroom, not a target met.
BOUNDS = {
    # MPT's Triton attention at FlashAttention v1's head dim 64 rate, scaled to Hopper as FA2 (hardware.py): the
    # long-sequence rows moved from -24% to -7% (H100) and -18% to -6% (A100). The max of each llm-foundry table is
    # a row its own neighbours disagree with (mpt-30b at 8k tokens: 23% below its 4k row, where 7b falls 19%;
    # mpt-760m on the A100 80GB at 512 / 1k tokens: below its own 2k row, which does more work a token)
    "llm_foundry_h100": (0.06, 0.33),
    # NCCL's LL capped and LL128 added (comm.ring_time): 7b at 512 GPUs +24.5% -> +26.0%; stragglers
    # (time_model.straggler_stretch): median 13.0% -> 6.1%, max 26.0% -> 15.1% (7b at 256 GPUs, FlashAttention-2);
    # MPT's flash path with flash-attn's unpad / pad (compute_time.unpad_pad_time): median 3.7%, max 11.6%
    "llm_foundry_h100_large": (0.05, 0.13),
    "llm_foundry_a100_80gb": (0.03, 0.37),
    "llm_foundry_a100_40gb": (0.03, 0.41),
    "dgxc_h100": (0.05, 0.08),
    # Sequence parallelism's norms and residual adds on 1 / tp of the tokens (compute_time.layer_elementwise_bytes):
    # dgxc median 3.2% -> 1.2%, signed -3.1% -> +0.8%; NeMo 2 median 2.6% -> 2.1%, its max the truncated 405B
    # (30 layers over pp4 x vp8 on 64 GPUs) +3.6% -> +8.2%, which runs 6% slower a layer than its 62-layer row
    "dgxc_h100_nemo2": (0.05, 0.09),
    # HSDP over 50 / 100 Gbps Ethernet: the H100 row's step is its communication (the replicas' all-reduce over one
    # NIC each), which the compute beside it no longer adds to twice (time_model.exposed): +9.7%, from -0.3%; then
    # FSDP2's copies on the compute stream (time_model.fsdp2_copies; the rows map FSDP1 + compile onto FSDP2): +5.4%
    "fms_fsdp": (0.06, 0.07),
    # FSDP2 x CP: its gathers copied out and its gradients copied in on the compute stream, 14 bytes a parameter
    # a micro-batch (time_model.fsdp2_copies): +10.7% -> +2.8%
    "automodel_h100": (0.04, 0.04),
    # DeepSpeed ZeRO-3 on one node, micro-batches of 2-6k tokens, two models: every row 15-35% optimistic. The
    # missing time is per micro-batch, not per step (the A800 Llama row at 64 accumulation steps misses as the one at
    # 1 does), and it shrinks with the tokens, not with the traffic: ChatGLM3's A800 rows miss 0.27 s a micro-batch
    # at 4096 tokens and 0.15 s at 2048, the same parameters gathered and reduced at both
    "flagperf_deepspeed": (0.27, 0.36),
    # The same site's Megatron-core runs of Llama 3 8B / 70B on A800 and H100: every row 11-24% optimistic, where
    # NVIDIA's own Megatron-core runs of the same models on H100 (dgxc_h100*) are within 4.4% (8B: 10,254 tokens/s
    # a GPU at CP 2 against FlagPerf's 8,103 at TP 2, the model 10,401 and 9,801): the site's machines or its early
    # 2024 stack, which no public figure separates
    "flagperf_megatron": (0.19, 0.25),
}


def test_every_table_has_bounds():
    assert set(BOUNDS) == set(TABLES)


@pytest.mark.parametrize("table", list(TABLES))
def test_flop_conventions_agree_with_the_table(table):
    # the table's MFU (or TFLOP/s) over its throughput fixes its FLOPs per token; ours under the table's
    # convention must match
    runs = [run for run in published_runs(table) if run.table_flops_per_token is not None]
    nominal = [run for run in published_runs(table) if run.table_nominal_params is not None]
    assert runs or nominal, f"{table} gives no model FLOPs"
    for run in runs:
        ours = make_plan(run.flop_config or run.config).flops_per_token
        assert ours == pytest.approx(run.table_flops_per_token, rel=0.03), run.label
    # an MFU over 6 x the nominal size ("7B"): the mapped model's parameters round to it (Llama-2-7B: 6.74e9)
    for run in nominal:
        ours = make_plan(run.config).model.total_params
        assert f"{ours:.0e}" == f"{run.table_nominal_params:.0e}", (run.label, ours, run.table_nominal_params)


def report(runs: list[PublishedRun]) -> list[float]:
    errors = []
    for run in runs:
        plan = make_plan(run.config)
        predicted, error = predicted_tokens_per_s_per_gpu(run, plan), prediction_error(run, plan)
        errors.append(error)
        print(f"{run.label}: {run.tokens_per_s_per_gpu:.0f} measured, {predicted:.0f} predicted tokens/s/GPU "
              f"({error:+.0%})")
    return errors


@pytest.mark.parametrize("table", list(TABLES))
def test_throughput_error_on_the_table(table, capsys):
    errors = [abs(e) for e in report(published_runs(table))]
    median, worst = statistics.median(errors), max(errors)
    print(f"{table}: {len(errors)} rows, median |error| {median:.0%}, max {worst:.0%}")
    bound_median, bound_max = BOUNDS[table]
    assert median <= bound_median and worst <= bound_max


def test_published_layouts_plan_as_fitting(capsys):
    # every published row ran on its GPUs, so a plan that does not fit is a miss of the memory model
    misses = []
    for run in published_runs():
        plan = make_plan(run.config)
        if plan.fits is False:
            misses.append(run)
            print(f"{run.table}: {run.label}: {plan.memory.total_bytes / 2**30:.1f} GiB planned per rank")
    print(f"{len(misses)} published runs plan as not fitting")
    assert not misses


def test_the_published_layout_that_ran_out_of_memory_plans_as_not_fitting(capsys):
    # FlagPerf's A800 ablation: Llama 3 8B at PP1 DP8 TP1, 8k tokens, ran out of memory (its README: OOM), where the
    # table's other layouts on the same node ran
    row = {**read_rows(TABLES["flagperf_megatron"].path)[0], "tp": "1", "pp": "1", "sequence_parallel": "false"}
    assert int(row["gpus"]) == 8 and row["chip"] == "A800"
    plan = make_plan(flagperf_megatron_config(row))
    print(f"llama3-8b A800 pp1 dp8 tp1: {plan.memory.total_bytes / 2**30:.1f} GiB planned per rank")
    assert plan.fits is False


# table -> (median, max) of |what its rows miss beyond the same site's reference engine| (SAME_SITE), as BOUNDS
SITE_BOUNDS = {
    # FlagPerf's DeepSpeed ZeRO-3 rows miss 15-35%, its Megatron-core rows on the same chips 11-24%: beyond those,
    # DeepSpeed's own share is -5% to +15%
    "flagperf_deepspeed": (0.08, 0.16),
}


@pytest.mark.parametrize("table", list(SAME_SITE))
def test_what_a_table_misses_beyond_its_sites_reference_engine(table, capsys):
    rows = beyond_site(table)
    for run, error, beyond in rows:
        print(f"{run.label}: error {error:+.1%}, beyond the site's {SAME_SITE[table]} rows {beyond:+.1%}")
    beyond = [abs(left) for _, _, left in rows]
    median, worst = statistics.median(beyond), max(beyond)
    print(f"{table}: median |beyond| {median:.1%}, max {worst:.1%}")
    assert set(SITE_BOUNDS) == set(SAME_SITE)
    assert median <= SITE_BOUNDS[table][0] and worst <= SITE_BOUNDS[table][1]


def test_weak_scaling_groups_hold_the_rows_that_differ_only_in_gpu_count(capsys):
    # the large-scale table repeats each model's layout at 128, 256 and 512 GPUs: six groups of three
    groups = weak_scaling_groups(published_runs("llm_foundry_h100_large"))
    assert sorted(len(group) for group in groups) == [3] * 6
    assert all([gpus_of(run) for run in group] == [128, 256, 512] for group in groups)
    # the A100 40GB table's 1b rows at 32 / 64 / 128 GPUs share a layout, its 8-GPU 1b rows (grad_accum 4, other
    # micro-batches) do not join them
    a100 = weak_scaling_groups(published_runs("llm_foundry_a100_40gb"))
    one_b = [group for group in a100 if group[0].label.startswith("mpt-1b ")]
    assert [[gpus_of(run) for run in group] for group in one_b] == [[32, 64, 128]]
    for group in groups + a100:
        few, most = group[0], group[-1]
        measured = most.tokens_per_s_per_gpu / few.tokens_per_s_per_gpu - 1
        predicted = predicted_tokens_per_s_per_gpu(most) / predicted_tokens_per_s_per_gpu(few) - 1
        print(f"{few.table}: {few.label}: {gpus_of(few)} -> {gpus_of(most)} GPUs, per-GPU throughput "
              f"{measured:+.1%} measured, {predicted:+.1%} predicted")


def residual_stall_share(few: PublishedRun, most: PublishedRun) -> float:
    """The per-rank stall share the model still misses between a weak-scaling group's ends: the measured over the
    predicted ratio of tokens/s per GPU is (1 - s) to the power of the lockstep ranks the larger run adds."""
    measured = most.tokens_per_s_per_gpu / few.tokens_per_s_per_gpu
    predicted = predicted_tokens_per_s_per_gpu(most) / predicted_tokens_per_s_per_gpu(few)
    added = lockstep_ranks(most.config.layout, most.config.engine) - lockstep_ranks(few.config.layout,
                                                                                     few.config.engine)
    return -math.log(measured / predicted) / added


def test_the_rank_stall_share_explains_how_fsdp_rows_slow_down_with_their_gpu_count(capsys):
    # hardware.RANK_STALL_SHARE is the median over these groups of the share the model without it missed: with it,
    # the median left is near zero (a model change that moves the groups' ends apart shows here)
    groups = [group for group in weak_scaling_groups(published_runs())
              if lockstep_ranks(group[-1].config.layout, group[-1].config.engine)
              > lockstep_ranks(group[0].config.layout, group[0].config.engine)]
    assert len(groups) == 17 and {group[0].engine for group in groups} == {"fsdp"}
    residuals = []
    for group in groups:
        residuals.append(residual_stall_share(group[0], group[-1]))
        print(f"{group[0].table}: {group[0].label}: {gpus_of(group[0])} -> {gpus_of(group[-1])} GPUs, "
              f"residual stall share {residuals[-1]:+.1e}")
    print(f"median {statistics.median(residuals):+.1e} against RANK_STALL_SHARE {RANK_STALL_SHARE:.1e}")
    assert abs(statistics.median(residuals)) <= 0.2 * RANK_STALL_SHARE


def test_the_model_is_as_near_one_of_a_layouts_two_measurements_as_they_are_to_each_other(capsys):
    # llm-foundry measured 55 A100 80GB layouts in two campaigns (2023-05 bf16 PURE, 2023-10 amp_bf16): they differ by
    # a median 1.5% and by up to 19.8% (mpt-760m at 512 tokens: 36,719 then 29,446). Against the nearer of each
    # layout's two measurements the model misses by a median within a point of that and by at most 6%, but for
    # mpt-30b at 8k tokens on 8 GPUs, which both campaigns (and the H100 table) measured slower than it predicts
    pairs = repeated_layouts("llm_foundry_a100_80gb")
    assert len(pairs) == 55
    changes = [abs(row.tokens_per_s_per_gpu / earlier.tokens_per_s_per_gpu - 1) for row, earlier in pairs]
    nearer = {row.label: min(abs(prediction_error(row)), abs(prediction_error(earlier))) for row, earlier in pairs}
    with capsys.disabled():
        print(f"\nllm_foundry_a100_80gb, {len(pairs)} layouts measured twice: the campaigns differ by a median "
              f"{statistics.median(changes):.1%} (max {max(changes):.1%}); the model against the nearer measurement: "
              f"median {statistics.median(nearer.values()):.1%}, max {max(nearer.values()):.1%}")
    assert statistics.median(nearer.values()) <= statistics.median(changes) + 0.01
    outliers = {label for label, error in nearer.items() if error > 0.06}
    assert outliers == {"mpt-30b T=8192 gpus=8 mb=1 ckpt=full FULL_SHARD"}
