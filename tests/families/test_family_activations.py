"""Saved activations of a tiny model of every supported family, metered with the runtime's saved-tensor hooks
(harness.runtime.meter) on a CPU forward, against the planner's prediction from the same spec.

The prediction is exact (within 0.5 %) where a family runs only what the activation model knows: GQA or
multi-head attention through SDPA (fused, or the CPU's math fallback for dropout and multi-latent head sizes,
a mask and repeated K / V on sliding-window layers), multi-latent attention (projection outputs saved whole where
a norm or V reads a slice; DeepSeek Sparse Attention's indexer under no_grad saves nothing), eager attention with
soft-capping, RMSNorm / LayerNorm (as many per layer as the layer has), hyper-connection residual streams (HY-V4's,
DeepSeek-V4's Sinkhorn-mixed and Qwen4's gated ones, and their final collapse), gated or plain MLPs, grouped-mm
routed experts, shared experts and dense-first layers, and the torch paths of Mamba-1, Mamba-2, Gated DeltaNet,
Kimi delta attention, lightning attention and short convolution mixers. Every other family is held to the
measured / predicted ratio below, with what the model leaves out; "not attributed" means the excess was measured
but not yet traced tensor by tensor."""

from __future__ import annotations

import pytest

from family_helpers import family_names, tiny_fields
from harness.plan.activations import token_activations
from harness.plan.model_spec import model_spec_from_hf

SEQ_LEN = 64  # above the tiny sliding window (32): windowed families build their mask
SUPPORTED = list(family_names())
MIXER_REST = "the mixers are exact; the rest of the layer is not attributed"
PARTIAL_ROTARY = "partial rotary: each layer keeps its own slices of cos / sin"
PARAM_FREE = "parameter-free norms save their input and statistics only, not a normalised copy"
EAGER_MASK = "eager attention with a sliding-window mask: masked scores and the mask are saved"
UNATTRIBUTED = "not attributed"
# family: (lowest, highest measured / predicted ratio, what the activation model leaves out)
KNOWN_GAPS = {
    "afmoe": (1.04, 1.08, "a sigmoid output gate on attention (T x h)"),
    "apertus": (1.24, 1.28, "the xIELU activation saves six f-sized tensors"),
    "axk2": (1.15, 1.19, "a sigmoid output gate on attention (T x h, gate and product), the q_gate projection's "
                         "wider input, the MLP inside each norm module (its input, activation and fc2 input)"),
    "beam": (1.13, 1.17, "attention sinks (a score column per head) and a gated attention output"),
    "cohere": (1.01, 1.05, UNATTRIBUTED),
    "cohere2": (1.01, 1.05, UNATTRIBUTED),
    "cohere_compass_text": (1.01, 1.05, UNATTRIBUTED),
    "cohere2_moe": (0.99, 1.03, UNATTRIBUTED),
    "deepseek_v4": (1.00, 1.04, "eager attention's scores over the sink column and the compressed entries, the "
                                "per-head query norm (q_b_norm), the compressors' pooled windows and the indexer; "
                                "the hyper-connections and the grouped output projection are exact"),
    "dots3_note_text": (0.99, 1.03, "a per-head sigmoid output gate (g_proj): the gate and the ungated attention "
                                    "output"),
    "doge": (1.14, 1.18, "dynamic-mask attention: eager, with a learned mask per head"),
    "ernie4_5": (0.99, 1.03, UNATTRIBUTED),
    "ernie4_5_moe": (0.99, 1.03, UNATTRIBUTED),
    "flint": (0.97, 1.01, UNATTRIBUTED),
    "gemma2": (1.04, 1.08, UNATTRIBUTED),
    "gemma3n_text": (2.12, 2.16, "AltUp's residual streams, Laurel and per-layer inputs: the model counts one stream"),
    "gemma4_text": (1.09, 1.13, "per-layer inputs, KV-sharing layers, the MoE beside the MLP; not attributed"),
    "gemma4_unified_text": (1.03, 1.07, "per-layer inputs, KV-sharing layers; not attributed"),
    "glm": (1.03, 1.07, PARTIAL_ROTARY),
    "glm4": (1.02, 1.06, PARTIAL_ROTARY),
    "glm4_moe": (1.02, 1.06, UNATTRIBUTED),
    "gpt_neox": (1.11, 1.15, UNATTRIBUTED),
    "granite_swa": (1.20, 1.24, EAGER_MASK),
    "granitemoe_swa": (1.13, 1.17, EAGER_MASK),
    "helium": (0.99, 1.03, UNATTRIBUTED),
    "hrm_text": (1.00, 1.04, "attention's sigmoid output gate, each stack run's parameter-free final norm; its "
                             "parameter-free layer norms save no normalised copy"),
    "hy_v4": (1.05, 1.09, "attention sinks (a score column per head, the top-k indices), a sigmoid output gate "
                          "(its output and the ungated attention output), the experts' clamped SwiGLU saving the "
                          "fused gate_up whole; the hyper-connections are exact"),
    "inkling_text": (1.77, 1.81, "the relative-position bias per head and the short convolutions"),
    "inkling2_text": (2.34, 2.38, "as inkling_text, and the block attention residuals' stacked, normed block "
                                  "states (fp32) and the dynamic convolutions' windows and taps"),
    "laguna": (1.06, 1.10, "per-head attention gates"),
    "llama4": (1.47, 1.51, "as llama4_text: the composite config plans as its text decoder"),
    "llama4_text": (1.47, 1.51, "transformers' Llama 4 MoE runs every expert for every token (scores 0 off the "
                                "top k)"),
    "longcat_flash": (1.18, 1.22, "two attentions, two MLPs and a shortcut MoE a layer: the model counts one "
                                  "attention core and one MLP (the latents of both attentions)"),
    "minimax": (1.01, 1.05, "its attention layers get a mask of the config's sliding_window, which layer_types "
                            "hide from the spec: the mask and K / V repeated to every head (lightning attention "
                            "is exact)"),
    "minimax_m2": (1.01, 1.05, UNATTRIBUTED),
    "minimax_m3_vl_text": (1.67, 1.71, "the shared experts' fused gate_up saves five 2f-wide tensors"),
    "nanochat": (1.08, 1.12, PARAM_FREE),
    "nemotron": (1.05, 1.09, UNATTRIBUTED),
    "nemotron_h": (0.98, 1.01, "no rotary embedding: the model counts each stage's cos / sin (the mixers are "
                                "exact)"),
    "olmo": (0.85, 0.89, PARAM_FREE),
    "phi": (0.97, 1.01, UNATTRIBUTED),
    "phi3": (1.03, 1.07, "fused qkv / gate_up outputs saved before the split"),
    "phi4_multimodal": (1.03, 1.07, "as phi3 (its text decoder's layers); the idle encoders save nothing"),
    "qwen2_moe": (1.02, 1.06, UNATTRIBUTED),
    "qwen4_exp_text": (1.01, 1.05, "the QSA indexer's norms and block scores (with gradient), attention's "
                                   "sigmoid output gate and q_norm reading q_proj's [q | gate] output whole; the "
                                   "hyper-connections and the Gated DeltaNet mixer are exact"),
    "qwen3_5_moe_text": (1.00, 1.03, MIXER_REST),
    "qwen3_next": (1.00, 1.03, MIXER_REST),
    "seed_oss": (1.04, 1.08, UNATTRIBUTED),
    "vaultgemma": (1.05, 1.09, UNATTRIBUTED),
}
EXACT = [name for name in SUPPORTED if name not in KNOWN_GAPS]


