"""Bytes of activations saved for backward, after Korthikanti et al. 2022, for HF and Megatron kernels."""

from __future__ import annotations

from typing import NamedTuple

from harness.plan.model_spec import ModelSpec

# "hf": transformers' modules as they run under deepspeed / fsdp / nd (RMSNorm upcasts to fp32, eager
# softmax in fp32, the loss upcasts logits); "megatron": Megatron-LM's fused kernels, the setting of
# Korthikanti et al. 2022 (norms save their input only, softmax in the compute dtype).
PROFILES = ("hf", "megatron")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")  # two stages per rank, placed 0 and 2p-1 on rank 0


class LayerActivations(NamedTuple):
    """Bytes one decoder layer saves per token (one micro-batch), split by how TP/SP divide them."""

    boundary: float  # at the layer's ends (norms, linear inputs, residual dropout masks): TP replicates,
    # sequence parallelism divides by tp
    sharded: float  # inside attention and MLP (heads, ffn columns): divided by tp
    quadratic: float  # per token *and* per key (softmax and its dropout): x seq_len, divided by tp
    checkpoint: float  # what full recomputation keeps: the layer input


def layer_activations(spec: ModelSpec, profile: str, dtype_bytes: int, mask_bytes: int) -> LayerActivations:
    """Saved bytes of one layer per token, term by term (Korthikanti et al. 2022, sec. 4.1).

    Korthikanti's GPT layer in 16-bit with dropout: attention 11·s·b·h + 5·a·s²·b (QKV input 2, Q and K
    4, V 2, softmax 2·a·s, its dropout mask a·s and output 2·a·s, projection input 2, dropout mask 1),
    MLP 19·s·b·h (input 2, GeLU input 8, fc2 input 8, mask 1), two LayerNorm inputs 4·s·b·h: in total
    s·b·h·(34 + 5·a·s/h). Written here per token with e = dtype bytes, m = dropout-mask bytes (1 on
    CUDA, e on CPU), q = a·d, kv = kv_heads·d, f = ffn, so that GQA, SwiGLU and MoE follow.
    """
    e, m, h, a = dtype_bytes, mask_bytes, spec.hidden_size, spec.num_heads
    q, kv, f = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.ffn_size
    hf = profile == "hf"
    if hf and spec.norm_kind == "rmsnorm":
        norm = (4 + e) * h + 4  # transformers' RMSNorm: fp32 input, fp32 rsqrt, normalised copy
    elif hf:
        norm = e * h + 8  # torch.layer_norm: input, fp32 mean and rstd
    else:
        norm = e * h  # fused LayerNorm/RMSNorm kernel: input only
    boundary = 2 * norm + 2 * e * h + (2 * m * h if spec.hidden_dropout else 0)

    attn_dropout = (m + e) * a if spec.attention_dropout else 0
    if spec.attn_implementation == "eager":
        kv_saved = 2 * q if hf else 2 * kv  # transformers' eager path repeats k/v to all heads
        if hf and spec.model_type != "gpt2":
            # softmax in fp32; the matmul saves the cast copy, or dropout's mask and output
            quadratic = 4 * a + (attn_dropout or (e * a if e < 4 else 0))
        else:
            quadratic = e * a + attn_dropout
        attention = e * (q + kv_saved) + e * q  # Q, K, V for the two matmuls; projection input
    else:
        # flash / SDPA kernels keep Q, K, V, the output and an fp32 log-sum-exp per head: no s^2 term
        quadratic = 0
        attention = e * (q + 2 * kv) + 4 * a + e * q
    if spec.qk_norm:  # per-head RMSNorm on q and k (qwen3): fp32 inputs, rsqrt per head, normalised copies
        attention += (4 + e) * (q + kv) + 4 * (a + spec.num_kv_heads) if hf else e * (q + kv)

    if spec.mlp_kind == "swiglu":
        expert = (4 if hf else 3) * e * f  # hf: gate out, silu out, up out, product; fused: [gate|up], product
    elif hf and spec.activation == "gelu_new":
        expert = 5 * e * f  # the python tanh-GELU saves four f-sized tensors, then the fc2 input
    else:
        expert = 2 * e * f  # GeLU input, fc2 input
    if spec.is_moe:
        k = spec.experts_per_token
        # transformers' grouped-mm MoE: fp32 router softmax (E), top-k values/indices and permutations
        # (40 bytes per routed copy), each routed copy's gathered input and weighted output (2·e·h)
        boundary += 4 * spec.num_experts + 4 + k * (40 + 2 * e * h) if hf else 4 * spec.num_experts + k * e * h
        expert *= k
    return LayerActivations(boundary, attention + expert, quadratic, e * h)


