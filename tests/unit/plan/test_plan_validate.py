"""Layout validation: every error at once, each naming fields, values and the rule."""

from __future__ import annotations

import pytest

from harness.config.schema import ClusterConfig, LayoutConfig, ModelConfig, RunConfig, engine_config
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.validate import validate
from plan_helpers import REAL_SHAPES, ROOT, preset, run_config

H100 = dict(accelerator="h100_sxm", memory_per_accelerator_gib=None, accelerators_per_node=8)


def check(cfg):
    return validate(cfg, model_spec_from_hf(cfg.model.name, cfg.model.hf_config))


def errors_of(**kw):
    return check(run_config(**kw))[0]


def test_default_tiny_layout_is_valid():
    assert check(run_config()) == ([], [])


def test_tp_must_divide_heads_in_the_house_style():
    errors = errors_of(model="llama3_1_8b", tp=3, dp_shard=1, cluster=dict(accelerators_per_node=3))
    assert "tp=3 must divide num_attention_heads=32" in errors
    assert "tp=3 must divide num_key_value_heads=8" in errors


def test_all_errors_reported_at_once():
    errors = errors_of(model="llama3_1_8b", tp=3, cp=3, seq_len=100, engine=dict(name="fsdp"), zero_stage=1)
    assert any(e.startswith("dp_replicate=1 x dp_shard=2 x tp=3 x pp=1 x cp=3 = 18 must equal cluster.nodes=1 x "
                            "cluster.accelerators_per_node=2 = 2") for e in errors)
    assert "tp=3 must divide num_attention_heads=32" in errors
    assert "cp=3: seq_len=100 must be divisible by 2 x cp = 6 (load-balanced causal)" in errors
    assert "engine=fsdp does not support zero_stage=1 (FSDP has no optimizer-only sharding level)" in errors
    assert "cp=3 on accelerator=cpu: context parallelism does not run on CPU" in errors
    assert len(errors) >= 5


def test_world_size_counts_ep_inside():
    moe = dict(model_type="mixtral", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=256, num_local_experts=4,
               num_experts_per_tok=2)
    assert errors_of(hf_config=moe, engine=dict(name="megatron_lm"), zero_stage=1, ep=2) == []
    assert "ep=3 must divide num_experts=4" in errors_of(hf_config=moe, engine=dict(name="megatron_lm"),
                                                         zero_stage=1, ep=3)
    assert any("ep=4 must divide dp_shard=2 x cp=1 = 2" in e
               for e in errors_of(hf_config=moe, engine=dict(name="megatron_lm"), zero_stage=1, ep=4))
    assert "ep=2 needs a mixture-of-experts model; tiny_llama is dense" in errors_of(ep=2)
    assert "engine=deepspeed does not support ep=2" in errors_of(hf_config=moe, ep=2)


def test_pipeline_layers_and_uneven_split():
    assert any("pp=4 x pp_virtual_stages=1 = 4 must divide num_hidden_layers=2" in e
               for e in errors_of(engine=dict(name="nd"), zero_stage=0, dp_shard=1, pp=4, grad_accum=4,
                                  cluster=dict(accelerators_per_node=4)))
    fields = dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=5)
    errors, warnings = check(run_config(hf_config=fields, engine=dict(name="nd"), zero_stage=0, dp_shard=1, pp=2,
                                        grad_accum=2, pp_stage_layers=[3, 2]))
    assert errors == [] and warnings == ["pp_stage_layers=[3, 2]: uneven split, the largest stage sets the pace"]
    assert any("must be >= 0 and sum to num_hidden_layers=5 (sum 4)" in e for e in
               errors_of(hf_config=fields, engine=dict(name="nd"), zero_stage=0, dp_shard=1, pp=2, grad_accum=2,
                         pp_stage_layers=[2, 2]))


def test_pipeline_schedules_need_micro_batches_and_stages():
    base = dict(engine=dict(name="nd"), zero_stage=0, dp_shard=1, pp=2, cluster=dict(accelerators_per_node=2))
    assert "pp_schedule=1F1B needs grad_accum (micro-batches) >= pp=2, got grad_accum=1" in errors_of(grad_accum=1, **base)
    assert "pp_schedule=1F1B runs one stage per rank: pp_virtual_stages=2 must be 1" in errors_of(
        grad_accum=2, pp_virtual_stages=2, hf_config=dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4), **base)
    assert "pp_schedule=ZBVZeroBubble runs exactly two stages per rank: pp_virtual_stages=1 must be 2" in errors_of(
        grad_accum=2, pp_schedule="ZBVZeroBubble", **base)
    assert any("needs grad_accum=5 to be a multiple of its 2 rounds" in e for e in errors_of(
        grad_accum=5, pp_schedule="Interleaved1F1B", pp_virtual_stages=2,
        hf_config=dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4), **base))
    assert "pp_schedule=DualPipeV needs grad_accum (micro-batches) >= pp x 2 = 4, got grad_accum=3" in errors_of(
        grad_accum=3, pp_schedule="DualPipeV", pp_virtual_stages=2,
        hf_config=dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4), **base)


