"""Every decoder-only transformers family with a tensor-parallel plan, as a tiny config: the spec's
parameter counts are the model's, its FLOPs are the model's own matmuls, and the planner accepts it."""

from __future__ import annotations

import pytest

from family_helpers import (VARIANTS, case_fields, family_meta_model, family_names, flop_fields, idle_parameters,
                            measured_flops)
from harness.plan.flops import FlopConvention, flops_per_token
from harness.plan.model_spec import BLOCK_RESIDUAL_QUERY, FORWARD_ONLY, model_spec_from_hf
from harness.plan.planner import make_plan
from plan_helpers import hf_counts, run_config

FAMILIES = family_names()
CASES = list(FAMILIES) + sorted(VARIANTS)  # every accepted family's tiny config, and the VARIANTS configs
SEQ_LEN = 16  # below every tiny sliding window: eager attention scores all T x T pairs, as "full" counts


def test_the_family_list_is_transformers_own():
    assert len(FAMILIES) > 60 and {"llama", "gemma2", "deepseek_v3", "phi3", "olmo2", "qwen3_moe"} <= set(FAMILIES)


@pytest.mark.parametrize("model_type", CASES)
def test_counts_equal_the_meta_model(model_type):
    fields = case_fields(model_type)
    spec = model_spec_from_hf(model_type, fields)
    idle = idle_parameters(model_type)  # what a text forward never runs touches no token
    counts = hf_counts(family_meta_model(model_type), spec.experts_per_token, spec.num_experts, spec.zero_experts,
                       idle)
    assert (spec.total_params, spec.embedding_params, spec.active_params, spec.idle_params) == (
        counts["total"], counts["embedding"], counts["active"], sum(idle.values()))


@pytest.mark.parametrize("model_type", CASES)
def test_flops_equal_the_model_matmuls(model_type):
    """Model FLOPs (full attention convention, lm_head included) against torch's count of one forward +
    backward. The spec counts norm weights and biases as 6N does (6 FLOPs per weight and token; 2 in a
    forward-only module) where torch counts only matmuls: those vectors are taken out of the prediction (1-D, a
    decay-rate vector with singleton dims: Kimi delta attention's A_log, (1, 1, H, 1), or Inkling 2's L2 clips'
    per-head scales, (heads, dim)). Inkling 2's block attention residual queries, (h,) or (q, h), are not among
    them: the spec counts them in the residuals' QK^T, not as weights."""
    spec = model_spec_from_hf(model_type, flop_fields(model_type))
    idle = idle_parameters(model_type)
    vectors = sum((2 if FORWARD_ONLY.search(name) else 6) * p.numel()
                  for name, p in family_meta_model(model_type).named_parameters()
                  if (p.dim() == 1 or (name.endswith("A_log") and p.numel() == max(p.shape))
                      or name.endswith("_l2_clip.scale"))
                  and not BLOCK_RESIDUAL_QUERY.search(name) and name not in idle)
    predicted = (flops_per_token(spec, SEQ_LEN, FlopConvention(attention="full")) - vectors) * SEQ_LEN
    assert measured_flops(model_type, SEQ_LEN) == pytest.approx(predicted, rel=0.002)


@pytest.mark.parametrize("model_type", CASES)
def test_the_plan_composes(model_type):
    plan = make_plan(run_config(model_type, hf_config=case_fields(model_type), zero_stage=3))
    assert plan.valid, plan.errors
    assert plan.memory.total_bytes > 0 and plan.flops_per_token > 0


@pytest.mark.parametrize("model_type", ["hy_v4", "qwen4_exp_text", "deepseek_v4_sliding"])
def test_hyper_connection_collapse_is_on_the_last_stage(model_type):
    """The streams' final collapse (hc_head, hyper_connection_mixer) sits on the last pipeline stage beside the
    final norm and head; tensor parallelism replicates it unless the family's plan splits it (Qwen4's
    hyper_connection_mixer.input_mix_weight_down: rowwise, its input features)."""
    from harness.plan.states import rank_params

    spec = model_spec_from_hf(model_type, case_fields(model_type))
    collapse = {name: p for name, p in family_meta_model(model_type).named_parameters()
                if ".hc_head." in name or ".hyper_connection_mixer." in name}
    assert collapse and spec.hyper_connection_params == sum(p.numel() for p in collapse.values())
    last = list(range(spec.num_layers))[1:]
    first_stage = rank_params(spec, 1, 1, (0,), True, False, 2, (True, True))
    last_stage = rank_params(spec, 1, 1, tuple(last), False, True, 2, (True, True))
    layers = [sum(spec.layer_total_params[i] for i in ids) for ids in ((0,), last)]
    assert first_stage.dense_total + first_stage.expert_total == layers[0] + spec.embedding_params
    assert last_stage.dense_total + last_stage.expert_total == (layers[1] + spec.final_norm_params
                                                                + spec.lm_head_params + spec.hyper_connection_params)
    whole = rank_params(spec, 1, 1, tuple(range(spec.num_layers)), True, True, 1, (True, True))
    split = rank_params(spec, 2, 1, tuple(range(spec.num_layers)), True, True, 1, (True, True))
    halved = sum(p.numel() // 2 for name, p in collapse.items()
                 if "hyper_connection_mixer.input_mix_weight_down" in name)  # Qwen4's plan: rowwise
    whole_tail = [n for n, _, _ in whole.dense[-len(spec.last_tensors):]]
    split_tail = [n for n, _, _ in split.dense[-len(spec.last_tensors):]]
    head = spec.lm_head_params
    assert sum(whole_tail) - sum(split_tail) == head - head // 2 + halved


