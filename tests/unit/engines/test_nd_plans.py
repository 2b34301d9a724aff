"""nd's layout as data: mesh order, TP plans per family, pipeline splits and placement, the checks that refuse
what nd cannot run, and the exact per-rank parameter count the planner predicts (pure Python, no torch)."""

from dataclasses import replace

import pytest

from harness.config.compose import compose_run_config
from harness.engines import nd_plans, nd_tp
from harness.launch.prepare import plan_record
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.parallel_dims import ParallelDims
from harness.plan.planner import make_plan

BASE = compose_run_config(["engine=nd", "layout=single", "layout.precision=fp32"])
GPU = compose_run_config(["engine=nd", "layout=single", "cluster=h100_8x8", "model=llama3_1_70b"])
HF = {
    "llama": BASE.model.hf_config,
    "qwen2": {**BASE.model.hf_config, "model_type": "qwen2"},
    "mistral": {**BASE.model.hf_config, "model_type": "mistral"},
    "qwen3": {**BASE.model.hf_config, "model_type": "qwen3", "head_dim": 16},
    "mixtral": {**BASE.model.hf_config, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
}


def with_layout(cfg=BASE, processes=None, **fields):
    layout = replace(cfg.layout, **fields)
    cluster = replace(cfg.cluster, nodes=1, accelerators_per_node=processes or ParallelDims.of(layout).world_size)
    return replace(cfg, layout=layout, cluster=cluster)


def errors_of(cfg):
    return nd_plans.check(cfg)[0]


# ------------------------------------------------------------------------------------------- mesh
# ---------------------------------------------------------------------------------------- TP plans
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_dense_layer_plan_is_megatron_column_then_row(family):
    """transformers' base_model_tp_plan, translated: colwise/rowwise become torch's styles; Qwen 3's per-head
    q/k norms (replicated_with_grad_allreduce) sum their gradients over the TP group."""
    plan = nd_plans.layer_tp_plan(HF[family], sequence_parallel=False)
    norms = {"self_attn.q_norm": "ReplicateWithGradAllReduce", "self_attn.k_norm": "ReplicateWithGradAllReduce"}
    assert {k: v["style"] for k, v in plan.items()} == {
        "self_attn.q_proj": "ColwiseParallel", "self_attn.k_proj": "ColwiseParallel",
        "self_attn.v_proj": "ColwiseParallel", "self_attn.o_proj": "RowwiseParallel",
        "mlp.gate_proj": "ColwiseParallel", "mlp.up_proj": "ColwiseParallel", "mlp.down_proj": "RowwiseParallel",
        **(norms if family == "qwen3" else {}),
    }  # fmt: skip
    assert nd_tp.family_tp_plan(HF[family])[1] == "transformers"


def test_sequence_parallel_shards_norms_and_reduce_scatters_row_outputs():
    plan = nd_plans.layer_tp_plan(HF["llama"], sequence_parallel=True)
    assert plan["input_layernorm"] == {"style": "SequenceParallel", "use_local_output": True}
    assert plan["post_attention_layernorm"] == {"style": "SequenceParallel", "use_local_output": True}
    assert plan["self_attn"]["input_kwarg_layouts"] == {"hidden_states": "Shard(1)"}
    assert plan["self_attn"]["desired_input_kwarg_layouts"] == {"hidden_states": "Replicate()"}
    assert plan["mlp"]["input_layouts"] == ["Shard(1)"]
    assert plan["self_attn.o_proj"]["output_layouts"] == "Shard(1)"
    assert plan["mlp.down_proj"]["output_layouts"] == "Shard(1)"


def test_mixtral_splits_attention_and_keeps_the_moe_block_whole():
    plain = nd_plans.layer_tp_plan(HF["mixtral"], sequence_parallel=False)
    assert not any(path.startswith("mlp") for path in plain)
    assert plain["self_attn.q_proj"]["style"] == "ColwiseParallel"
    sp = nd_plans.layer_tp_plan(HF["mixtral"], sequence_parallel=True)
    assert sp["mlp"]["style"] == "PrepareModuleInputOutput"
    assert sp["mlp"]["desired_input_layouts"] == ["Replicate()"]
    assert sp["mlp"]["desired_output_layouts"] == ["Shard(1)"]


def test_gathered_projections_and_post_norms_follow_transformers_plan():
    """OLMo 2 normalises the whole q and k: transformers gathers their outputs (colwise_gather_output) and
    splits o_proj's input (rowwise_split_input); its norms come after attention and MLP."""
    hf = {**BASE.model.hf_config, "model_type": "olmo2"}
    plan = nd_plans.layer_tp_plan(hf, sequence_parallel=True)
    assert plan["self_attn.q_proj"] == {"style": "ColwiseParallel", "output_layouts": "Replicate()"}
    assert plan["self_attn.o_proj"] == {"style": "RowwiseParallel", "input_layouts": "Replicate()",
                                        "output_layouts": "Shard(1)"}  # fmt: skip
    assert plan["post_attention_layernorm"] == plan["post_feedforward_layernorm"] == {"style": "SequenceParallel",
                                                                                     "use_local_output": True}
    assert "input_layernorm" not in plan


def test_family_without_a_plan_is_refused_by_name():
    hf = {**BASE.model.hf_config, "model_type": "stablelm"}
    assert nd_tp.family_tp_plan(hf)[1] == "none"
    with pytest.raises(ValueError, match="'stablelm' has no tensor-parallel plan"):
        nd_plans.layer_tp_plan(hf, sequence_parallel=False)


def test_plan_without_attention_is_refused_by_name():
    """transformers' DeepSeek-V3 plan splits only the MLPs and experts (multi-latent attention is left out)."""
    problems = nd_tp.tp_plan_problems({**BASE.model.hf_config, "model_type": "deepseek_v3", "n_routed_experts": 4,
                                       "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1,
                                       "topk_group": 1})  # fmt: skip
    assert problems == ["model_type='deepseek_v3': base_model_tp_plan splits no attention block"]


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("lp", [False, True])
def test_top_plan_vocab_parallel_embedding_and_head(sp, lp):
    plan = nd_plans.top_tp_plan(sp, lp)
    assert plan["embed_tokens"]["style"] == "RowwiseParallel"
    assert plan["embed_tokens"]["output_layouts"] == ("Shard(1)" if sp else "Replicate()")
    assert ("norm" in plan) == sp
    head = plan["lm_head"]
    assert head["style"] == "ColwiseParallel"
    assert head["output_layouts"] == ("Shard(-1)" if lp else "Replicate()")
    assert head["use_local_output"] is (not lp)


def test_heads_per_rank():
    spec = model_spec_from_hf("m", GPU.model.hf_config)
    assert nd_plans.tp_attention_heads(spec, 8) == {"num_attention_heads": 8, "num_key_value_heads": 1}


# ---------------------------------------------------------------------------------------- pipeline
def test_pipeline_plan_with_virtual_stages():
    layout = replace(BASE.layout, pp=2, pp_virtual_stages=2, pp_schedule="Interleaved1F1B", grad_accum=4)
    plan = nd_plans.pipeline_plan(8, layout)
    assert plan["num_stages"] == 4 and plan["placement"] == "loop" and plan["n_microbatches"] == 4
    assert [s["layers"] for s in plan["stages"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [s["pp_rank"] for s in plan["stages"]] == [0, 1, 0, 1]
    assert [(s["embedding"], s["head"]) for s in plan["stages"]] == [(True, False), (False, False),
                                                                    (False, False), (False, True)]  # fmt: skip


def test_pipeline_plan_uneven_explicit():
    layout = replace(BASE.layout, pp=2, pp_stage_layers=[0, 2], grad_accum=2)
    stages = nd_plans.pipeline_plan(2, layout)["stages"]
    assert [s["layers"] for s in stages] == [[], [0, 1]]


# ------------------------------------------------------------------------------------------ checks
def test_tiny_llama_layouts_that_run_on_cpu_pass():
    for fields in (dict(tp=2), dict(pp=2, grad_accum=2), dict(dp_shard=2, zero_stage=3),
                   dict(tp=2, dp_shard=2, zero_stage=2), dict(pp=2, dp_shard=2, zero_stage=3, grad_accum=2),
                   dict(dp_replicate=2, dp_shard=2, zero_stage=3), dict(dp_shard=2, zero_stage=0)):  # fmt: skip
        assert errors_of(with_layout(**fields)) == [], fields


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(tp=8), "tp=8 must divide num_attention_heads=4"),
        (dict(tp=4), "tp=4 must divide num_key_value_heads=2"),
        (dict(ep=2), "engine=nd does not support ep=2"),
        (dict(precision="fp16"), "layout.precision=fp16"),
        (dict(dp_shard=2, zero_stage=1), "does not support zero_stage=1"),
        (dict(dp_shard=2, zero_stage=3, offload_params="cpu"), "offload_params=cpu"),
        (dict(dp_shard=2, zero_stage=2, offload_params="cpu", offload_optimizer="cpu"), "zero_stage=2"),
        (dict(offload_params="cpu", offload_optimizer="cpu", zero_stage=3), "needs a data axis"),
        (dict(cp=2, dp_shard=1, zero_stage=3), "cp=2 on accelerator=cpu: context parallelism does not run on CPU"),
        (dict(pp=2, pp_schedule="GPipe", pp_virtual_stages=2, grad_accum=2), "runs one stage per rank"),
        (dict(pp=2, pp_schedule="1F1B", grad_accum=1), "grad_accum (micro-batches) >= pp=2, got grad_accum=1"),
        (dict(pp=2, pp_schedule="ZBVZeroBubble", grad_accum=4), "runs exactly two stages per rank"),
        (dict(pp=2, pp_schedule="DualPipeV", pp_virtual_stages=2, grad_accum=2),
         "grad_accum (micro-batches) >= pp x 2 = 4, got grad_accum=2"),
        (dict(pp=2, pp_stage_layers=[1, 2], grad_accum=2), "sum to num_hidden_layers=2 (sum 3)"),
        (dict(pp=2, pp_stage_layers=[2], grad_accum=2), "has 1 entries"),
        (dict(pp=4, grad_accum=4), "= 4 must divide num_hidden_layers=2"),
        (dict(pp_virtual_stages=2), "needs pp > 1"),
        # a CPU run of gpu_llama70b_nd_tp8_pp4's stand-in: "Trying to backward an extra time ... under selective
        # activation checkpoint"
        (dict(pp=2, pp_schedule="ZBVZeroBubble", pp_virtual_stages=2, grad_accum=4,
              activation_checkpointing="selective"), "with pp_schedule=ZBVZeroBubble: its split backward"),
    ],
)
def test_refused_layouts_name_field_value_and_rule(fields, message):
    errors = errors_of(with_layout(**fields))
    assert any(message in e for e in errors), errors