def test_batch_fields_must_be_positive():
    errors = errors_of(micro_batch=0, grad_accum=-1)
    assert errors == ["layout.micro_batch=0, layout.grad_accum=-1: degrees and batch fields must be >= 1"]


def test_engine_support_matrix():
    pp2 = dict(dp_shard=1, pp=2, grad_accum=2)
    assert "engine=deepspeed rejects zero_stage=2 with pp=2 (allowed: 0, 1)" in errors_of(zero_stage=2, **pp2)
    assert errors_of(zero_stage=1, **pp2) == []
    assert "engine=fsdp does not support pp=2" in errors_of(engine=dict(name="fsdp"), zero_stage=3, **pp2)
    # DeepSpeed's AutoTP trains at ZeRO 0-2 only (at 3 the ranks disagree on the data-parallel world).
    tp2 = dict(dp_shard=1, tp=2)
    assert any(e.startswith("engine=deepspeed rejects zero_stage=3 with tp=2 (allowed: 0, 1, 2")
               for e in errors_of(zero_stage=3, **tp2))
    assert errors_of(zero_stage=2, **tp2) == []
    assert "engine=deepspeed does not support cp=2" in errors_of(
        cp=2, dp_shard=1, cluster=H100 | dict(accelerators_per_node=2))
    assert any(e.startswith("engine=megatron_lm does not support zero_stage=3") for e in
               errors_of(engine=dict(name="megatron_lm"), zero_stage=3))
    assert any("cannot shard over dp_shard only (dp_replicate=2) at zero_stage=2" in e for e in
               errors_of(dp_replicate=2, dp_shard=1, zero_stage=2))
    assert errors_of(engine=dict(name="fsdp"), dp_replicate=2, dp_shard=1, zero_stage=3) == []


def test_deepspeed_refuses_hybrid_sharding_which_its_config_cannot_express():
    # The plan would replicate ZeRO-3's states over dp_replicate while DeepSpeed shards them over every rank:
    # its one hybrid scheme, MiCS, is refused by DeepSpeed's own config parser.
    import pytest
    from deepspeed.runtime.config import DeepSpeedConfigError, _reject_removed_config_keys

    with pytest.raises(DeepSpeedConfigError, match="MiCS ZeRO-3 sharding has been removed"):
        _reject_removed_config_keys({"zero_optimization": {"stage": 3, "mics_shard_size": 1}})
    problems = errors_of(dp_replicate=2, dp_shard=1, zero_stage=3)
    assert any(e.startswith("engine=deepspeed cannot shard over dp_shard only (dp_replicate=2) at zero_stage=3 "
                            "(DeepSpeed 0.19 shards ZeRO over every data-parallel rank: MiCS") for e in problems)
    assert errors_of(dp_replicate=2, dp_shard=1, zero_stage=0) == []
    assert "engine=fsdp fsdp_version=1 cannot compose tp=2 / cp=1 (needs FSDP2)" in errors_of(
        engine=dict(name="fsdp", fsdp_version=1), zero_stage=3, dp_shard=1, tp=2)


def test_compile_only_where_the_engine_compiles():
    for name in ("deepspeed", "nd"):
        assert errors_of(engine=dict(name=name, compile=True), zero_stage=3 if name == "nd" else 2) == []
    assert errors_of(engine=dict(name="fsdp", compile=True), zero_stage=3) == []
    assert ("engine.compile=true with engine=megatron_lm: Megatron-LM's command line has no torch.compile option "
            "(its fused kernels are on by default); use engine.compile=false") in errors_of(
        engine=dict(name="megatron_lm", compile=True), zero_stage=1)
    assert any(e.startswith("engine.compile=true with engine.fsdp_version=1") for e in errors_of(
        engine=dict(name="fsdp", fsdp_version=1, compile=True), zero_stage=3))
    assert errors_of(engine=dict(name="megatron_lm"), zero_stage=1) == []


@pytest.mark.parametrize("schedule,chunks", [("ZBVZeroBubble", 2), ("InterleavedZeroBubble", 2), ("DualPipeV", 2)])
def test_compile_is_refused_with_torchs_zero_bubble_schedules(schedule, chunks):
    """torch 2.13's zero-bubble runtimes raise on compiled stage modules (_check_torch_compile_compatibility)."""
    pipelined = dict(engine=dict(name="nd", compile=True), pp=2, dp_shard=1, zero_stage=0, pp_schedule=schedule,
                     pp_virtual_stages=chunks, grad_accum=4,
                     hf_config=dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4))
    assert any(e.startswith(f"engine.compile=true with layout.pp_schedule={schedule}: torch's zero-bubble")
               for e in errors_of(**pipelined))
    assert errors_of(**{**pipelined, "pp_schedule": "Interleaved1F1B"}) == []
    assert errors_of(**{**pipelined, "engine": dict(name="nd")}) == []