def test_deepseek_v4_compressed_layers():
    """DeepSeek-V4's default layer_types (HCA, HCA, HCA, CSA at 4 layers): each layer's compression rate is read
    from its compressor's position bias, the CSA layer's indexer runs forward only and caps its entries at
    index_topk, and the position biases (the compressor's, the indexer's) are apart from the projections."""
    spec = model_spec_from_hf("deepseek_v4", case_fields("deepseek_v4"))
    model = family_meta_model("deepseek_v4")
    assert model.config.layer_types == ["heavily_compressed_attention"] * 3 + ["compressed_sparse_attention"]
    assert spec.attention_compression == (8, 8, 8, 4) and spec.attention_indexed == (False, False, False, True)
    assert spec.compressed_topk == 8 and spec.indexer_layers == 1 and spec.attention_windows == (32,) * 4
    for layer, (projections, trained, forward_only) in zip(model.model.layers, spec.layer_compressors, strict=True):
        compressor = layer.self_attn.compressor
        assert projections == compressor.kv_proj.weight.numel() + compressor.gate_proj.weight.numel()
        assert trained == compressor.position_bias.numel()
        indexer = getattr(compressor, "indexer", None)
        assert forward_only == (indexer.position_bias.numel() if indexer is not None else 0)


def test_per_layer_embedding_tables_are_refused():
    """Qwen4's per-layer n-gram embeddings (ple_layer_ids) are lookups inside the decoder layers, not weights."""
    with pytest.raises(ValueError, match=r"layer 0 holds an embedding table \(ple\.ple_embedding\.ngram_embedding\)"):
        model_spec_from_hf("qwen4_exp_text", {**case_fields("qwen4_exp_text"), "ple_layer_ids": [1],
                                              "ple_embed_dim": 32, "ngram_vocab_size_base": 512})


@pytest.mark.parametrize("case, runs", [("hrm_text", ((3, 3), (3, 3), (2, 0), (2, 0))),
                                        ("hrm_text_cycles", ((3, 3), (3, 3), (3, 0), (3, 0)))])
def test_hrm_stacks_are_held_once_and_run_by_their_cycles(case, runs):
    """HRM's L and H stacks are four distinct layers (num_hidden_layers counts their 16 or 18 runs), each with its
    runs with gradient and under no_grad (L_bp_cycles); z_L_init, its frozen initial state, gets no gradient. A
    pipeline stage cannot hold a stack the model's loop runs again: pp > 1 is refused before launch."""
    spec = model_spec_from_hf(case, case_fields(case))
    model = family_meta_model(case)
    assert model.config.num_hidden_layers == sum(grad + no_grad for grad, no_grad in runs)
    assert spec.num_layers == 4 and spec.layer_runs == runs
    assert spec.saved_layer_runs == sum(grad for grad, _ in runs)
    assert [t.trained for t in spec.last_tensors] == [False, True]  # z_L_init, the untied lm_head
    refused = make_plan(run_config(case, hf_config=case_fields(case), dp_shard=1, pp=2, grad_accum=2))
    assert any("weight-shared layers" in error and "pp=2" in error for error in refused.errors), refused.errors
    checkpointed = make_plan(run_config(case, hf_config=case_fields(case), activation_checkpointing="full"))
    assert checkpointed.valid, checkpointed.errors


def test_inkling2_block_residual_entries():
    """Inkling 2 at blocks of 2 layers (boundaries at layers 0 and 2): each layer's attention_input (none at layer
    0; 3 queries in the full layers) and mlp_input attend over the stacked block states and the partial one, more at
    each boundary; final_input over all of them. The dynamic convolutions' C·K are their static taps'."""
    spec = model_spec_from_hf("inkling2_text", case_fields("inkling2_text"))
    assert spec.layer_block_residuals == (((1, 2),), ((3, 2), (1, 2)), ((1, 2), (1, 3)), ((3, 3), (1, 3)))
    assert spec.final_block_residual == (1, 3)
    model = family_meta_model("inkling2_text")
    assert spec.layer_dynamic_convs == tuple(
        sum(p.numel() for name, p in layer.named_parameters() if name.endswith("static_weight"))
        for layer in model.model.layers)
