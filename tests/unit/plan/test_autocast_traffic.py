"""bf16 autocast over fp32 weights (nd with one data rank): the memory-bound traffic of transformers' Llama layer
counted again here, on CPU, in the transformers installed, against the constants the time model takes
(harness.plan.regime: AUTOCAST_LAYER_TRAFFIC, AUTOCAST_LAYER_ELEMENTWISE_OPS, AUTOCAST_WEIGHT_CAST_BYTES).

Counting: a TorchDispatchMode sums the bytes every op other than a GEMM, the attention call or a view reads and
writes (its tensor arguments and outputs) over one forward and one backward, with the gradients cleared before
(the first micro-batch of a step: nothing to accumulate into). Layers 2 and 4, tokens 256 and 512, separate what
grows with the tokens (activations) from what grows with the layers alone (the weights' casts)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.config.schema import LayoutConfig
from harness.plan.compute_time import LAYER_ELEMENTWISE_OPS, layer_elementwise_bytes
from harness.plan.model_spec import model_spec_from_hf
from harness.plan.regime import (AUTOCAST_LAYER_ELEMENTWISE_OPS, AUTOCAST_LAYER_TRAFFIC, AUTOCAST_WEIGHT_CAST_BYTES,
                                 autocast_over_fp32_weights)

# the 1B Llama's ratios (ffn 4 x hidden, 64-wide heads, a quarter as many kv heads) at a size that counts fast
HF = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=1024, num_attention_heads=4,
          num_key_value_heads=1, tie_word_embeddings=True)
# GEMMs, the attention call, ops that allocate without touching memory, and _unsafe_view (a reshape's view whose
# schema does not say so: func.is_view is False)
NOT_ELEMENTWISE = {"mm", "addmm", "bmm", "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                   "_scaled_dot_product_flash_attention_for_cpu_backward", "detach", "empty", "empty_like",
                   "lift_fresh", "_unsafe_view"}


def _bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


class Traffic(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes, self.ops = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view and func.overloadpacket.__name__ not in NOT_ELEMENTWISE:
            self.bytes += _bytes(list(args)) + _bytes(list((kwargs or {}).values())) + _bytes(out)
            self.ops += 1
        return out


def traffic(layers: int, tokens: int, fp32_weights: bool):
    """((forward bytes, ops), (backward bytes, ops)) of one micro-batch of the layer stack, as nd runs it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.engines.lm_loss import causal_lm_loss, shifted_labels
    from harness.engines.stage_module import StageModule

    torch.manual_seed(0)
    config = {k: v for k, v in HF.items() if k != "model_type"}
    model = LlamaForCausalLM(LlamaConfig(**config, num_hidden_layers=layers, attn_implementation="sdpa"))
    if not fp32_weights:
        model = model.to(torch.bfloat16)
    stage = StageModule(model, list(range(layers)), embedding=True, head=True)
    ids = torch.randint(0, HF["vocab_size"], (1, tokens))

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return causal_lm_loss(stage(ids), shifted_labels(ids))

    forward().backward()  # warm: lazy initialisation stays out of the count
    stage.zero_grad(set_to_none=True)
    with Traffic() as f:
        loss = forward()
    with Traffic() as b:
        loss.backward()
    return (f.bytes, f.ops), (b.bytes, b.ops)


@pytest.fixture(scope="module")
def per_layer():
    """{fp32_weights: {direction: (bytes per token, bytes per layer weight, ops)}} of one layer."""
    out = {}
    weights = (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 1024)  # q, o, k, v, gate, up, down
    for fp32 in (False, True):
        counts = {(layers, tokens): traffic(layers, tokens, fp32) for layers in (2, 4) for tokens in (256, 512)}
        out[fp32] = {}
        for i, direction in enumerate(("forward", "backward")):
            layer = {t: (counts[(4, t)][i][0] - counts[(2, t)][i][0]) / 2 for t in (256, 512)}
            per_token = (layer[512] - layer[256]) / 256
            fixed = (layer[256] - 256 * per_token) / weights
            ops = (counts[(4, 256)][i][1] - counts[(2, 256)][i][1]) / 2
            out[fp32][direction] = (per_token, fixed, ops)
    return out


def _formula_per_token() -> float:
    """layer_elementwise_bytes for the counted shape at bf16, per token: the unit the traffic ratios are in."""
    spec = model_spec_from_hf("counted", HF | {"num_hidden_layers": 2})
    return layer_elementwise_bytes(spec, 1.0, 1, 2)


def test_a_bf16_weight_layer_forward_moves_what_the_formula_says_within_5_percent(per_layer):
    per_token, fixed, ops = per_layer[False]["forward"]
    print(f"\n  bf16 weights: forward {per_token:.0f} B a token (formula {_formula_per_token():.0f}), {ops:.0f} ops; "
          f"backward {per_layer[False]['backward'][0]:.0f} B a token, {per_layer[False]['backward'][2]:.0f} ops")
    assert per_token == pytest.approx(_formula_per_token(), rel=0.05)
    assert fixed == pytest.approx(0.0, abs=0.1)
    assert ops == LAYER_ELEMENTWISE_OPS["forward"]


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_autocast_over_fp32_weights_moves_the_counted_traffic_within_3_percent(per_layer, direction):
    """The fp32 residual stream, rotary against fp32 cos / sin, each linear's input cast (per token), and each
    weight's cast to bf16 forward and its gradient's back to fp32 (per weight)."""
    per_token, fixed, ops = per_layer[True][direction]
    ratio = per_token / _formula_per_token()
    print(f"\n  fp32 weights under autocast, {direction}: {per_token:.0f} B a token = {ratio:.3f} x the bf16 forward "
          f"formula; {fixed:.2f} B a weight; {ops:.0f} ops")
    assert ratio == pytest.approx(AUTOCAST_LAYER_TRAFFIC[direction], rel=0.03)
    assert fixed == pytest.approx(AUTOCAST_WEIGHT_CAST_BYTES, rel=0.03)
    assert ops == pytest.approx(AUTOCAST_LAYER_ELEMENTWISE_OPS[direction], abs=2)


@pytest.mark.parametrize("engine,dp,precision,expected", [
    ("nd", 1, "bf16", True), ("nd", 1, "fp8", True), ("nd", 2, "bf16", False), ("nd", 1, "fp32", False),
    ("fsdp", 1, "bf16", False), ("deepspeed", 1, "bf16", False), ("megatron_lm", 1, "bf16", False)])
def test_only_nd_without_a_data_parallel_wrapper_computes_under_autocast_over_fp32_weights(engine, dp, precision,
                                                                                          expected):
    layout = LayoutConfig(dp_shard=dp, tp=2, precision=precision)
    assert autocast_over_fp32_weights(engine, layout) is expected