def test_nd_compile_with_tensor_parallelism_and_full_recomputation_is_refused():
    tp2 = dict(engine=dict(name="nd", compile=True), tp=2, dp_shard=1, zero_stage=0, activation_checkpointing="full",
               cluster=dict(accelerators_per_node=2))
    assert any(e.startswith("engine.compile=true with tp=2 and layout.activation_checkpointing=full on engine=nd")
               for e in errors_of(**tp2))
    assert errors_of(**{**tp2, "activation_checkpointing": "none"}) == []
    assert errors_of(**{**tp2, "tp": 1, "dp_shard": 2}) == []


def test_nd_context_parallelism_with_a_pipeline_is_refused_as_the_support_table_says_and_megatron_runs_it():
    # nd runs ring attention around one whole model's forward and backward, never inside pipeline stages; the
    # planner refuses it before sizing memory, and the recommender never generates it (structures)
    both = dict(cp=2, pp=2, dp_shard=2, zero_stage=0, grad_accum=4, seq_len=64,
                hf_config=dict(REAL_SHAPES["tiny_llama"], num_hidden_layers=4), cluster=H100)
    assert "layout.cp=2 with pp=2: engine=nd runs context parallelism without pipeline parallelism" in errors_of(
        engine=dict(name="nd"), **both)
    assert errors_of(engine=dict(name="nd"), **{**both, "pp": 1, "dp_shard": 4}) == []
    assert errors_of(engine=dict(name="megatron_lm"), **{**both, "zero_stage": 1}) == []


@pytest.mark.parametrize("axis", ["tp", "cp"])
def test_fsdp_runs_tensor_and_context_parallelism_on_gpu_only(axis):
    layout = dict(engine=dict(name="fsdp"), zero_stage=3, seq_len=64, **{axis: 2})
    errors = errors_of(**layout)
    assert (f"engine=fsdp runs {axis}=2 on GPU only, not accelerator=cpu (Accelerate's ParallelismConfig refuses "
            "a MULTI_CPU state; engine=nd runs tp on CPU)") in errors
    assert errors_of(**layout, cluster=H100 | dict(accelerators_per_node=4)) == []
    assert errors_of(**{**layout, "engine": dict(name="nd")}, cluster=dict(accelerators_per_node=4)) == (
        [] if axis == "tp" else ["cp=2 on accelerator=cpu: context parallelism does not run on CPU"])


def test_offload_only_where_sharding_supports_it():
    assert ("engine=deepspeed: offload_params=cpu at zero_stage=2 is not supported (zero_stage in 3)"
            in errors_of(zero_stage=2, offload_params="cpu"))
    assert ("engine=deepspeed: offload_optimizer=cpu at zero_stage=0 is not supported (zero_stage in 1, 2, 3)"
            in errors_of(zero_stage=0, offload_optimizer="cpu"))
    assert errors_of(zero_stage=2, offload_optimizer="cpu") == []
    assert "offload to nvme needs layout.nvme_path" in errors_of(zero_stage=3, offload_optimizer="nvme")
    assert errors_of(zero_stage=3, offload_optimizer="nvme", nvme_path="/local_nvme") == []
    assert any(e.startswith("engine=fsdp offloads parameters, gradients and optimizer together") for e in
               errors_of(engine=dict(name="fsdp"), zero_stage=3, offload_optimizer="cpu"))


def test_device_rules_and_warnings():
    assert "precision=fp16 on accelerator=cpu: fp16 training is not supported on CPU" in errors_of(precision="fp16")
    mha = dict(REAL_SHAPES["llama3_1_8b"], num_key_value_heads=32)
    errors, warnings = check(run_config(model="llama_mha", hf_config=mha, tp=16, dp_shard=1, zero_stage=0,
                                        cluster=dict(H100, nodes=2)))
    assert errors == []
    assert ("tp=16 > cluster.accelerators_per_node=8: tensor-parallel collectives cross the inter-node network"
            in warnings)
    assert "seq_len=2048 exceeds the learned position table n_positions=1024" in errors_of(
        model="gpt2", seq_len=2048)


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp", "nd"])
def test_cpu_presets_are_valid(engine):
    layout = preset(ROOT / "hydra_configs" / "layout" / "dp2_zero2.yaml")
    cluster = preset(ROOT / "hydra_configs" / "cluster" / "cpu.yaml")
    model = preset(ROOT / "hydra_configs" / "model" / "tiny_llama.yaml")
    cfg = RunConfig(model=ModelConfig(**model), engine=engine_config(name=engine), layout=LayoutConfig(**layout),
                    cluster=ClusterConfig(**cluster))
    assert check(cfg)[0] == []


def test_an_end_stage_may_hold_no_layer_from_the_command_line_as_the_pipeline_rule_says():
    # The embedding alone on the first stage (the NeMo 405B layouts' empty stages; nd runs it on the CPU stand-in)
    from harness.config.compose import compose_run_config
    from harness.plan.planner import make_plan

    plan = make_plan(compose_run_config(["recipes=cpu_nd_pp2", "layout.pp_stage_layers=[0,2]"]))
    assert plan.valid, plan.errors
    middle = make_plan(compose_run_config(["recipes=cpu_nd_pp2", "layout.pp=2", "layout.pp_stage_layers=[2,0]"]))
    assert middle.valid