def measured_and_predicted(model_type, precision="fp32"):
    import torch
    from transformers import AutoModelForCausalLM

    from harness.config.model_shape import hf_config_object
    from harness.runtime.meter import SavedActivationMeter

    fields = tiny_fields(model_type)
    spec = model_spec_from_hf(model_type, fields)
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    model = AutoModelForCausalLM.from_config(hf_config_object(fields), dtype=dtype).train()
    ids = torch.randint(3, spec.vocab_size, (1, SEQ_LEN))
    meter = SavedActivationMeter(model.parameters())
    with meter.recording():
        model(input_ids=ids, labels=ids, use_cache=False)
    tok = token_activations(spec, "hf", precision, True, 1, False, False, "none", SEQ_LEN, 1)
    out = tok.outside
    predicted = (SEQ_LEN * (spec.saved_layer_runs * tok.layer + out.first_per_token + out.last_per_token)
                 + out.per_stage + out.last_constant)
    return meter.peak_bytes, predicted


def test_most_families_are_exact():
    assert len(EXACT) >= 51 and {"llama", "gemma3_text", "mixtral", "hunyuan_v1_moe", "dots1"} <= set(EXACT)
    assert set(KNOWN_GAPS) <= set(SUPPORTED)


@pytest.mark.parametrize("model_type", EXACT)
def test_activations_equal_the_meter(model_type):
    measured, predicted = measured_and_predicted(model_type)
    assert measured == pytest.approx(predicted, rel=0.005)


@pytest.mark.parametrize("model_type", sorted(KNOWN_GAPS))
def test_known_activation_gaps_stay_as_named(model_type):
    low, high, _reason = KNOWN_GAPS[model_type]
    measured, predicted = measured_and_predicted(model_type)
    assert low <= measured / predicted <= high


# In 16 bits the fp32 upcasts are copies: multi-latent attention's norms copy the latent slice and math SDPA the
# values alone, hyper-connections keep fp32 streams beside the streams in the dtype and an fp32 copy of fn.
# DeepSeek-V4 (measured / predicted, what the model leaves out): its hyper-connections and grouped output projection
# are exact; the fp32 residual (sink column and compressed entries, q_b_norm, compressors) is offset by eager
# attention with sinks keeping its softmax in bf16 where the model counts an fp32 softmax and its cast copy.
KNOWN_BF16 = {"deepseek_v4": (0.98, 1.02)}


@pytest.mark.parametrize("model_type", ["minicpm3", "deepseek_v4"])
def test_bf16_latents_and_hyper_connections(model_type):
    measured, predicted = measured_and_predicted(model_type, "bf16")
    low, high = KNOWN_BF16.get(model_type, (0.995, 1.005))
    assert low <= measured / predicted <= high