def test_middle_stage_needs_a_layer():
    cfg = with_layout(pp=3, pp_stage_layers=[1, 0, 1], grad_accum=3)
    cfg = replace(cfg, model=replace(cfg.model, hf_config={**HF["llama"], "num_hidden_layers": 2}))
    assert any("middle stages need >= 1 layer" in e for e in errors_of(cfg))


def test_world_size_must_match_the_cluster():
    assert any("= 2 must equal cluster.nodes=1 x cluster.accelerators_per_node=4" in e for e in errors_of(with_layout(tp=2, processes=4)))


def test_tied_embeddings_refused_with_tp_or_pp():
    cfg = with_layout(tp=2)
    cfg = replace(cfg, model=replace(cfg.model, hf_config={**HF["llama"], "tie_word_embeddings": True}))
    assert any("tie_word_embeddings=true" in e for e in errors_of(cfg))


def test_sliding_window_shorter_than_the_sequence_is_refused():
    cfg = with_layout(tp=2)
    cfg = replace(cfg, model=replace(cfg.model, hf_config={**HF["mistral"], "sliding_window": 32}))
    assert any("sliding_window=32 < layout.seq_len=64" in e for e in errors_of(cfg))


def test_gpt2_is_not_an_nd_family():
    cfg = compose_run_config(["engine=nd", "layout=single", "model=gpt2"])
    assert any("engine=nd runs" in e for e in errors_of(cfg))


