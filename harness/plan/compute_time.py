"""Compute time of one decoder layer and of the layers outside it, per operation class, forward and backward."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple, Tuple

from harness.plan.flops import mixer_flops_per_token
from harness.plan.hardware import GEMM_TILES, SPLIT_K, SPLIT_K_MIN_DEPTH, HardwareProfile
from harness.plan.model_spec import ModelSpec
from harness.plan.regime import (AUTOCAST_LAYER_ELEMENTWISE_OPS, AUTOCAST_LAYER_TRAFFIC, AUTOCAST_WEIGHT_CAST_BYTES,
                                 COMPILED_LAYER_ELEMENTWISE_OPS, compiled_layer_elementwise_bytes, fp8_cast_bytes)
from harness.plan.states import rank_shape


class OpTime(NamedTuple):
    """Seconds per operation class for one micro-batch on one rank."""

    gemm: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0

    @property
    def total(self) -> float:
        return self.gemm + self.attention + self.elementwise

    def __add__(self, other):  # type: ignore[override]
        return OpTime(self.gemm + other.gemm, self.attention + other.attention, self.elementwise + other.elementwise)

    def scaled(self, k: float) -> "OpTime":
        return OpTime(self.gemm * k, self.attention * k, self.elementwise * k)


def gemm_time(m: float, k: float, n: float, dtype_bytes: int, hw: HardwareProfile, peak: float) -> float:
    """One (m x k) @ (k x n) product: roofline at the achievable matmul rate (less its wave quantization and
    its shape's fall) and the achievable memory bandwidth (Williams et al. 2009), plus the per-op latency;
    efficiency falls for thin shapes because their bytes per FLOP grow, and for tiny ones because the latency
    dominates."""
    return _roofline(1, m, k, n, dtype_bytes, hw, peak * wave_efficiency(m, k, n, hw.sm_count))


def _roofline(groups: float, m: float, k: float, n: float, dtype_bytes: int, hw: HardwareProfile,
              rate: float) -> float:
    """One kernel running `groups` (m x k) @ (k x n) products at `rate` FLOP/s less their shape's fall, or at the
    memory bandwidth its operands need, whichever is slower, plus its launch."""
    flops = 2.0 * groups * m * k * n
    moved = groups * dtype_bytes * (m * k + k * n + m * n)
    compute = flops / (rate * shape_efficiency(m, k, n, hw))
    return hw.op_latency_s + max(compute, moved / (hw.memory_bandwidth * hw.memory_efficiency))


def grouped_gemm_time(groups: float, m: float, k: float, n: float, dtype_bytes: int, hw: HardwareProfile,
                      peak: float) -> float:
    """`groups` products (m x k) @ (k x n) in one grouped kernel (a MoE layer's experts: torch's _grouped_mm in
    transformers, Megatron's grouped GEMM): gemm_time's roofline with one launch, the waves of every group's
    tiles together, each group's own shape (a few rows per expert run far below a full GEMM's rate) and every
    group's operands read (each expert's weights once)."""
    if groups <= 1:
        return gemm_time(m, k, n, dtype_bytes, hw, peak)
    return _roofline(groups, m, k, n, dtype_bytes, hw, peak * grouped_wave_efficiency(groups, m, n, hw.sm_count))


@lru_cache(maxsize=1 << 14)
def grouped_wave_efficiency(groups: float, m: float, n: float, sms: int) -> float:
    """wave_efficiency for `groups` outputs of m x n tiled together (no split-K: each group's reduction is its
    own), the best tile: the blocks of all groups run in waves of one per SM."""
    if not sms:
        return 1.0
    best = 0.0
    for tm, tn in GEMM_TILES:
        blocks = groups * math.ceil(m / tm) * math.ceil(n / tn)
        best = max(best, groups * m * n / (math.ceil(blocks / sms) * sms * tm * tn))
    return min(1.0, best)


def shape_efficiency(m: float, k: float, n: float, hw: HardwareProfile) -> float:
    """What a GEMM keeps of the full-wave rate at its smallest dimension d: d / (d + D), D the profile's
    gemm_half_rate_dim (hardware.py cites the measurement). A thin operand gives each tile fewer products per
    byte it loads and a short K loop per tile its fixed prologue and epilogue: half the rate at d = D."""
    smallest = min(m, k, n)
    return smallest / (smallest + hw.gemm_half_rate_dim) if hw.gemm_half_rate_dim and smallest > 0 else 1.0


@lru_cache(maxsize=1 << 14)
def wave_efficiency(m: float, k: float, n: float, sms: int) -> float:
    """Fraction of the GPU's SMs an (m x k) @ (k x n) GEMM keeps busy, at the best tile and split-K: its
    ceil(m/Tm) x ceil(n/Tn) x split thread blocks run in waves of one block per SM, each wave costing as much
    full or not, and a partial tile costs a whole one (hardware.py cites the tiles, the split-K rule and the
    guide). MAMF (the profile's matmul efficiency) is measured at full waves. 1 without an SM count (CPUs)."""
    if not sms:
        return 1.0
    best = 0.0
    for tm, tn in GEMM_TILES:
        blocks = math.ceil(m / tm) * math.ceil(n / tn)
        for split in SPLIT_K:
            if split > 1 and k / split < SPLIT_K_MIN_DEPTH:
                break
            waves = math.ceil(blocks * split / sms)
            best = max(best, m * n * split / (waves * sms * tm * tn))
    return min(1.0, best)


def streaming_time(nbytes: float, ops: int, hw: HardwareProfile) -> float:
    """Memory-bound elementwise / norm work: bytes at the achievable bandwidth plus each op's latency."""
    return ops * hw.op_latency_s + nbytes / (hw.memory_bandwidth * hw.memory_efficiency)


def layer_gemms(spec: ModelSpec, tokens: float, tp: int):
    """(m, k, n, count) of the weight GEMMs of one layer's forward on one TP rank (Megatron split:
    q/k/v and the MLP's first matrices column-parallel, o and the last one row-parallel)."""
    attention, mlp = layer_gemm_blocks(spec, tokens, tp)
    return attention + mlp


def layer_gemm_blocks(spec: ModelSpec, tokens: float, tp: int):
    """layer_gemms as (the attention block's GEMMs, the MLP's). Multi-latent attention runs its own matrices
    (ModelSpec.attention_matrices: a weight split on its output dim 0 or input dim 1 by tp, else whole on every
    TP rank). A MoE layer's MLP: first the routed experts' two products over all k x tokens rows (one expert's
    matrices; ROUTED_ROWS of them, run as grouped GEMMs by layer_time), then its shared experts' and its router."""
    h, d, f = spec.hidden_size, spec.head_dim, spec.ffn_size
    q, kv = spec.num_heads * d // tp, spec.num_kv_heads * d // tp
    attn = [(tokens, h, q, 1), (tokens, h, kv, 2), (tokens, q, h, 1)]
    if spec.attention_latent_norms and spec.attention_matrices:
        attn = [(tokens, k / (tp if split == 1 else 1), n / (tp if split == 0 else 1), 1)
                for k, n, split in spec.attention_matrices]
    routed = tokens * spec.experts_per_token if spec.is_moe else tokens
    first = 2 if spec.gated_mlp else 1
    mlp = [(routed, h, f // tp, first), (routed, f // tp, h, 1)]
    if spec.is_moe and spec.shared_ffn_size:
        mlp += [(tokens, h, spec.shared_ffn_size // tp, first), (tokens, spec.shared_ffn_size // tp, h, 1)]
    if spec.is_moe:
        mlp.append((tokens, h, spec.num_experts, 1))  # router
    return attn, mlp


ROUTED_ROWS = 2  # layer_gemm_blocks' routed-expert rows, first in a MoE layer's MLP


# Kernels one layer of transformers' Llama-family code issues besides its GEMMs and attention, counted with
# a TorchDispatchMode over modeling_llama.py's forward and backward (transformers 5.23, bf16, SDPA): 38
# forward and 71 backward aten compute ops per layer, less 7 / 14 GEMMs and the attention call. Two RMSNorms
# with their fp32 round trip, rotary on q and k, residual adds, SwiGLU; the backward has about two kernels per
# forward one. View ops (as many again) only change metadata and are left out.
LAYER_ELEMENTWISE_OPS = {"forward": 30, "backward": 56}
EAGER_ATTENTION_OPS = {"forward": 10, "backward": 10}  # repeat_kv, matmul, mask add, fp32 softmax, cast, matmul


def layer_elementwise_bytes(spec: ModelSpec, tokens: float, tp: int, dtype_bytes: int, sp: bool = False) -> float:
    """Bytes one layer's memory-bound forward kernels read and write for `tokens` tokens on a TP rank.

    RMSNorm upcasts to fp32 (transformers): read e·h, then four fp32 passes of 8 bytes (read + write) per
    element, cast back and scale by the weight: about (3e + 32)·h per norm. Residual adds read two and
    write one (3e·h each). Rotary reads and writes q and k about four times (8e per element). SwiGLU's
    silu(gate)·up reads 3f and writes 2f; a two-matrix MLP's activation reads and writes f. Under sequence
    parallelism (`sp`) the norms and residual adds run on the rank's 1 / tp of the sequence (Korthikanti et
    al.'s sequence-parallel regions; torch's SequenceParallel norms, Megatron's --sequence-parallel).
    """
    e, h = dtype_bytes, spec.hidden_size
    _, _, q, kv = spec.mean_attention()
    q, kv, f = q / tp, kv / tp, spec.ffn_size / tp
    split = tp if sp else 1
    norms = 2 * (3 * e + 32) * h / split
    residual = 2 * 3 * e * h / split
    rotary = 8 * e * (q + kv) if not spec.learned_positions else 0
    act = (5 if spec.gated_mlp else 2) * e * f * (spec.experts_per_token if spec.is_moe else 1)
    return tokens * (norms + residual + rotary + act)


def attention_time(spec: ModelSpec, tokens: float, seq_len: int, tp: int, dtype_bytes: int, hw: HardwareProfile,
                   peak: float, backward: bool, cp: int = 1) -> float:
    """QK^T and AV of one layer for `tokens` query tokens against the whole sequence.

    Fused kernels (SDPA, flash) skip masked blocks, so a causal mask costs half the T^2 work; they run at
    the profile's attention efficiency, and their backward takes the profile's backward / forward ratio
    (recomputed scores: 5 matmuls against the forward's 2 on GPUs), plus a fixed cost per (sequence, head)
    the kernel works through (measured on CPUs, whose kernels set up buffers per head; 0 on GPUs). Eager
    attention materialises the scores: both matmuls over the full T, plus the fp32 softmax traffic (write
    scores, upcast, softmax, cast: ~14 bytes per score). Under context parallelism (`cp` > 1) the ring runs one
    kernel per step on the rank's seq_len / cp queries against one block of keys, each call paying the
    per-query-block cost of attention_kernel_efficiency again: the kernel sees sequences of seq_len / cp."""
    heads, _, qk_width, v_width = spec.attention_dims()  # the layers' own heads where they differ
    # TP splits the heads where it splits the attention block's matrices (DeepSeek-V3's plan leaves them whole)
    tp = tp if not spec.attention_matrices or any(split is not None for *_, split in spec.attention_matrices) else 1
    heads, full = heads / tp, 2.0 * (qk_width + v_width) / tp * tokens * seq_len
    if spec.attn_implementation == "eager":
        scores = heads * tokens * seq_len
        ops = EAGER_ATTENTION_OPS["backward" if backward else "forward"]
        one = (full / (peak) + streaming_time(14 * scores, ops, hw))
        return one * (2.0 if backward else 1.0)
    efficiency = hw.attention_efficiency_flash if spec.attn_implementation == "flash_attention_2" \
        else hw.attention_efficiency_sdpa
    # q, k and v share the kernel's head dim: values narrower than the queries' (multi-latent attention) are
    # zero-padded to it, so the AV product runs at the useful share (qk + v) / 2 max(qk, v) of the kernel's rate
    widest = max(qk_width, v_width)
    useful = (qk_width + v_width) / (2 * widest) if widest else 1.0
    rate = peak / hw.matmul_efficiency * efficiency * useful * attention_kernel_efficiency(
        widest / max(heads * tp, 1e-9), seq_len // max(1, cp), hw)  # a head's width: TP splits heads, not dims
    sequence_heads = heads * tokens / seq_len
    per_head = hw.attention_backward_head_latency_s if backward else hw.attention_head_latency_s
    return (hw.op_latency_s + sequence_heads * per_head + unpad_pad_time(spec, tokens, tp, dtype_bytes, hw, backward)
            + (full / 2) * (hw.attention_backward_ratio if backward else 1.0) / rate)


# flash-attn's bert_padding (v2.4.2) around its variable-length kernel, as MPT's flash_attn_fn calls it on every
# layer (llm-foundry 5e85bd62d, llmfoundry/models/layers/attention.py: an all-ones mask when none is given), in
# bytes per element of q, k and v, per element of the output, in units of the element size, and ops:
# - forward: unpad_input on each of q, k, v: a sum, nonzero, max().item(), cumsum and pad on the mask, then
#   IndexFirstAxis's torch.gather (reads and writes the tensor: 2; its index is an expanded view); pad_input on the
#   output: torch.zeros and an index_put (write, read, write: 3);
# - backward: each gather's zeros and scatter_ (write, read, write: 3); the output's gather (2).
# nonzero and .item() wait for the device, so the host issues the forward's ops with the device idle: they take
# the host's dispatch time (HardwareProfile.host_op_latency_s) where the profile has one.
UNPAD_PAD = {"forward": (2, 3, 3 * 6 + 2), "backward": (3, 2, 3 * 2 + 1)}


def unpad_pad_time(spec: ModelSpec, tokens: float, tp: int, dtype_bytes: int, hw: HardwareProfile,
                   backward: bool) -> float:
    """The copies flash-attn's unpad / pad wrap around the kernel on one layer for `tokens` tokens on a TP rank
    (UNPAD_PAD); 0 unless the profile's kernel runs behind them (hw.attention_unpad)."""
    if not hw.attention_unpad:
        return 0.0
    _, _, q, kv = spec.mean_attention()
    per_input, per_output, ops = UNPAD_PAD["backward" if backward else "forward"]
    moved = tokens * dtype_bytes * (per_input * (q + 2 * kv) + per_output * q) / tp
    latency = hw.op_latency_s if backward else max(hw.op_latency_s, hw.host_op_latency_s)
    return ops * latency + streaming_time(moved, 0, hw)


def attention_kernel_efficiency(head_dim: float, seq_len: int, hw: HardwareProfile) -> float:
    """A fused attention kernel's rate at this head dim and sequence length over its rate at head dim 128 and
    long sequences: FlashAttention-2's measured forward + backward TFLOP/s fit R_d / (1 + T0 / T) (hardware.py
    cites the tables): a fixed cost per query block that long sequences amortise, and head dim 64 running at
    attention_small_head_ratio of 128 (linear between; outside 64-128 the nearer end). A head dim the kernel is
    not built for runs the next one's kernel (kernel_head_dim) in its time: head_dim / kernel of it is useful."""
    kernel = kernel_head_dim(head_dim, hw)
    d = min(max(kernel, 64.0), 128.0)
    head = hw.attention_small_head_ratio + (1.0 - hw.attention_small_head_ratio) * (d - 64.0) / 64.0
    return head * (head_dim / kernel) / (1.0 + hw.attention_half_rate_tokens / max(1, seq_len))


def kernel_head_dim(head_dim: float, hw: HardwareProfile) -> float:
    """The head dim whose kernel runs `head_dim`: the least the kernel is built for at or above it
    (HardwareProfile.attention_head_dims), else `head_dim` itself."""
    return next((float(d) for d in sorted(hw.attention_head_dims) if d >= head_dim - 1e-9), head_dim)


def attention_share(spec: ModelSpec) -> float:
    """The fraction of decoder layers whose mixer is softmax attention (1 without per-layer mixers)."""
    mixers = spec.layer_mixers
    return sum(mixer == "attention" for mixer in mixers) / len(mixers) if mixers else 1.0


def mixer_time(spec: ModelSpec, tokens: float, seq_len: int, tp: int, peak: float, backward: bool) -> float:
    """The non-attention mixers' own products (flops.mixer_flops_per_token: a selective scan's readout, the
    delta rule's chunked products, a causal convolution's padded outputs), averaged over the layers and split
    like the heads by tp, timed GEMM-equivalent at the achievable matmul rate; the backward twice the forward.
    A GEMM-equivalent rate is optimistic for a sequential scan, whose elementwise state updates are
    memory-bound, and for the delta rule's small per-chunk products and triangular solves."""
    if not spec.layer_mixers and not spec.layer_conv_padding:
        return 0.0
    flops = mixer_flops_per_token(spec, seq_len) * tokens / (spec.num_layers * tp)
    return flops * (2.0 if backward else 1.0) / peak


@lru_cache(maxsize=1 << 16)
def layer_time(spec: ModelSpec, tokens: float, seq_len: int, tp: int, dtype_bytes: int, hw: HardwareProfile,
               peak: float, backward: bool, compiled: bool = False, fp8_speedup: float = 1.0, cp: int = 1,
               autocast_fp32: bool = False, fp8_shares: Tuple[float, float] = (1.0, 1.0), sp: bool = False,
               ep: int = 1, fp8_delayed_scaling: bool = False) -> OpTime:
    """One decoder layer on one rank for one micro-batch of `tokens` local tokens: forward, or backward
    (two GEMMs per weight GEMM, one for the input gradient and one for the weight gradient; twice the
    elementwise traffic). `compiled`: the block runs under torch.compile. `fp8_speedup` > 1: the weight
    GEMMs FP8 converts run in FP8 (1-byte operands, the faster peak) and pay their casts as elementwise work
    (harness.plan.regime): `fp8_shares` of the attention block's and of the MLP's (regime.fp8_converted_shares);
    the rest, attention and the elementwise chain stay in the compute precision.
    `autocast_fp32`: bf16 autocast over fp32 weights, its counted traffic and weight casts (harness.plan.regime).
    `sp`: sequence parallelism, whose norms and residual adds run on 1 / tp of the tokens. `ep`: the expert-
    parallel degree, which sets how many experts a rank's grouped expert GEMMs run (num_experts / ep).
    `fp8_delayed_scaling`: Transformer Engine's FP8 casts (regime.fp8_cast_bytes)."""
    fp8 = fp8_speedup != 1.0
    attention_rows, mlp_rows = layer_gemm_blocks(spec, tokens, tp)
    # a MoE layer's local experts (num_experts / ep) share its routed rows evenly (balanced routing)
    local = spec.num_experts / max(1, ep) if spec.is_moe else 1
    blocks = ([(1, row) for row in attention_rows],
              [(local if spec.is_moe and index < ROUTED_ROWS else 1, row) for index, row in enumerate(mlp_rows)])

    def gemms_time(rows, nbytes: int, rate: float) -> float:
        # backward: the input gradient (m x n) @ (n x k) and the weight gradient (k x m) @ (m x n), per group
        return sum(count * (grouped_gemm_time(g, m / g, n, k, nbytes, hw, rate) + grouped_gemm_time(
            g, k, m / g, n, nbytes, hw, rate) if backward else grouped_gemm_time(g, m / g, k, n, nbytes, hw, rate))
            for g, (m, k, n, count) in rows)

    def block_time(rows, fp8_share: float) -> float:  # its FP8 share at the FP8 rate, the rest as computed
        converted = fp8_share * gemms_time(rows, 1, peak * fp8_speedup) if fp8_share else 0.0
        return converted + ((1 - fp8_share) * gemms_time(rows, dtype_bytes, peak) if fp8_share < 1 else 0.0)

    shares = fp8_shares if fp8 else (0.0, 0.0)
    gemm = sum(block_time(rows, share) for rows, share in zip(blocks, shares))
    attention = (attention_time(spec, tokens, seq_len, tp, dtype_bytes, hw, peak, backward, cp) * attention_share(spec)
                 + mixer_time(spec, tokens, seq_len, tp, peak, backward))
    direction = "backward" if backward else "forward"
    if compiled:  # the block under torch.compile: fused elementwise kernels (harness.plan.regime)
        ops, moved = COMPILED_LAYER_ELEMENTWISE_OPS[direction], compiled_layer_elementwise_bytes(spec, tokens, tp,
                                                                                                  dtype_bytes, sp)
        moved *= 2 if backward else 1
    elif autocast_fp32:  # each weight matrix of the layer (this rank's TP shard) is cast: norms' weights are not
        weights = sum(rank_shape(t, tp, ep=1)[0] for t in spec.layer_tensors if len(t.shape) >= 2)
        ops = AUTOCAST_LAYER_ELEMENTWISE_OPS[direction]
        moved = (layer_elementwise_bytes(spec, tokens, tp, 2, sp) * AUTOCAST_LAYER_TRAFFIC[direction]
                 + AUTOCAST_WEIGHT_CAST_BYTES * weights)
    else:
        ops, moved = LAYER_ELEMENTWISE_OPS[direction], layer_elementwise_bytes(spec, tokens, tp, dtype_bytes, sp)
        moved *= 2 if backward else 1
    elementwise = streaming_time(moved, ops, hw)
    for rows, share in zip((attention_rows, mlp_rows), shares):
        if share:
            casts = sum(count for *_, count in rows) * (3 if backward else 2)
            moved = fp8_cast_bytes(rows, dtype_bytes, backward, fp8_delayed_scaling)
            elementwise += share * streaming_time(moved, 0 if compiled else casts, hw)
    return OpTime(gemm, attention, elementwise)


@lru_cache(maxsize=1 << 16)
def outside_time(spec: ModelSpec, tokens: float, tp: int, vocab_split: bool, dtype_bytes: int,
                 hw: HardwareProfile, peak: float, first: bool, last: bool, autocast_fp32: bool = False) -> OpTime:
    """Embedding gather on the first stage; final norm, lm_head GEMM and fp32 cross-entropy on the last,
    forward + backward (the loss reads and writes the fp32 logits about three times each way); under autocast
    over fp32 weights the head's weight cast to bf16 and its gradient's back."""
    e, h = dtype_bytes, spec.hidden_size
    vocab = spec.vocab_size / (tp if vocab_split else 1)
    out = OpTime()
    if first:
        out += OpTime(elementwise=streaming_time(3 * tokens * h * e, 3, hw))
    if last:
        head = (gemm_time(tokens, h, vocab, e, hw, peak) + gemm_time(tokens, vocab, h, e, hw, peak)
                + gemm_time(h, tokens, vocab, e, hw, peak))  # forward, input and weight gradients
        loss = streaming_time(tokens * vocab * (e + 4 * 6), 12, hw)
        out += OpTime(gemm=head, elementwise=loss + streaming_time(3 * (3 * e + 32) * h * tokens, 16, hw))
        if autocast_fp32:
            out += OpTime(elementwise=streaming_time(2 * AUTOCAST_WEIGHT_CAST_BYTES * vocab * h, 2, hw))
    return out
