"""Saved activations of tiny models of several families, metered with the runtime's saved-tensor hooks
(harness.runtime.meter) on a CPU forward, against the planner's per-layer prediction from the same spec.

Where the prediction is exact the family runs only the kernels the activation model knows (GQA attention
through SDPA without a mask, RMSNorm, gated MLP, grouped-mm experts). The other families save tensors
the model has no term for; each is named below with the measured / predicted ratio it is held to. The
sliding-window mask is measured (8·T² bytes per windowed layer: mistral's excess is exactly that); the
other causes are read from the families' modeling code, not yet attributed tensor by tensor."""

from __future__ import annotations

import pytest

from family_helpers import tiny_fields
from harness.plan.activations import token_activations
from harness.plan.model_spec import model_spec_from_hf

SEQ_LEN = 64  # above the tiny sliding window (32): windowed families build their mask
EXACT = ("llama", "qwen3", "qwen3_moe", "gemma", "granite", "olmo2")
# family: (lowest, highest measured / predicted ratio, what the activation model leaves out)
KNOWN_GAPS = {
    "mistral": (1.08, 1.13, "SDPA with a sliding-window mask keeps a T x T mask per layer"),
    "mixtral": (1.04, 1.09, "SDPA with a sliding-window mask keeps a T x T mask per layer"),
    "phi3": (1.13, 1.18, "fused qkv / gate_up outputs saved before the split; sliding-window mask"),
    "starcoder2": (1.12, 1.17, "sliding-window mask; biased LayerNorm and GELU MLP saves"),
    "gemma2": (1.39, 1.45, "eager soft-capped scores (tanh saves T x T tensors); four norms per layer"),
    "gemma3_text": (1.25, 1.30, "four norms per layer; sliding-window mask on local layers"),
    "glm4": (1.24, 1.29, "four norms per layer; partial rotary"),
    "deepseek_v3": (1.46, 1.51, "multi-latent attention: latent q / kv projections and their norms"),
    "cohere": (0.90, 0.94, "one shared norm for parallel attention and MLP"),
}


def measured_and_predicted(model_type):
    import torch
    from transformers import AutoModelForCausalLM

    from harness.config.model_shape import hf_config_object
    from harness.runtime.meter import SavedActivationMeter

    fields = tiny_fields(model_type)
    spec = model_spec_from_hf(model_type, fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config_object(fields), dtype=torch.float32).train()
    ids = torch.randint(3, spec.vocab_size, (1, SEQ_LEN))
    meter = SavedActivationMeter(model.parameters())
    with meter.recording():
        model(input_ids=ids, labels=ids, use_cache=False)
    tok = token_activations(spec, "hf", "fp32", True, 1, False, False, "none", SEQ_LEN, 1)
    out = tok.outside
    predicted = (SEQ_LEN * (spec.num_layers * tok.layer + out.first_per_token + out.last_per_token)
                 + out.per_stage + out.last_constant)
    return meter.peak_bytes, predicted


@pytest.mark.parametrize("model_type", EXACT)
def test_activations_equal_the_meter(model_type):
    measured, predicted = measured_and_predicted(model_type)
    assert measured == pytest.approx(predicted, rel=0.005)


@pytest.mark.parametrize("model_type", sorted(KNOWN_GAPS))
def test_known_activation_gaps_stay_as_named(model_type):
    low, high, _reason = KNOWN_GAPS[model_type]
    measured, predicted = measured_and_predicted(model_type)
    assert low <= measured / predicted <= high
