"""How the training regime (torch.compile, FP8) changes the time model's per-layer work: one rule per effect."""

from __future__ import annotations

from typing import Dict

from harness.plan.model_spec import ModelSpec

# Kernels of one decoder layer's memory-bound work when its block is compiled (engine.compile). Inductor fuses
# producer/consumer chains of pointwise ops (vertical) and sibling ops on the same input (horizontal), and a
# reduction with its pointwise prologue and epilogue (Ansel et al., "PyTorch 2", ASPLOS 2024, section 5; PyTorch
# blog "Improving LayerNorm/RMSNorm performance with torch.compile", 2025: one kernel per norm). GEMMs stay
# library calls with no fused epilogue by default, so only the elementwise part moves. Forward: residual add +
# RMSNorm twice, rotary on q and k, SwiGLU: four kernels (eager: 30, compute_time.LAYER_ELEMENTWISE_OPS); the
# backward about two per forward one, as eager's.
COMPILED_LAYER_ELEMENTWISE_OPS: Dict[str, int] = {"forward": 4, "backward": 8}


def compiled_layer_elementwise_bytes(spec: ModelSpec, tokens: float, tp: int, dtype_bytes: int) -> float:
    """Bytes one compiled layer's fused forward kernels read and write for `tokens` tokens on a TP rank.

    Each fused kernel reads its inputs and writes its outputs once; the intermediates (the fp32 upcast of
    RMSNorm, silu(gate), rotary's rotated halves) stay in registers. Residual add + RMSNorm: read the residual
    stream and the branch output, write the new stream and its normed copy (4e·h, against eager's
    (3e + 32)·h norm plus 3e·h add). Rotary: read and write q and k once (2e per element, eager 8e). SwiGLU:
    read gate and up, write their product (3e·f, eager 5e·f); a two-matrix MLP's activation reads and writes f.
    """
    e, h = dtype_bytes, spec.hidden_size
    _, _, q, kv = spec.mean_attention()
    q, kv, f = q / tp, kv / tp, spec.ffn_size / tp
    norms = 2 * 4 * e * h
    rotary = 2 * e * (q + kv) if not spec.learned_positions else 0
    act = (3 if spec.gated_mlp else 2) * e * f * (spec.experts_per_token if spec.is_moe else 1)
    return tokens * (norms + rotary + act)
