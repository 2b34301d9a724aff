"""The recommender: enumerate, prune, rank by predicted tokens/s, explain, write a sweep preset."""

from __future__ import annotations

from harness.launch.recommend import ranked
from harness.plan.recommend import compare, stage_split
from plan_helpers import run_config

H100_1X8 = dict(name="gpu_h100_1x8", nodes=1, accelerators_per_node=8, accelerator="h100_sxm",
                memory_per_accelerator_gib=None, host_memory_gib=2048.0)


def llama8b_on_8_h100():
    return run_config(model="llama3_1_8b", engine=dict(name="nd"), cluster=H100_1X8, seq_len=8192)


def test_top_layouts_fit_are_sorted_and_keep_the_global_batch():
    choices, fitting = ranked(llama8b_on_8_h100(), global_batch=64, top_k=5)
    top = [choice.plan for choice in choices]
    assert len(top) == 5 and fitting >= 5
    speeds = [max([c.plan, *c.alike], key=lambda p: p.tokens_per_s).tokens_per_s for c in choices]
    assert speeds == sorted(speeds, reverse=True)
    for plan in top:
        assert plan.valid and plan.fits and plan.world_size == 8 and plan.global_batch == 64
        assert plan.time is not None and 0 < plan.predicted_mfu < 0.8


def test_comparison_names_each_part_that_differs_in_seconds():
    choices, _ = ranked(llama8b_on_8_h100(), global_batch=64, top_k=8)
    best, slower = choices[0].plan, choices[-1].plan
    head, *parts = compare(best, slower)
    assert head.startswith(f"{best.tokens_per_s / slower.tokens_per_s:.2f}x the tokens/s")
    assert parts and all(" s -> " in part and part.endswith(" s") for part in parts)


def test_uneven_stage_split_keeps_every_layer():
    assert stage_split(126, 16) == [7] + [8] * 14 + [7]
    assert sum(stage_split(126, 32)) == 126 and max(stage_split(126, 32)) - min(stage_split(126, 32)) == 1


def test_recommended_layouts_on_a_measured_cpu_profile_carry_mfu(tmp_path):
    # a CPU's peak is its profile's measured one: the ranked plans take it as make_plan does
    from dataclasses import replace

    from harness.plan.hardware import HARDWARE, PROFILE_VERSION, save_profile
    from harness.plan.planner import make_plan

    measured = replace(HARDWARE["h100_sxm"], name="cpu-test", overlaps_comm=False, measured_peak_flops=2e11,
                       source="measured:cpu-test", version=PROFILE_VERSION)
    path = save_profile(measured, tmp_path / "cpu-test.json")
    cfg = run_config(cluster=dict(profile=str(path)))
    top = [choice.plan for choice in ranked(cfg, global_batch=8, top_k=2)[0]]
    assert top and all(plan.predicted_mfu is not None and plan.peak_flops_per_device == 2e11 for plan in top)
    direct = make_plan(replace(cfg, layout=top[0].layout, engine=top[0].engine))
    assert top[0].predicted_mfu == direct.predicted_mfu and top[0].peak_flops_source == direct.peak_flops_source


def test_expert_parallel_degrees_are_searched_for_moe_models_on_engines_that_have_them():
    from dataclasses import replace

    from harness.config.schema import LauncherConfig

    cfg = replace(run_config(model="mixtral_8x7b", engine=dict(name="megatron_lm"),
                             cluster=dict(name="h100", nodes=4, accelerators_per_node=8, accelerator="h100_sxm",
                                          memory_per_accelerator_gib=80.0), seq_len=4096),
                  launcher=LauncherConfig(backend="slurm"))
    from harness.launch.recommend import admit
    from harness.plan.recommend import candidates

    seen = {plan.layout.ep for plan in candidates(cfg, global_batch=256, admit=admit)}
    assert seen >= {1, 2, 4, 8} and max(seen) <= 8  # Mixtral has 8 experts
    dense = run_config(model="llama3_1_8b", engine=dict(name="megatron_lm"),
                       cluster=dict(name="h100", nodes=1, accelerators_per_node=8, accelerator="h100_sxm",
                                    memory_per_accelerator_gib=80.0), seq_len=4096)
    assert {plan.layout.ep for plan in candidates(dense, global_batch=64, admit=admit)} == {1}


# The regime: FP8 and compile are searched where the engine and the device have them, unless the command pins them.


def test_regimes_offer_fp8_and_compile_where_engine_and_device_have_them():
    from harness.launch.recommend import pinned_regime
    from harness.plan.recommend import regimes

    nd = llama8b_on_8_h100()
    assert regimes(nd) == [("bf16", False), ("bf16", True), ("fp8", False), ("fp8", True)]
    assert regimes(nd, pinned_regime(["layout.precision=bf16"])) == [("bf16", False), ("bf16", True)]
    assert regimes(nd, pinned_regime(["engine.compile=false", "model=x"])) == [("bf16", False), ("fp8", False)]
    deepspeed = run_config(model="llama3_1_8b", cluster=H100_1X8, seq_len=8192)
    assert regimes(deepspeed) == [("bf16", False), ("bf16", True)]  # DeepSpeed compiles, has no FP8
    a100 = run_config(model="llama3_1_8b", engine=dict(name="nd"), cluster=dict(H100_1X8, accelerator="a100_sxm"))
    assert regimes(a100) == [("bf16", False), ("bf16", True)]
    assert regimes(run_config(engine=dict(name="nd"))) == [("bf16", False)]  # CPU: neither
    assert regimes(run_config(engine=dict(name="nd"), cluster=H100_1X8, precision="fp32")) == [("fp32", False),
                                                                                              ("fp32", True)]


