"""Every decoder-only transformers family with a tensor-parallel plan, as a tiny config: the spec's
parameter counts are the model's, its FLOPs are the model's own matmuls, and the planner accepts it."""

from __future__ import annotations

import pytest

from family_helpers import (REFUSED, TINY_CONFIG_REJECTED, family_meta_model, family_names, flop_fields,
                            measured_flops, tiny_fields)
from harness.plan.flops import FlopConvention, flops_per_token
from harness.plan.model_spec import FORWARD_ONLY, model_spec_from_hf
from harness.plan.planner import make_plan
from plan_helpers import hf_counts, run_config

FAMILIES = family_names()
SUPPORTED = [name for name in FAMILIES if name not in REFUSED and name not in TINY_CONFIG_REJECTED]
SEQ_LEN = 16  # below every tiny sliding window: eager attention scores all T x T pairs, as "full" counts


def test_the_family_list_is_transformers_own():
    assert len(FAMILIES) > 60 and {"llama", "gemma2", "deepseek_v3", "phi3", "olmo2", "qwen3_moe"} <= set(FAMILIES)


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_counts_equal_the_meta_model(model_type):
    fields = tiny_fields(model_type)
    spec = model_spec_from_hf(model_type, fields)
    counts = hf_counts(family_meta_model(model_type), spec.experts_per_token, spec.num_experts, spec.zero_experts)
    assert (spec.total_params, spec.embedding_params, spec.active_params) == (
        counts["total"], counts["embedding"], counts["active"])


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_flops_equal_the_model_matmuls(model_type):
    """Model FLOPs (full attention convention, lm_head included) against torch's count of one forward +
    backward. The spec counts norm weights and biases as 6N does (6 FLOPs per weight and token; 2 in a
    forward-only module) where torch counts only matmuls: those vectors are taken out of the prediction."""
    spec = model_spec_from_hf(model_type, flop_fields(model_type))
    vectors = sum((2 if FORWARD_ONLY.search(name) else 6) * p.numel()
                  for name, p in family_meta_model(model_type).named_parameters() if p.dim() == 1)
    predicted = (flops_per_token(spec, SEQ_LEN, FlopConvention(attention="full")) - vectors) * SEQ_LEN
    assert measured_flops(model_type, SEQ_LEN) == pytest.approx(predicted, rel=0.002)


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_the_plan_composes(model_type):
    plan = make_plan(run_config(model_type, hf_config=tiny_fields(model_type), zero_stage=3))
    assert plan.valid, plan.errors
    assert plan.memory.total_bytes > 0 and plan.flops_per_token > 0


@pytest.mark.parametrize("model_type", sorted({**REFUSED, **TINY_CONFIG_REJECTED}))
def test_refused_families_name_the_reason(model_type):
    reason = {**REFUSED, **TINY_CONFIG_REJECTED}[model_type]
    with pytest.raises(ValueError, match=reason):
        model_spec_from_hf(model_type, tiny_fields(model_type))
