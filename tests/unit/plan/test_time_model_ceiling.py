"""No layer runs faster than the hardware can: the FLOPs a layer's forward is credited with (the FLOP counter's
weights and attention core, harness.plan.flops) over its predicted time stay under the achievable matmul rate.
Multi-latent attention once ran its 192-wide queries and keys at the heads' 64-wide rotary dim: 133% of the A100
peak in its attention core."""

from __future__ import annotations

import pytest

from harness.plan.compute_time import layer_time
from harness.plan.flops import FlopConvention, attention_flops_per_layer
from harness.plan.hardware import HARDWARE, achievable_peak
from harness.plan.planner import spec_for
from harness.config.compose import compose_run_config

MODELS = ["llama3_1_8b", "deepseek_v3", "mixtral_8x7b", "qwen3_235b_a22b", "gpt2", "gemma3_27b"]


@pytest.mark.parametrize("accelerator", ["h100_sxm", "a100_sxm"])
@pytest.mark.parametrize("model", MODELS)
def test_a_layers_forward_stays_under_the_achievable_matmul_rate(model, accelerator):
    spec = spec_for(compose_run_config([f"model={model}"]).model)
    hw, seq = HARDWARE[accelerator], 16384
    peak = achievable_peak(hw, accelerator, "bf16")
    attention = sum(attention_flops_per_layer(spec, seq, FlopConvention("causal", False))) / spec.num_layers
    credited = (2 * spec.active_layer_params + attention) * seq  # one sequence through one layer
    seconds = layer_time(spec, seq, seq, 1, 2, hw, peak, backward=False).total
    assert credited / seconds <= peak
    # the attention core alone: at most the fused kernel's rate
    core = layer_time(spec, seq, seq, 1, 2, hw, peak, backward=False).attention
    assert attention * seq / core <= peak / hw.matmul_efficiency * hw.attention_efficiency_sdpa * 1.001


def test_multi_latent_attention_runs_its_own_matrices_and_product_widths():
    spec = spec_for(compose_run_config(["model=deepseek_v3"]).model)
    # q_a, q_b, kv_a, kv_b and o: (in, out), none split by transformers' plan for DeepSeek-V3
    assert spec.attention_matrices == ((7168, 1536, None), (1536, 24576, None), (7168, 576, None),
                                       (512, 32768, None), (16384, 7168, None))
    assert spec.attention_dims() == (128, 128, 128 * 192, 128 * 128)


def test_tensor_parallelism_splits_heads_not_the_kernels_head_dim():
    # Llama-3.2-1B's 64-wide heads run at the head dim 64 rate however many TP ranks share them: two ranks take
    # half the heads each, in half the time (it was timed at the 128 rate once tp = 2 doubled the width per head)
    from harness.plan.compute_time import attention_time

    spec = spec_for(compose_run_config(["model=llama3_2_1b"]).model)
    hw = HARDWARE["h100_sxm"]
    peak = achievable_peak(hw, "h100_sxm", "bf16")
    one, two = (attention_time(spec, 8192, 8192, tp, 2, hw, peak, backward=False) - hw.op_latency_s
                for tp in (1, 2))
    assert two == pytest.approx(one / 2, rel=1e-6)