def test_the_search_ranks_fp8_compiled_layouts_first_on_h100_and_keeps_a_pinned_regime():
    top, _ = ranked(llama8b_on_8_h100(), global_batch=64, top_k=1)
    best = top[0].plan
    assert (best.layout.precision, best.engine.compile) == ("fp8", True)
    eager, _ = ranked(llama8b_on_8_h100(), global_batch=64, top_k=3, pinned=("layout.precision", "engine.compile"))
    assert {(c.plan.layout.precision, c.plan.engine.compile) for c in eager} == {("bf16", False)}
    assert best.tokens_per_s > eager[0].plan.tokens_per_s


def test_a_mode_refused_for_a_reason_other_than_memory_leaves_the_next_modes_searched():
    # nd refuses compile x tp > 1 with full checkpointing (harness.plan.support.compile_problem), not for
    # memory: its compiled tensor-parallel layouts are still searched with selective or no checkpointing
    from harness.launch.recommend import admit
    from harness.plan.recommend import candidates
    cfg = run_config(model="llama3_1_8b", engine=dict(name="nd", compile=True), cluster=H100_1X8, seq_len=8192)
    seen = {(plan.layout.tp, plan.layout.activation_checkpointing)
            for plan in candidates(cfg, global_batch=64, admit=admit, pinned=("engine.compile",))}
    assert any(tp > 1 and mode != "full" for tp, mode in seen), seen


def test_pinned_tensor_parallel_options_keep_their_configured_value():
    from harness.launch.recommend import pinned_regime
    from harness.plan.recommend import tensor_parallel_options
    assert pinned_regime(["engine.sequence_parallel=false", "model=x"]) == ("engine.sequence_parallel",)
    engine = llama8b_on_8_h100().engine
    assert tensor_parallel_options(engine, 2).sequence_parallel is True
    kept = tensor_parallel_options(engine, 2, pinned=("engine.sequence_parallel",))
    assert kept.sequence_parallel is engine.sequence_parallel and kept.loss_parallel is True


def test_a_node_of_six_gpus_is_searched_with_degrees_of_three():
    # 64 sequences on 6 GPUs: a data-parallel degree of 3 or 6 cannot make 64, a pipeline of 3 (or 6) can
    cluster = dict(H100_1X8, accelerators_per_node=6)
    choices, admitted = ranked(run_config(model="llama3_1_8b", engine=dict(name="nd"), cluster=cluster,
                                          seq_len=8192), global_batch=64, top_k=1)
    assert admitted and choices[0].plan.layout.pp in (3, 6), choices


def test_the_pruned_search_admits_every_layout_an_exhaustive_one_does():
    # the oracle plans every structure x regime x checkpointing mode x micro-batch, stopping at nothing; 6 GPUs
    # have interleaved pipelines whose smallest micro-batches break a rule (accumulation over pp) a bigger lifts
    from dataclasses import replace

    from harness.launch.recommend import admit
    from harness.plan.parallel_dims import ParallelDims
    from harness.plan.planner import make_plan, spec_for, with_time
    from harness.plan.recommend import (CHECKPOINTING_BY_MEMORY, MICRO_BATCHES, candidates, regimes, structures,
                                        tensor_parallel_options)
    cfg = run_config(model="llama3_1_8b", engine=dict(name="nd"), cluster=dict(H100_1X8, accelerators_per_node=6),
                     seq_len=8192)

    def key(plan):
        return (repr(plan.layout), plan.engine.compile)

    exhaustive = set()
    for fields in structures(spec_for(cfg.model), 6, 6, "nd"):
        dp = ParallelDims(dp_replicate=fields["dp_replicate"], dp_shard=fields["dp_shard"]).dp
        for precision, compiled in regimes(cfg):
            engine = replace(tensor_parallel_options(cfg.engine, fields["tp"]), compile=compiled)
            for mode in CHECKPOINTING_BY_MEMORY:
                for micro in MICRO_BATCHES:
                    accum, rest = divmod(64, dp * micro)
                    if rest or accum < 1:
                        continue
                    point = replace(cfg, engine=engine, layout=replace(
                        cfg.layout, precision=precision, micro_batch=micro, grad_accum=accum,
                        activation_checkpointing=mode, **fields))
                    plan = make_plan(point, predict_time=False)
                    if not admit(point, plan) and not admit(point, with_time(plan, point)):
                        exhaustive.add(key(plan))
    pruned = {key(plan) for plan in candidates(cfg, 64, admit)}
    assert pruned == exhaustive and len(pruned) > 100, (len(pruned), len(exhaustive))