def outside_layer_bytes(spec: ModelSpec, profile: str, dtype_bytes: int, mask_bytes: int, seq_len: int,
                        micro_batch: int, tp_divisor_first: int, tp_divisor_last: int, loss_divisor: int,
                        first: bool, last: bool, layers_checkpointed: bool) -> float:
    """Saved bytes of one micro-batch outside the decoder layers on a stage (Korthikanti et al. 2022,
    sec. 4.3: embedding dropout mask; final norm, lm_head input and fp32 logits 4·s·b·V)."""
    e, m, h = dtype_bytes, mask_bytes, spec.hidden_size
    tokens = micro_batch * seq_len
    hf = profile == "hf"
    total = 0.0
    if hf and spec.learned_positions:
        total += 8 * seq_len  # GPT-2's position ids (int64)
    elif hf and not layers_checkpointed:
        total += 2 * seq_len * spec.head_dim * e  # each stage's rotary cos/sin, saved by the layers
    if first:
        total += tokens * ((8 if hf else 0) + (m * h if spec.embedding_dropout else 0) / tp_divisor_first)
    if last:
        if hf and spec.norm_kind == "rmsnorm":
            norm = (4 + e) * h + 4
        elif hf:
            norm = e * h + 8
        else:
            norm = e * h
        total += tokens * ((norm + e * h) / tp_divisor_last + 4 * spec.vocab_size / loss_divisor
                           + (8 if hf else 0)) + (4 if hf else 0)
    return total


def inflight_microbatches(schedule: str, pp: int, virtual_stages: int, microbatches: int, rank: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak, in units of
    (one micro-batch x all of the rank's layers)."""
    if pp == 1:
        return 1.0  # gradient accumulation runs micro-batches one after the other
    m, p, v = microbatches, pp, virtual_stages
    if schedule in ("GPipe", "LoopedBFS"):
        return float(m)  # all forwards before any backward (Huang et al. 2019)
    if schedule == "1F1B":
        return float(min(p - rank, m))  # PipeDream-Flush: rank r warms up p - r (Narayanan et al. 2021)
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        # torch's interleaved warm-up: (v-1)·per_round + 2·(p-1-r) model chunks, plus the steady one;
        # each chunk is 1/v of the rank's layers (Korthikanti et al. 2022: rank 0 holds L·(1+(p-1)/(p·v))).
        per_round = m // max(1, m // p)
        chunks = min((v - 1) * per_round + 2 * (p - 1 - rank) + 1, m * v)
        return chunks / v
    if schedule == "ZBVZeroBubble":
        return float(min(p, m))  # ZB-V keeps 1F1B's peak, balanced over ranks (Qi et al. 2024, table 1)
    if schedule == "DualPipeV":
        return float(min(p + 1, m))  # DeepSeek-V3 report, table 2: PP + 1 micro-batches
    raise ValueError(f"pp_schedule={schedule!r} is not a known schedule")


def rank_stages(schedule: str, pp: int, virtual_stages: int, rank: int) -> tuple:
    """Pipeline stage indices a rank runs: looped (r, r+p, ...) or V-shaped (r, 2p-1-r)."""
    if schedule in V_SHAPED:
        return (rank, 2 * pp - 1 - rank)
    return tuple(rank + k * pp for k in range(virtual_stages))