def test_eager_attention_is_refused_since_stages_pass_no_mask():
    cfg = with_layout(pp=2, grad_accum=4)
    cfg = replace(cfg, model=replace(cfg.model, hf_config={**cfg.model.hf_config, "attn_implementation": "eager"}))
    assert any("attn_implementation=eager" in e and "not causal" in e for e in errors_of(cfg))
    assert not any("attn_implementation" in e for e in errors_of(with_layout(pp=2, grad_accum=4)))


def test_sequence_parallel_without_tp_warns():
    cfg = with_layout()
    cfg = replace(cfg, engine=replace(cfg.engine, sequence_parallel=True, loss_parallel=True))
    assert nd_plans.check(cfg)[1] == ["engine.sequence_parallel has no effect with tp=1",
                                      "engine.loss_parallel has no effect with tp=1"]  # fmt: skip


# ------------------------------------------------------------------------------ context parallel
@pytest.mark.gpu_only
def test_context_parallel_is_planned_on_gpu():
    cfg = with_layout(GPU, cp=2, tp=4, dp_shard=1, zero_stage=3, seq_len=8192)
    assert errors_of(cfg) == []
    plan = nd_plans.nd_plan(cfg)
    assert plan["context_parallel"] == {
        "size": 2, "gpu_only": True, "buffers": ["input_ids", "labels", "position_ids"],
        "buffer_seq_dims": [1, 1, 1], "rotate_method": "allgather", "load_balance": True,
    }  # fmt: skip
    # CP ranks hold the same weights: FSDP shards over dp_shard x cp.
    assert plan["data_parallel"]["mesh_dims"] == ["dp_shard_cp"] and plan["data_parallel"]["shard_size"] == 2
    assert plan["data_parallel"]["size"] == 1


