"""make_plan / Plan / plan_rows: one layout judged before launch, serialisable, fast."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from harness.config.schema import ModelConfig
from harness.plan.planner import GIB, Plan, engine_spec, make_plan, plan_rows, spec_for
from harness.plan.records import build
from plan_helpers import REAL_SHAPES, run_config

H100_8X8 = dict(name="h100_8x8", nodes=8, accelerators_per_node=8, accelerator="h100_sxm",
                memory_per_accelerator_gib=None, host_memory_gib=2048.0)


def llama70b_on_64_h100(**layout):
    # Full recomputation: under pipelining each stage keeps its gathered bf16 weights (8.2 GiB here) and its
    # unsharded fp32 gradients (16.4 GiB) for the whole step, which beside selective recomputation's 48 GiB of
    # activations would not fit an 80 GiB H100.
    fields = dict(dp_shard=4, tp=8, pp=2, zero_stage=3, grad_accum=8, micro_batch=1, seq_len=8192,
                  activation_checkpointing="full")
    fields.update(layout)
    return run_config(model="llama3_1_70b", engine=dict(name="nd", sequence_parallel=True), cluster=H100_8X8,
                      **fields)


def test_llama_70b_on_64_h100_in_a_fraction_of_a_second():
    from harness.config.model_shape import model_shape

    model_shape(llama70b_on_64_h100().model.hf_config)  # the meta build, once per config (then cached)
    start = time.perf_counter()
    plan = make_plan(llama70b_on_64_h100(), tokens_per_s=64 * 350.0)
    assert time.perf_counter() - start < 0.5
    assert plan.valid and plan.world_size == 64 and plan.errors == ()
    assert plan.device_memory_bytes == 80 * GIB and plan.device_memory_source == "datasheet:h100_sxm"
    assert plan.fits is True and plan.margin_bytes == plan.device_memory_bytes - plan.memory.total_bytes
    assert plan.tokens_per_step == 4 * 8 * 8192 and plan.global_batch == 32
    assert plan.flop_convention == "6N+6LHQT:attn=causal:lm_head"
    assert plan.peak_flops_per_device == 989.5e12 and plan.peak_flops_source == "datasheet:h100_sxm:bf16"
    assert plan.predicted_mfu == pytest.approx(64 * 350.0 * plan.flops_per_token / (989.5e12 * 64))
    assert plan.predicted_hfu > plan.predicted_mfu  # full recomputation adds a forward
    assert plan.mfu(64 * 350.0) == plan.predicted_mfu


def test_to_dict_is_json_and_complete():
    plan = make_plan(llama70b_on_64_h100())
    payload = json.loads(json.dumps(plan.to_dict()))
    assert payload == plan.to_dict()
    assert set(payload) == {
        "valid", "errors", "warnings", "model", "layout", "cluster", "engine", "world_size", "global_batch",
        "tokens_per_step", "memory", "device_memory_bytes", "device_memory_source", "fits", "margin_bytes",
        "flop_convention", "flops_per_token", "hfu_flops_per_token", "peak_flop_per_s_per_device", "peak_flops_source",
        "tokens_per_s", "predicted_mfu", "predicted_hfu", "step_time_s", "tflop_per_s_per_device", "time",
        "time_source", "prediction_band"}
    assert payload["memory"]["total_bytes"] == plan.memory.total_bytes
    assert payload["model"]["total_params"] == 70_553_706_496
    assert payload["layout"]["tp"] == 8


def test_oom_is_reported_with_a_negative_margin():
    plan = make_plan(llama70b_on_64_h100(dp_shard=8, tp=8, pp=1, zero_stage=0, micro_batch=4,
                                         activation_checkpointing="none"))
    assert plan.valid and plan.fits is False and plan.margin_bytes < 0


def test_invalid_plan_keeps_its_errors_and_serialises():
    plan = make_plan(run_config(tp=3, dp_shard=1))
    assert not plan.valid and plan.memory is None and plan.fits is None and plan.flops_per_token is None
    assert "tp=3 must divide num_attention_heads=4" in plan.errors
    json.dumps(plan.to_dict())
    unknown = make_plan(run_config(hf_config={"model_type": "bert"}))
    assert not unknown.valid and unknown.model is None and "model_type='bert'" in unknown.errors[0]


def test_unknown_accelerator_is_refused_with_the_nearest_name():
    # Without a table row there is no peak and no device memory: nothing to plan or launch against.
    plan = make_plan(run_config(cluster=dict(accelerator="h100_sxn", memory_per_accelerator_gib=None)),
                     tokens_per_s=1000.0)
    assert not plan.valid and plan.predicted_mfu is None
    assert plan.errors[0].startswith("cluster.accelerator='h100_sxn' is not in harness/plan/peak.py's table "
                                     "(did you mean 'h100_sxm'?)")


def test_cpu_peak_is_measured_and_labelled():
    plan = make_plan(run_config(), peak_flops_per_device=2e11, tokens_per_s=5000.0)
    assert plan.peak_flops_source == "measured:cpu-matmul"
    assert plan.predicted_mfu == pytest.approx(5000.0 * plan.flops_per_token / (2e11 * 2))
    assert make_plan(run_config()).peak_flops_per_device is None
    host = make_plan(run_config(cluster=dict(memory_per_accelerator_gib=None, host_memory_gib=24.0)))
    assert host.device_memory_bytes == 12 * GIB and host.device_memory_source == "host/ranks"


def test_tokens_per_step_ignore_tp_pp_cp():
    base = make_plan(llama70b_on_64_h100())
    other = make_plan(llama70b_on_64_h100(tp=4, pp=4, grad_accum=8))
    assert base.tokens_per_step == other.tokens_per_step == 4 * 1 * 8 * 8192


def test_specs_are_built_once():
    cfg = run_config()
    assert make_plan(cfg).model is make_plan(run_config()).model is spec_for(cfg.model)


def test_fast_build_equals_the_constructor():
    plan = make_plan(llama70b_on_64_h100())
    values = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    assert Plan(**values) == plan == build(Plan, **values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.fits = False
    values.pop("fits")
    with pytest.raises(TypeError, match="missing fields \\['fits'\\]"):
        build(Plan, **values)


def test_plan_rows():
    plans = [make_plan(llama70b_on_64_h100()), make_plan(run_config(tp=3, dp_shard=1))]
    rows = plan_rows(plans)
    assert [row["valid"] for row in rows] == [True, False]
    assert rows[0]["memory_per_rank(GiB)"] == round(plans[0].memory.total_bytes / GIB, 2)
    assert rows[0]["fits"] is True and rows[0]["tp"] == 8 and rows[0]["engine"] == "nd"
    assert "; tp=3 must divide num_attention_heads=4; " in rows[1]["errors"]
    assert rows[1]["memory_per_rank(GiB)"] is None
    assert len({tuple(row) for row in rows}) == 1  # same columns for every row
    json.dumps(rows)


def test_hfu_and_memory_totals_in_the_dict():
    plan = make_plan(llama70b_on_64_h100(activation_checkpointing="full"))
    assert plan.hfu(10_000.0) == pytest.approx(plan.mfu(10_000.0) * plan.hfu_flops_per_token / plan.flops_per_token)
    assert plan.hfu_flops_per_token / plan.flops_per_token == pytest.approx(4 / 3, rel=0.02)
    memory = plan.to_dict()["memory"]
    assert memory["optimizer_bytes"] == memory["master_bytes"] + memory["moment_bytes"] + memory["optimizer_grad_bytes"]
    assert memory["state_bytes"] == memory["param_bytes"] + memory["grad_bytes"] + memory["optimizer_bytes"]


def test_clear_caches_rebuilds_specs():
    from harness.plan.planner import clear_caches

    cfg = run_config()
    before = make_plan(cfg).model
    clear_caches()
    after = make_plan(cfg).model
    assert after is not before and after == before


def test_cluster_allowance_overrides_the_default():
    from dataclasses import replace

    from harness.config.compose import compose_run_config
    from harness.plan.planner import clear_caches, make_plan

    clear_caches()
    run = compose_run_config(["recipes=cpu_zero2"])
    base = make_plan(run).memory
    tight = make_plan(replace(run, cluster=replace(run.cluster, memory_allowance_fraction=0.0,
                                                   memory_allowance_fixed_gib=1.0))).memory
    assert base.allowance_bytes > 0  # the default 10% on CPU
    assert tight.allowance_bytes == 2**30
    assert tight.total_bytes - tight.allowance_bytes == base.total_bytes - base.allowance_bytes


def test_a_profiles_measured_peak_replaces_the_missing_one_and_its_warning():
    """A CPU plan timed by the host's profile showed an MFU beside "no peak FLOP/s ... MFU not computed", and
    named its peak `measured:measured:cpu-vm:...`."""
    from harness.plan.peak import Peak, peak_flops
    from harness.plan.planner import measured_when_missing

    missing = peak_flops("cpu", "bf16", None)
    assert missing.flops is None and "MFU not computed" in missing.warning
    warnings = ["another note", missing.warning]
    peak = measured_when_missing(missing, 1e11, "measured:cpu-vm:2026-12-07T02:19:20Z", warnings)
    assert (peak.flops, peak.source, warnings) == (1e11, "measured:cpu-vm:2026-12-07T02:19:20Z", ["another note"])
    assert measured_when_missing(missing, 1e11, "host").source == "measured:host"
    kept = Peak(5e14, "datasheet:h100_sxm:bf16")
    assert measured_when_missing(kept, 1e11, "measured:x") is kept


@pytest.mark.parametrize("engine, zero, same", [("megatron_lm", 1, True), ("fsdp", 3, False)])
def test_megatron_lm_runs_its_own_attention_whatever_attn_implementation_says(engine, zero, same):
    # Megatron-LM builds its own attention layer (Transformer Engine's fused kernel); the torch engines run
    # transformers' model, whose eager attention materialises the scores: more time and more memory
    def plan(attention):
        hf = dict(REAL_SHAPES["llama3_1_8b"], attn_implementation=attention)
        return make_plan(run_config("llama3_1_8b", hf, engine=dict(name=engine), dp_shard=8, zero_stage=zero,
                                    micro_batch=1, seq_len=4096, cluster=dict(name="h100", accelerator="h100_sxm",
                                                                              accelerators_per_node=8)))
    eager, sdpa = plan("eager"), plan("sdpa")
    assert not eager.errors and not sdpa.errors
    assert (eager.tokens_per_s == pytest.approx(sdpa.tokens_per_s)) is same
    assert (eager.memory.total_bytes == sdpa.memory.total_bytes) is same
    if not same:
        assert eager.tokens_per_s < sdpa.tokens_per_s and eager.memory.total_bytes > sdpa.memory.total_bytes


def test_an_engine_with_its_own_attention_plans_one_model_object_per_model():
    # the per-rank states and the time model's kernels are memoised on the model's identity: a fresh copy per plan
    # would miss them on every candidate of a Megatron-LM search
    spec = spec_for(ModelConfig(name="llama3_1_8b", hf_config=dict(REAL_SHAPES["llama3_1_8b"],
                                                                   attn_implementation="eager")))
    first, second = engine_spec(spec, "megatron_lm"), engine_spec(spec, "megatron_lm")
    assert first is second and first is not spec and first.attn_implementation == "sdpa"
    assert engine_spec(spec, "nd") is spec