@pytest.mark.gpu_only
@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(cp=2, pp=2, dp_shard=1, zero_stage=3, grad_accum=2, seq_len=8192), "without pipeline parallelism"),
        (dict(cp=4, dp_shard=1, zero_stage=3, seq_len=8196), "divisible by 2*cp=8"),
    ],
)
def test_context_parallel_rules(fields, message):
    assert any(message in e for e in errors_of(with_layout(GPU, **fields)))


# ----------------------------------------------------------------------------- the nd_plan.json
def test_plan_of_a_2d_composition():
    cfg = with_layout(tp=2, dp_shard=2, zero_stage=3)
    cfg = replace(cfg, engine=replace(cfg.engine, sequence_parallel=True, loss_parallel=True))
    plan = nd_plans.nd_plan(cfg)
    assert plan["mesh"] == {"dim_names": ["pp", "dp_replicate", "dp_shard", "cp", "tp"], "shape": [1, 1, 2, 1, 2],
                            "world_size": 4, "device_type": "cpu"}  # fmt: skip
    assert plan["tensor_parallel"]["sequence_parallel"] and plan["tensor_parallel"]["loss_parallel"]
    assert plan["pipeline"] is None and plan["context_parallel"] is None
    data = plan["data_parallel"]
    assert (data["wrapper"], data["mesh_dims"], data["reshard_after_forward"]) == ("fully_shard", ["dp_shard"], True)
    assert plan["autocast_bf16"] is False


def test_plan_hsdp_and_replicate_and_bf16():
    hsdp = nd_plans.nd_plan(with_layout(dp_replicate=2, dp_shard=2, zero_stage=2, precision="bf16"))["data_parallel"]
    assert hsdp["mesh_dims"] == ["dp_replicate", "dp_shard"] and hsdp["reshard_after_forward"] is False
    assert hsdp["mixed_precision"] == {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    ddp = nd_plans.nd_plan(with_layout(dp_shard=2, zero_stage=0))["data_parallel"]
    assert ddp["wrapper"] == "replicate" and ddp["shard_size"] == 1 and ddp["replicate_size"] == 2
    tp_bf16 = nd_plans.nd_plan(with_layout(tp=2, precision="bf16"))
    assert tp_bf16["data_parallel"]["wrapper"] is None and tp_bf16["autocast_bf16"] is True


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_keeps_the_gathered_stage_across_micro_batches_under_pipelining(zero):
    # torchtitan's default reshard policy: no reshard after forward with pp > 1 (no per-micro-batch all-gathers)
    piped = nd_plans.nd_plan(with_layout(pp=2, dp_shard=2, zero_stage=zero, grad_accum=4))["data_parallel"]
    assert piped["wrapper"] == "fully_shard" and piped["reshard_after_forward"] is False
    flat = nd_plans.nd_plan(with_layout(dp_shard=2, zero_stage=zero))["data_parallel"]
    assert flat["reshard_after_forward"] is (zero == 3)


def test_invalid_layout_is_not_planned():
    with pytest.raises(ValueError, match="tp=8 must divide num_attention_heads=4"):
        nd_plans.nd_plan(with_layout(tp=8))


# ---------------------------------------------------------------------------------- state bytes
def _all_ranks(layout, hf):
    return [nd_plans.rank_param_numel(hf, layout, r) for r in range(ParallelDims.of(layout).world_size)]


@pytest.mark.parametrize("family", sorted(HF))
def test_one_rank_holds_every_parameter(family):
    spec = model_spec_from_hf("m", HF[family])
    assert _all_ranks(BASE.layout, HF[family]) == [spec.total_params]


@pytest.mark.parametrize("family", sorted(HF))
def test_pipeline_and_fsdp_partition_the_parameters(family):
    total = model_spec_from_hf("m", HF[family]).total_params
    assert sum(_all_ranks(replace(BASE.layout, pp=2, grad_accum=2), HF[family])) == total
    assert sum(_all_ranks(replace(BASE.layout, dp_shard=2, zero_stage=3), HF[family])) == total
    assert sum(_all_ranks(replace(BASE.layout, dp_shard=2, zero_stage=0), HF[family])) == 2 * total


def test_tp_splits_all_but_norms():
    spec = model_spec_from_hf("m", HF["llama"])
    replicated = spec.num_layers * spec.norm_params + spec.final_norm_params
    per_rank = (spec.total_params - replicated) // 2 + replicated
    assert _all_ranks(replace(BASE.layout, tp=2), HF["llama"]) == [per_rank] * 2


def test_fsdp_chunks_like_torch_chunk():
    assert [nd_plans._chunk(10, 4, i) for i in range(4)] == [3, 3, 3, 1]
    assert [nd_plans._chunk(2, 4, i) for i in range(4)] == [1, 1, 0, 0]


def test_predicted_state_bytes_are_fp32_weights_grads_and_two_moments():
    got = nd_plans.predicted_state_bytes(HF["llama"], replace(BASE.layout, tp=2), 0)
    numel = nd_plans.rank_param_numel(HF["llama"], replace(BASE.layout, tp=2), 0)
    assert got == {"param_bytes": 4 * numel, "grad_bytes": 4 * numel, "optimizer_bytes": 8 * numel}


def test_planner_predicts_the_same_bytes():
    """The planner's nd prediction (harness.plan, for the pipeline rank it reports) equals this engine's count
    for the first rank of that pipeline stage (FSDP's first chunk is the largest)."""

    for fields in (dict(tp=2), dict(pp=2, grad_accum=2), dict(pp=2, grad_accum=2, pp_schedule="GPipe"),
                   dict(dp_shard=2, zero_stage=3), dict(tp=2, dp_shard=2, zero_stage=3),
                   dict(pp=2, dp_shard=2, zero_stage=3, grad_accum=2), dict(dp_shard=2, zero_stage=0)):  # fmt: skip
        cfg = with_layout(**fields)
        plan = make_plan(cfg)
        predicted = plan_record(plan)["predicted"]
        per_pp = ParallelDims.of(cfg.layout).world_size // cfg.layout.pp
        numel = nd_plans.rank_param_numel(cfg.model.hf_config, cfg.layout, plan.memory.pp_rank * per_pp)
        assert predicted["param_bytes"] == 4 * numel, fields
        assert predicted["grad_bytes"] == 4 * numel, fields
        assert predicted["optimizer_bytes"] == 8 * numel, fields
