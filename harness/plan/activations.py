"""Bytes of activations saved for backward, after Korthikanti et al. 2022, for HF and Megatron kernels."""

from __future__ import annotations

from functools import lru_cache
from operator import mul
from typing import Any, Dict, List, NamedTuple, Tuple

from harness.plan.conventions import COMPUTE_BYTES
from harness.plan.model_spec import ModelSpec
from harness.plan.pipeline import SPLIT_BACKWARD, V_SCHEDULES, rank_stages
from harness.plan.support import ENGINE_SUPPORT

# "hf": transformers' modules as they run under deepspeed / fsdp / nd (RMSNorm upcasts to fp32, eager
# softmax in fp32, the loss upcasts logits); "megatron": Megatron-LM's fused kernels, the setting of
# Korthikanti et al. 2022 (norms save their input only, softmax in the compute dtype).
PROFILES = ("hf", "megatron")

# Schedules whose peak is replayed stage by stage (staged_moments): a rank's local stages differ in what they
# save (the first stage's embedding, the last one's head and loss, uneven splits) and in how many chunks each holds.
STAGED_SCHEDULES = ("Interleaved1F1B", *SPLIT_BACKWARD)


class LayerActivations(NamedTuple):
    """Bytes one decoder layer saves per token (one micro-batch), split by how TP/SP divide them."""

    boundary: float  # at the layer's ends (norms, residual dropout masks): TP replicates, sequence
    # parallelism divides by tp
    linear_inputs: float  # inputs of the QKV and first MLP projections: TP replicates; see sp_saved_divisor
    sharded: float  # inside attention and MLP (heads, ffn columns): divided by tp
    quadratic: float  # per token *and* per key (softmax and its dropout): x seq_len, divided by tp
    checkpoint: float  # what full recomputation keeps: the layer input
    mask: float = 0.0  # per token and per key, one attention mask per masked layer: x seq_len, TP replicates


def norm_bytes(spec: ModelSpec, profile: str, dtype_bytes: int) -> int:
    """Bytes one norm saves per token."""
    h = spec.hidden_size
    if profile == "megatron":
        return dtype_bytes * h  # fused LayerNorm / RMSNorm kernel: its input only (Korthikanti: 2sbh)
    if spec.norm_kind == "rmsnorm":
        return (4 + dtype_bytes) * h + 4  # transformers' RMSNorm: fp32 input, fp32 rsqrt, normalised copy
    return dtype_bytes * h + 8  # torch.layer_norm: input, fp32 mean and rstd


def masked_layer_share(spec: ModelSpec, seq_len: int) -> float:
    """The share of softmax-attention layers transformers hands an explicit mask: a sliding window or a chunk
    shorter than the sequence (full causal attention runs with is_causal and no mask)."""
    windows = spec.attention_windows
    if not windows:
        return 0.0
    chunks = spec.attention_chunks or (0,) * len(windows)
    mixers = spec.layer_mixers or ("attention",) * len(windows)
    spans = [(w, c) for w, c, mixer in zip(windows, chunks, mixers) if mixer == "attention"]
    masked = sum(1 for w, c in spans if (w and seq_len > w) or (c and seq_len > c))
    return masked / len(spans) if spans else 0.0


def sdpa_kernel(spec: ModelSpec, on_cpu: bool) -> str:
    """The kernel torch's scaled_dot_product_attention picks in training: "fused" (flash / memory-efficient:
    no s^2 tensor) or "math". On CPU, torch 2.13's flash kernel refuses dropout and a value head size
    differing from the query's (multi-latent attention), so it falls back to math (torch._fused_sdp_choice,
    checked in the tests); CUDA's memory-efficient kernel takes both."""
    qk, v = spec.qk_head_dim or spec.head_dim, spec.v_head_dim or spec.head_dim
    return "math" if on_cpu and (qk != v or spec.attention_dropout) else "fused"


def sdpa_repeats_kv(spec: ModelSpec, masked: bool) -> bool:
    """transformers repeats K and V to every query head unless SDPA can group them itself: no mask and equal
    key and value head sizes of at most 256 (integrations/sdpa_attention.py, use_gqa_in_sdpa)."""
    qk, v = spec.qk_head_dim or spec.head_dim, spec.v_head_dim or spec.head_dim
    return masked or qk != v or qk > 256


def attention_activations(spec: ModelSpec, profile: str, e: int, m: int, on_cpu: bool,
                          seq_len: int) -> Tuple[float, float, float]:
    """(per token sharded by heads, per token and key sharded by heads, per token and key replicated: the
    masks) that one attention saves, averaged over masked and unmasked layers.

    With qd / vd the query-key / value head sizes (multi-latent attention: qd = nope + rope > vd):
    - eager (transformers' own matmuls): Q, K and V repeated to all heads for the two matmuls, the
      fp32 softmax and its cast copy or dropout's mask and output, the tanh output when logits are
      soft-capped (Gemma 2), the projection input;
    - fused SDPA: Q, K, V (repeated when transformers repeats them), the output (the projection's input)
      and an fp32 log-sum-exp per head; a masked layer's mask is saved in the compute dtype; flash-attention
      (attn_implementation flash_attention_*) the same with K, V as grouped and no mask;
    - math SDPA (the CPU fallback): torch upcasts to fp32 and saves Q, K and V at every head, the
      softmax and, with dropout, its mask and output; the projection input stays in the compute dtype.
    """
    hf = profile == "hf"
    a, kvh, q_width, kv_width = spec.mean_attention()
    qd, vd = (spec.qk_head_dim or spec.head_dim), (spec.v_head_dim or spec.head_dim)
    if spec.attention_heads:  # layers differ in shape (Gemma 4, Inkling): their mean widths, keys as wide as values
        q = out = q_width
        k_width = v_width = kv_width
    else:
        q, out, k_width, v_width = a * qd, a * vd, kvh * qd, kvh * vd
    attn_dropout = (m + e) * a if spec.attention_dropout else 0
    if spec.attn_implementation == "eager":
        kv_saved = q + out if hf else k_width + v_width  # transformers' eager path repeats k/v to all heads
        if hf and spec.model_type != "gpt2":
            # softmax in fp32; the matmul saves the cast copy, or dropout's mask and output
            quadratic = 4 * a + (attn_dropout or (e * a if e < 4 else 0))
        else:
            quadratic = e * a + attn_dropout
        quadratic += e * a if spec.attn_logit_softcapping else 0  # tanh saves its output
        return e * (q + kv_saved) + e * out, quadratic, 0.0
    if not hf or spec.attn_implementation != "sdpa":
        # Megatron's fused kernels, flash-attention: Q, K, V as grouped, the output and the softmax statistics;
        # windows and chunks are the kernel's own (no mask tensor)
        return e * (q + k_width + v_width) + 4 * a + e * out, 0.0, 0.0
    if sdpa_kernel(spec, on_cpu) == "math":
        return 4 * (2 * q + out) + e * out, 4 * a * (3 if spec.attention_dropout else 1), 0.0
    share = masked_layer_share(spec, seq_len)
    kv = {masked: (q + out if sdpa_repeats_kv(spec, masked) else k_width + v_width) for masked in (False, True)}
    kv_saved = share * kv[True] + (1 - share) * kv[False]
    return e * (q + kv_saved) + 4 * a + e * out, 0.0, share * e


def latent_slice_activations(spec: ModelSpec, profile: str, e: int, on_cpu: bool) -> Tuple[float, float]:
    """(replicated, sharded by head) bytes per token multi-latent attention saves beyond its latents and V, where a
    tensor saved for backward is a slice of a wider projection output and autograd keeps the whole storage
    (transformers' modules, the "hf" profile; Megatron's kernels save their own tensors):
    - a latent norm over a slice of its projection's output (DeepSeek's kv_a_layernorm reads the kv_lora_rank
      latent of kv_a_proj_with_mqa's latent + rotary key, w = attention_latent_outputs wide): RMSNorm's
      .to(float32) is a no-op in fp32, so pow saves the whole output, 4·(w - latent) more; in 16 bits it copies
      the latent alone. Replicated: the latent projections (q_a, kv_a) are outside transformers' TP plans.
    - V split from kv_b's output a·(qk_nope + v) (attention_value_source): eager's matmul and fused SDPA save V
      as handed, the whole output, e·(source - a·v) more; math SDPA (the CPU fallback) saves an fp32 copy of V,
      the view itself in fp32 (4·(source - a·v) more). Sharded: kv_b is column-parallel, by head.
    Flash-attention's own copies are not counted."""
    if profile != "hf":
        return 0.0, 0.0
    replicated = sum(4 * (w - latent) for latent, w in zip(spec.attention_latent_norms, spec.attention_latent_outputs)
                     if e == 4)
    source = spec.attention_value_source
    values = spec.num_heads * (spec.v_head_dim or spec.head_dim)
    as_handed = spec.attn_implementation == "eager" or (
        spec.attn_implementation == "sdpa" and (sdpa_kernel(spec, on_cpu) == "fused" or e == 4))
    return replicated, (e * (source - values) if source and as_handed else 0.0)


def grouped_output_activations(spec: ModelSpec, e: int) -> float:
    """Bytes per token a grouped output projection saves beyond its input (counted as attention's projection input):
    DeepSeek-V4's o_a_proj maps each of o_groups groups of heads to o_lora_rank (a bmm over the groups, its input
    the attention output) and o_b_proj saves its o_groups·o_lora_rank input (attention_output_latent, in the compute
    dtype). Sharded: each group's intermediate belongs to its heads."""
    return e * spec.attention_output_latent


def hyper_connection_activations(spec: ModelSpec, e: int, seq_len: int) -> float:
    """Bytes per token one layer's hyper-connections save (hyper_connections of them, attention's and the MLP's),
    with N streams of h, run in fp32 by transformers whatever the dtype. Each collapses the N·h streams into its
    sub-layer's input and spreads the sub-layer's output back; all are per token over the hidden size, replicated
    under TP like the boundary (sequence parallelism divides them). `.float()` of the streams is a copy in 16 bits
    (4·N·h) beside the streams the collapse reads in the dtype (e·N·h), the streams themselves in fp32 (4·N·h);
    in 16 bits `fn.float()` also copies the projection (rows x N·h fp32 per micro-batch, written per sequence).
    - "pre_post" (HY-V4's HYV4HyperConnection): the fp32 streams the fn projection reads, the unweighted norm's
      rsqrt, the projection's output and its product with the rsqrt (2N each), the pre and post sigmoids, pre +
      eps the collapse multiplies (N each); at the spread, post and the sub-layer output in fp32 (N, 4·h).
    - "sinkhorn" (DeepSeek-V4's mHC): the fp32 streams, the norm's rsqrt and the normalised streams fn reads
      (4·N·h), fn's output (pre, post, comb: (2 + N)·N), the pre and post sigmoids (N each), comb's softmax
      (N²) and each of the 2·I - 1 Sinkhorn divisions' numerator (N², the softmax + eps first) and denominator
      (N), pre + eps (N); at the spread, post and the final comb in the dtype (N, N²: the matmul reads comb^T)
      and the sub-layer output (e·h).
    - "gated" (Qwen4's gated residual, rank r): the grouped RMSNorm's fp32 input, rsqrt per stream, normalised
      copy (4·N·h, 4·N, 4·N·h), the weighted output in the dtype (e·N·h) the projections read, the SiLU's input
      and output (2·e·r), the sigmoid mix (e·N·h), the injection sigmoid and its double (2·e·N); the sub-layer
      output the injection multiplies (e·h); per micro-batch the norm's 1 + weight (4·N·h fp32, written per
      sequence).
    """
    n, h, form = spec.hyper_streams, spec.hidden_size, spec.hyper_connection_form
    if not n or not form:
        return 0.0
    streams = 4 * n * h + (e * n * h if e < 4 else 0)
    fn_copy = 4 * n * h / seq_len if e < 4 and seq_len else 0.0  # per fn row
    if form == "pre_post":
        one = streams + 4 + 4 * 2 * n * 2 + 4 * n * 3 + 4 * n + 4 * h + 2 * n * fn_copy
    elif form == "sinkhorn":
        divisions = 2 * spec.hyper_sinkhorn_iterations - 1
        one = (streams + 4 + 4 * n * h + 4 * (2 + n) * n + 2 * 4 * n + 4 * n * n + divisions * 4 * (n * n + n)
               + 4 * n + e * n + e * n * n + e * h + (2 + n) * n * fn_copy)
    else:
        r = spec.hyper_connection_rank
        one = (8 * n * h + 4 * n + 2 * e * n * h + 2 * e * r + 2 * e * n + e * h
               + (4 * n * h / seq_len if seq_len else 0))
    return spec.hyper_connections * one


def hyper_head_activations(spec: ModelSpec, e: int) -> Tuple[float, float]:
    """(per token, per micro-batch) bytes the streams' final collapse saves on the last stage, replicated like the
    final norm: HY-V4's and DeepSeek-V4's hyper head (the fp32 streams, the unweighted norm's rsqrt, fn's output
    and the pre weights, N each: HY-V4 keeps fn's output and its product with the rsqrt, DeepSeek-V4 the
    normalised streams fn reads, 4·N·h, and the scaled mixes, sigmoid and pre + eps), Qwen4's mixer (its
    gated residual without the injection: as hyper_connection_activations' "gated" less 2·e·N and the sub-layer
    output). In 16 bits the fp32 copy of the hyper head's N x N·h projection is kept per micro-batch."""
    n, h, form = spec.hyper_streams, spec.hidden_size, spec.hyper_connection_form
    if not n or not form:
        return 0.0, 0.0
    streams = 4 * n * h + (e * n * h if e < 4 else 0)
    fn_copy = 4.0 * n * n * h if e < 4 else 0.0
    if form == "pre_post":
        return streams + 4 + 4 * 4 * n, fn_copy
    if form == "sinkhorn":
        return streams + 4 + 4 * n * h + 4 * 3 * n, fn_copy
    return 8 * n * h + 2 * e * n * h + 2 * e * spec.hyper_connection_rank, 4.0 * n * h


def mlp_activations(spec: ModelSpec, hf: bool, e: int, ffn: int) -> float:
    """Bytes one MLP of intermediate size ffn saves per token, after its input."""
    if spec.mlp_kind == "swiglu":
        return (4 if hf else 3) * e * ffn  # hf: gate out, silu out, up out, product; fused: [gate|up], product
    if hf and spec.activation == "gelu_new":
        return 5 * e * ffn  # the python tanh-GELU saves four f-sized tensors, then the fc2 input
    return 2 * e * ffn  # GeLU input, fc2 input


# transformers' torch path of the gated delta rule (torch_chunk_gated_delta_rule) runs chunks of 64 tokens, as
# flash-linear-attention's kernels do.
DELTA_RULE_CHUNK = 64


class DeltaRuleGeometry(NamedTuple):
    """A delta-rule layer's shape as its chunked torch path runs it."""

    heads: int
    key_dim: int
    value_dim: int
    conv_taps: int
    chunk: int
    tokens: int  # the sequence (one chunk when unknown)
    chunks: int  # ceil(tokens / chunk)
    padding: float  # chunks·chunk / tokens: the padded tokens per real one
    conv_channels: int


def delta_rule_geometry(spec: ModelSpec, layer: int, seq_len: int) -> DeltaRuleGeometry:
    """Gated DeltaNet's and Kimi delta attention's chunking of a seq_len-token sequence into DELTA_RULE_CHUNK."""
    t = seq_len or DELTA_RULE_CHUNK
    c = -(-t // DELTA_RULE_CHUNK)
    return DeltaRuleGeometry(spec.delta_rule_heads, spec.delta_rule_key_dim, spec.delta_rule_value_dim,
                             spec.conv_kernel, DELTA_RULE_CHUNK, t, c, c * DELTA_RULE_CHUNK / t,
                             conv_channels(spec, layer))


def conv_channels(spec: ModelSpec, layer: int) -> int:
    """Channels of a layer's causal depthwise convolution (layer_conv_padding is C·K·(K - 1))."""
    k = spec.conv_kernel
    return spec.layer_conv_padding[layer] // (k * (k - 1)) if k > 1 and spec.layer_conv_padding else 0


def upcast(e: int) -> int:
    """Bytes of the fp32 copy `.float()` makes of a compute-dtype tensor (none in fp32: it returns the input)."""
    return 4 if e < 4 else 0


def selective_scan_activations(spec: ModelSpec, layer: int, e: int, seq_len: int) -> Tuple[float, float]:
    """(replicated, sharded) bytes per token a Mamba-1 selective scan saves in transformers' torch path (Jamba's
    slow_forward and mamba_selective_scan's sequential loop). With D = d_inner, N the state size, R the time-step
    rank, K the conv taps and T the sequence:
    - sharded by channel (TP splits in_proj's output and d_inner): in_proj's output (x and the gate z, 2·D), the
      conv's output with its K - 1 padded steps (D·(T + K - 1)/T), its SiLU output x (D), the time step plus
      bias and its softplus (2·D fp32), exp(A·dt) and dt·B (2·D·N fp32), every step's state (D·N fp32, one more
      per sequence: the zero start; in a 16-bit dtype the matmul with C saves a cast copy of each), the output
      after the D skip and silu(z) (2·D), out_proj's input (D); per micro-batch, exp(A_log) and -A (2·D·N fp32,
      written per sequence);
    - replicated (x_proj's output feeds all ranks): the fp32 x_proj output the dt / B / C norms read, their
      rsqrt, normalised copies (Jamba's norms: what an RMSNorm saves, 4·(R + 2N) + 12 + e·(R + 2N)), the
      normalised dt dt_proj reads (R) and B and C as the scan reads them (fp32 B, C in the dtype)."""
    n, r = spec.scan_state_size, spec.scan_dt_rank
    d = spec.layer_scan_states[layer] // n
    t = seq_len or 1
    k = spec.conv_kernel
    sharded = (2 * e * d + e * d * (t + k - 1) / t + e * d + 2 * 4 * d + 2 * 4 * d * n
               + d * n * (4 + (e if e < 4 else 0)) + (e * d * n + 2 * 4 * d * n) / t + 2 * e * d + e * d)
    replicated = (4 * (r + 2 * n) + (12 + e * (r + 2 * n) if spec.scan_norms else 0)) + e * r + 4 * n + e * n
    return replicated, sharded


def state_space_duality_activations(spec: ModelSpec, layer: int, e: int, seq_len: int) -> Tuple[float, float]:
    """(replicated, sharded) bytes per token a Mamba-2 layer saves in transformers' torch path (the mixer's
    torch_forward and mamba2_chunk_scan, GraniteMoeHybrid's and Nemotron-H's). With H heads of P dims (D = H·P),
    G groups of state size N, chunks of Q, K conv taps, c = T / Q chunks of a T-token sequence, all sharded by
    head (TP splits in_proj's output): in_proj's output (gate, x, B, C and dt: 2·D + 2·G·N + H, the conv's input
    and the gate's view), the conv's output with its K - 1 padded steps; fp32: x (in fp32 a view of the whole
    conv output, D + 2·G·N), the D skip's padded x (D), dt + bias and its softplus (2·H, in the dtype), the
    clamped dt (H, two fp32 copies in a 16-bit dtype), exp(cumsum) and exp(last - cumsum) (2·H); the chunk
    products: B and C repeated to every head (5 copies of H·N across the einsums), x·dt (3 of D: two einsum
    operands and C·states), the C x C decays L, G = C·B and the masked M (3·H·Q per token); per chunk the
    states (H·P·N, c of them into C·states, c + 1 into the chunk recurrence) and the (c + 1)² chunk decays; the
    gated RMSNorm (scan output, silu(gate), their product, the normalised copy: 4·D fp32, an fp32 gate copy in
    16 bits, the rsqrt per group) and out_proj's input (D). Per micro-batch (written per sequence): exp(A_log)
    and -A (2·H fp32), the causal masks (2·Q² + 2·(c + 1)² bools)."""
    h, p, n, q, k = spec.ssd_heads, spec.ssd_head_dim, spec.ssd_state_size, spec.ssd_chunk, spec.conv_kernel
    d = h * p
    t = seq_len or q
    c = -(-t // q)
    pad = c * q / t  # chunked tensors cover whole chunks
    channels = conv_channels(spec, layer) or d
    gn = (channels - d) // 2
    per_token = ((2 * d + 2 * gn + h) * e + channels * e * (t + k - 1) / t
                 + 4 * (channels if e == 4 else d) + 4 * d * pad + 2 * h * e + 4 * h * (2 if e < 4 else 1)
                 + 2 * 4 * h * pad + (5 * 4 * h * n + 3 * 4 * d + 3 * 4 * h * q) * pad
                 + 4 * d * 4 + upcast(e) * d + 4 * gn // max(n, 1) + e * d)
    per_sequence = 4 * h * p * n * (2 * c + 1) + 4 * h * (c + 1) ** 2 + 2 * 4 * h + 2 * q * q + 2 * (c + 1) ** 2
    return 0.0, per_token + per_sequence / t


def gated_delta_rule_activations(spec: ModelSpec, layer: int, e: int, seq_len: int) -> Tuple[float, float]:
    """(replicated, sharded) bytes per token a Gated DeltaNet layer saves in transformers' torch path
    (torch_chunk_gated_delta_rule, chunks of C = 64). With H value heads of dk / dv dims (queries and keys
    repeated from their own heads to H), K conv taps over the q / k / v channels, c = T / C chunks, all sharded
    by head (TP splits the projections' outputs): the conv's input (the concatenated q, k, v) and its output
    with the K - 1 padded steps; beta (sigmoid output) and the decay's softplus input and output (H, 2·H fp32);
    fp32 per head: q and k through the L2 norm, scaled, padded and chunked, k·beta and its decayed copy, the
    decayed q and k and the einsum / solve operands (12 of H·dk), v, the solved values and each chunk's v_new
    (3 of H·dv), the two L2 rsqrts, beta, exp(cumulative decay) twice and the remaining decays (9 of H, with the
    sigmoid's 3 above); C x C per chunk: the pairwise decays, the triangular system, the intra-chunk scores and
    their products (5·H·C per token); per chunk the recurrent state (H·dk·dv) and its decay; the gated RMSNorm
    over dv (input, normalised and weighted copies, the gate and its SiLU: H·dv·(3·4 + 2·e), an rsqrt per
    head) and out_proj's input (H·dv). Per micro-batch (written per sequence): exp(A_log) and -A (2·H fp32), the
    C x C causal mask (bools)."""
    h, dk, dv, k, chunk, t, c, pad, channels = delta_rule_geometry(spec, layer, seq_len)
    # One chunk: the chunked matmuls' operands are views (5 H·dk copies fewer), and the last chunk's state
    # update, dropped with the final state, frees the decayed keys, their decays and the chunk decay.
    single = c == 1
    per_token = (channels * e + channels * e * (t + k - 1) / t + h * e + 2 * 4 * h
                 + ((6 if single else 12) * 4 * h * dk + 3 * 4 * h * dv + (5 if single else 6) * 4 * h
                    + 5 * 4 * h * chunk) * pad
                 + h * dv * (3 * 4 + 2 * e) + 4 * h + e * h * dv)
    per_sequence = c * 4 * h * dk * dv + (0 if single else 4 * h * c) + 2 * 4 * h + chunk * chunk
    return 0.0, per_token + per_sequence / t


def kimi_delta_rule_activations(spec: ModelSpec, layer: int, e: int, seq_len: int) -> Tuple[float, float]:
    """(replicated, sharded) bytes per token a Kimi delta attention layer saves in transformers' torch path
    (chunk_kimi_delta_attention, chunks of C = 64: Gated DeltaNet's form with a decay per key channel). With H
    heads of dk / dv dims, K conv taps over the q / k / v channels, c = T / C chunks, all sharded by head (TP
    splits the projections' outputs): the conv's input and its output with the K - 1 padded steps; beta
    (sigmoid output, H); fp32: q and k through the L2 norm (2 of H·dk) and their norms (2·H); padded and
    chunked, beta (H), the normalised keys, k·beta, exp(cumulative decay), k·beta times it, each chunk's
    exp(decay) and the scaled queries the chunk loop reads (6 of H·dk, one more with c > 1: the decayed k·beta
    solved, read against a state with a gradient), v, v·beta and each chunk's v_new (3 of H·dv); C x C per
    chunk: the triangular system and the intra-chunk scores (2·H·C per token); C x C x dk per chunk, the
    per-channel decays and the two products they weight (k·beta with k, q with k: 3·H·C·dk per token, the sums
    over dk being elementwise); the row-by-row inverse saves each row i (1 <= i < C) and the i x i block above
    it, cloned (sum of i² + i = (C² - 1)·C / 3 per chunk: H·(C² - 1) / 3 per token). Per sequence: the
    recurrent state each chunk reads (H·dk·dv, the zero start included, the last chunk's update dropped with
    the final state) and, for the c - 1 chunks before the last, the chunk decay (H·dk), the decays to its end
    and the decayed keys the update multiplies (2 of C·H·dk) and the next chunk's decayed queries (C·H·dk);
    three C x C causal masks (bools). The forget gate: Kimi Linear's softplus (exp(g), 1 + exp(g), the
    softplus, 3 of H·dk fp32, its overflow mask H·dk bools; per sequence exp(A_log) and -exp(A_log), 2·H
    fp32) or Bailing's bounded sigmoid (its input and output, 2 of H·dk fp32; exp(A_log) per sequence, H in
    the dtype: its unbounded softplus saves -exp(A_log) too); the gated RMSNorm over dv (fp32 input,
    normalised and weighted copies, the sigmoid gate: 4 of H·dv fp32, an rsqrt per head; in a 16-bit dtype
    its weight's fp32 copy per sequence) and out_proj's input (H·dv). Replicated: Kimi Linear's low-rank
    gates keep their rank-wide inner activations (f_a and g_a outputs, f_b / g_b's inputs: 2·rank)."""
    h, dk, dv, k, chunk, t, c, pad, channels = delta_rule_geometry(spec, layer, seq_len)
    rank = spec.delta_rule_gate_rank
    per_token = (channels * e + channels * e * (t + k - 1) / t + h * e + 2 * 4 * h * dk + 2 * 4 * h
                 + 4 * h * (1 + (6 if c == 1 else 7) * dk + 3 * dv + 2 * chunk + 3 * chunk * dk
                            + (chunk * chunk - 1) / 3) * pad
                 + (13 * h * dk if rank else 2 * 4 * h * dk) + 4 * 4 * h * dv + 4 * h + e * h * dv)
    per_sequence = (4 * h * c * dk * dv + (c - 1) * 4 * h * (dk + 3 * chunk * dk) + 3 * chunk * chunk
                    + (2 * 4 * h if rank else e * h) + upcast(e) * dv)
    return 2.0 * e * rank, per_token + per_sequence / t


def lightning_attention_activations(spec: ModelSpec, layer: int, e: int, seq_len: int) -> Tuple[float, float]:
    """(replicated, sharded) bytes per token a lightning-attention layer saves in transformers' torch path
    (MiniMax's block loop). With a heads of d dims, blocks of B tokens, nb = T / B blocks, all sharded by head
    (TP splits qkv_proj's output): the SiLU's input and output (3·a·d each), per block the decayed scores
    (a·B², the last block's as long as it is) the value matmul reads, the decayed queries and keys (a·d·B each,
    one block fewer: the first block's state is a constant zero, the last block's state update is dropped with
    the final state) and the running state (a·d², the zero start included) with its decay (a per block, two
    fewer); the output's RMSNorm over a·d, the sigmoid gate's output, the normalised output it gates and
    out_proj's input (a·d each). Per micro-batch (written per sequence): the decay buffers (a·B² diagonal,
    2·a·B query / key)."""
    a, d, b = spec.num_heads, spec.head_dim, spec.lightning_block
    t = seq_len or b
    blocks = -(-t // b)
    ad = a * d
    last = t - (blocks - 1) * b  # the last block may be shorter
    per_sequence = e * (a * ((blocks - 1) * b * b + last * last) + ad * ((blocks - 1) * b + max(blocks - 2, 0) * b)
                        + (ad * last if blocks > 1 else 0) + blocks * a * d * d + max(blocks - 2, 0) * a
                        + a * b * b + 2 * a * b)
    per_token = 6 * e * ad + (4 + e) * ad + 4 + 3 * e * ad
    return 0.0, per_token + per_sequence / t


def short_conv_activations(spec: ModelSpec, layer: int, e: int, seq_len: int) -> Tuple[float, float]:
    """(replicated, sharded) bytes per token LFM2's gated short convolution saves (Lfm2ShortConv.slow_forward),
    with C channels and K taps, sharded by channel: in_proj's output (B, C and x: 3·C, which the gates read as
    views), the gated B·x the convolution reads, the convolution's output with its K - 1 padded steps (the C gate
    reads a view of it) and out_proj's input (C)."""
    c, k = conv_channels(spec, layer), spec.conv_kernel
    t = seq_len or 1
    return 0.0, 3 * e * c + e * c + e * c * (t + k - 1) / t + e * c


MIXER_ACTIVATIONS = {"lightning_attention": lightning_attention_activations,
                     "short_conv": short_conv_activations,
                     "selective_scan": selective_scan_activations,
                     "state_space_duality": state_space_duality_activations,
                     "gated_delta_rule": gated_delta_rule_activations,
                     "kimi_delta_rule": kimi_delta_rule_activations}


def layer_activations(spec: ModelSpec, profile: str, dtype_bytes: int, mask_bytes: int, on_cpu: bool = False,
                      seq_len: int = 0) -> LayerActivations:
    """Saved bytes of one layer per token, term by term (Korthikanti et al. 2022, sec. 4.1).

    Korthikanti's GPT layer in 16-bit with dropout: attention 11·s·b·h + 5·a·s²·b (QKV input 2, Q and K
    4, V 2, softmax 2·a·s, its dropout mask a·s and output 2·a·s, projection input 2, dropout mask 1),
    MLP 19·s·b·h (input 2, GeLU input 8, fc2 input 8, mask 1), two LayerNorm inputs 4·s·b·h: in total
    s·b·h·(34 + 5·a·s/h). Written here per token with e = dtype bytes, m = dropout-mask bytes (1 on
    CUDA, e on CPU), so that GQA, SwiGLU, MoE, multi-latent attention and sandwich norms follow: each of the
    layer's hidden-size norms (spec.layer_norms, or their mean over layer_hidden_norms where layers differ) saves
    what a norm saves.
    """
    e, m, h = dtype_bytes, mask_bytes, spec.hidden_size
    a, kv_heads, q, kv = spec.mean_attention()  # the mean over layers whose heads differ (Gemma 4, Inkling)
    hf = profile == "hf"
    norms = sum(spec.layer_hidden_norms) / len(spec.layer_hidden_norms) if spec.layer_hidden_norms else spec.layer_norms
    boundary = (norms * norm_bytes(spec, profile, e) + (2 * m * h if spec.hidden_dropout else 0)
                + hyper_connection_activations(spec, e, seq_len))
    attention, quadratic, mask = attention_activations(spec, profile, e, m, on_cpu, seq_len)
    if spec.qk_norm:  # per-head RMSNorm on q and k (qwen3): fp32 inputs, rsqrt per head, normalised copies
        attention += (4 + e) * (q + kv) + 4 * (a + kv_heads) if hf else e * (q + kv)
    for latent in spec.attention_latent_norms:  # the latent's norm, then the next projection's input
        attention += (4 + e) * latent + 4 + e * latent if hf else 2 * e * latent
    latent_slices, value_source = latent_slice_activations(spec, profile, e, on_cpu)
    routing, mlp = moe_and_mlp_activations(spec, hf, e)
    attention += value_source + grouped_output_activations(spec, e)
    replicated, mixing, inputs, share = mixer_mix(spec, e, seq_len, attention)
    return LayerActivations(boundary + routing, inputs * e * h + replicated + share * latent_slices, mixing + mlp,
                            share * quadratic, e * h * max(1, spec.hyper_streams), share * mask)


def down_projection_inputs(spec: ModelSpec) -> float:
    """Elements per token the MLPs' down projections read, averaged over the layers as moe_and_mlp_activations
    averages their MLPs: k routed experts' and the shared or dense MLP's intermediate outputs."""
    mlps = spec.layer_mlps or ((spec.num_experts, spec.ffn_size if spec.is_moe else 0,
                                spec.shared_ffn_size if spec.is_moe else spec.ffn_size),)
    return sum((spec.experts_per_token * ffn if experts else 0) + always_on
               for experts, ffn, always_on in mlps) / len(mlps)


def te_fp8_saved_inputs(spec: ModelSpec, act: LayerActivations, e: int, seq_len: int) -> LayerActivations:
    """A Megatron-LM layer under Transformer Engine's FP8 (layout.precision=fp8 on megatron_lm): each Linear saves
    its input quantized, one byte an element, where a 16-bit run saves the compute-dtype tensor (TE
    pytorch/module/linear.py: under fp8 the saved `inputmat` is input_quantizer's output, with sequence parallelism
    the local shard it gathers again in backward; LayerNormLinear saves its normalised output the same way). The
    QKV and fc1 inputs and every down projection's input (the activation's product) drop from e bytes to 1; the
    output projection keeps a 1-byte copy of the attention output beside the one the fused attention keeps for its
    own backward (in 16 bits they are one tensor). Norm inputs, Q / K / V, the fc1 output the activation reads
    and the softmax statistics stay in the compute dtype."""
    a, _, q_width, _ = spec.mean_attention()
    out = q_width if spec.attention_heads else a * (spec.v_head_dim or spec.head_dim)
    _, _, inputs, share = mixer_mix(spec, e, seq_len, 0.0)
    return act._replace(linear_inputs=act.linear_inputs - (e - 1) * inputs * spec.hidden_size,
                        sharded=act.sharded + share * out - (e - 1) * down_projection_inputs(spec))


def mixer_mix(spec: ModelSpec, e: int, seq_len: int, attention: float) -> Tuple[float, float, float, float]:
    """(replicated, sharded, projection inputs of the hidden size, share of softmax-attention layers): the mean
    over the layers of each layer's token mixer, as moe_and_mlp_activations averages their MLPs. A softmax-
    attention layer saves `attention` (its per-key terms scale with the share); another mixer what its torch
    path saves (MIXER_ACTIVATIONS: per head or channel, split by TP, or replicated per token, like the QKV
    input); an MLP-only layer (Nemotron-H's) nothing. Each layer's mixer and MLP read a hidden-size input
    apiece (Nemotron-H's layers hold one or the other)."""
    mixers = spec.layer_mixers
    if not mixers:
        return 0.0, attention, 2.0, 1.0
    mlps = spec.layer_mlps or ((1, 1, 1),) * len(mixers)
    replicated = sharded = inputs = attention_layers = 0.0
    for layer, mixer in enumerate(mixers):
        inputs += (mixer != "none") + any(mlps[layer])
        if mixer in MIXER_ACTIVATIONS:
            r, s = MIXER_ACTIVATIONS[mixer](spec, layer, e, seq_len)
            replicated, sharded = replicated + r, sharded + s
        elif mixer != "none":  # softmax attention
            sharded += attention
            attention_layers += 1
    n = len(mixers)
    return replicated / n, sharded / n, inputs / n, attention_layers / n


def moe_and_mlp_activations(spec: ModelSpec, hf: bool, e: int) -> Tuple[float, float]:
    """(routing, MLP) bytes per token, averaged over the layers (dense-first MoE layers run a dense MLP).
    A MoE layer runs k routed experts and its shared ones for every token; transformers' grouped-mm MoE
    also keeps the fp32 router softmax (E), top-k values / indices and permutations (40 bytes per routed
    copy) and each routed copy's gathered input and weighted output (2·e·h)."""
    h, k = spec.hidden_size, spec.experts_per_token
    mlps = spec.layer_mlps or ((spec.num_experts, spec.ffn_size if spec.is_moe else 0,
                                spec.shared_ffn_size if spec.is_moe else spec.ffn_size),)
    routing = mlp = 0.0
    for experts, expert_ffn, always_on in mlps:
        if experts:
            routing += 4 * experts + 4 + k * (40 + 2 * e * h) if hf else 4 * experts + k * e * h
            mlp += k * mlp_activations(spec, hf, e, expert_ffn)
        mlp += mlp_activations(spec, hf, e, always_on) if always_on else 0
    return routing / len(mlps), mlp / len(mlps)


def op_policy_activations(spec: ModelSpec, e: int, on_cpu: bool) -> Tuple[float, float, float]:
    """(replicated, sharded by heads / ffn columns, sharded per token and key) bytes per token one decoder layer
    keeps under the `nd` engine's selective checkpointing (nd_session._selective_policy: torch's op-level
    selective checkpointing, as torchtitan's "op" mode): the output of every matmul and of the attention kernel
    is kept, everything else (norms, activation, rotary, residual adds) is recomputed in backward. Kept: the
    q / k / v projections (sharded), flash SDPA's output and fp32 log-sum-exp per head, or with eager / math
    attention the score and AV matmuls' outputs (the scores per key), the output projection and each down
    projection (row-parallel: a full-width partial sum on every TP rank), the up projections (gate and up, or
    fc1: sharded) of a dense or shared MLP, and a router's logits (routed experts run as grouped matmuls, which
    it recomputes). Measured on a 4-layer Llama (hidden 256, 4 heads, 2 KV heads, ffn 512, fp32): 9,232 bytes per
    token a layer above full recomputation's, this sum exactly; on tiny Mixtral and Qwen3-MoE layers too. The
    layer's input, which full recomputation keeps too, is apart (LayerActivations.checkpoint)."""
    h = spec.hidden_size
    a, kv_heads, q_width, kv_width = spec.mean_attention()
    qd, vd = (spec.qk_head_dim or spec.head_dim), (spec.v_head_dim or spec.head_dim)
    if spec.attention_heads:
        q, out, k_width, v_width = q_width, q_width, kv_width, kv_width
    else:
        q, out, k_width, v_width = a * qd, a * vd, kv_heads * qd, kv_heads * vd
    sharded = e * (q + k_width + v_width)
    if spec.attn_implementation == "eager" or sdpa_kernel(spec, on_cpu) == "math":
        per_key = (e if spec.attn_implementation == "eager" else 4) * a  # the score matmul's output
        sharded += e * out
    else:
        per_key = 0.0
        sharded += e * out + 4 * a
    mlps = spec.layer_mlps or ((spec.num_experts, spec.ffn_size if spec.is_moe else 0,
                                spec.shared_ffn_size if spec.is_moe else spec.ffn_size),)
    ups = 2 if spec.mlp_kind == "swiglu" else 1
    mlp_sharded = mlp_replicated = 0.0
    for experts, _, always_on in mlps:
        # routed experts run as grouped matmuls (transformers' MoE blocks), an op the policy does not keep: only
        # the router's logits and a dense or shared MLP's projections stay
        mlp_sharded += e * ups * always_on
        mlp_replicated += (e * h if always_on else 0) + (e * experts if experts else 0)
    replicated = e * h + mlp_replicated / len(mlps)
    return replicated, sharded + mlp_sharded / len(mlps), per_key


def sp_saved_divisor(profile: str, tp: int, sequence_parallel: bool) -> int:
    """What sequence parallelism divides a column-parallel projection's saved input by. Megatron saves the
    sequence shard and all-gathers it again in backward (Korthikanti et al. 2022, sec. 4.2.2): / tp.
    torch's DTensor SequenceParallel -> ColwiseParallel saves the all-gathered input autograd sees: / 1
    (measured on the tiny Llama, TP2: the q/k/v, gate/up and lm_head inputs are saved full-sequence)."""
    return tp if sequence_parallel and profile == "megatron" else 1


class OutsideActivations(NamedTuple):
    """Bytes saved outside the decoder layers, for one micro-batch."""

    first_per_token: float  # on the stage holding the embedding
    last_per_token: float  # on the stage holding the final norm, lm_head and loss
    per_stage: float  # per micro-batch on every stage, whatever the batch size (rotary tables)
    last_constant: float  # the loss scalar
    loss_per_token: float = 0.0  # the part of last_per_token only the loss's backward reads (logits, labels)


def outside_layer_activations(spec: ModelSpec, profile: str, dtype_bytes: int, mask_bytes: int, seq_len: int,
                              sequence_parallel: int, linear_input_divisor: int, loss_divisor: int,
                              layers_checkpointed: bool) -> OutsideActivations:
    """Korthikanti et al. 2022, sec. 4.3: the embedding's dropout mask on the first stage; the final
    norm, the lm_head input and the fp32 logits (4·s·b·V, vocab-parallel: / tp) on the last. transformers
    also keeps the int64 input ids and labels, and each stage's rotary cos/sin (s x head_dim each)."""
    e, m, h = dtype_bytes, mask_bytes, spec.hidden_size
    hf = profile == "hf"
    first = (8 if hf else 0) + (m * h / sequence_parallel if spec.embedding_dropout else 0)
    # final norm (sequence-parallel; none after Qwen4's stream mixer: a hyper-connection model without final-norm
    # parameters), the streams' final collapse (as the norm), lm_head input, fp32 logits (vocab-parallel), labels
    final_norm = norm_bytes(spec, profile, e) if not (spec.hyper_streams and not spec.final_norm_params) else 0
    head, head_constant = hyper_head_activations(spec, e)
    last = ((final_norm + head) / sequence_parallel + e * h / linear_input_divisor
            + 4 * spec.vocab_size / loss_divisor + (8 if hf else 0))
    if hf and spec.learned_positions:
        per_stage = 8 * seq_len  # GPT-2's position ids (int64)
    elif hf and not layers_checkpointed:
        per_stage = 2 * seq_len * spec.head_dim * e  # rotary cos/sin, saved by the layers that use them
    else:
        per_stage = 0
    loss = 4 * spec.vocab_size / loss_divisor + (8 if hf else 0)
    return OutsideActivations(first, last, per_stage, (4 if hf else 0) + head_constant, loss)


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
    if schedule == "Interleaved1F1B":
        # the warm-up forwards plus the steady one (interleaved_warmup); each chunk is 1/v of the rank's layers
        # (Korthikanti et al. 2022: rank 0 holds L·(1+(p-1)/(p·v)))
        return min(interleaved_warmup(p, v, m, rank) + 1, m * v) / v
    if schedule in STAGED_SCHEDULES:
        moments = distinct_moments(schedule, p, v, m, rank)
        return max(sum(counts) for counts, _ in moments) / len(moments[0][0])
    raise ValueError(f"pp_schedule={schedule!r} is not a known schedule")


def interleaved_round(pp: int, microbatches: int) -> int:
    """Micro-batches an interleaved schedule runs through one local stage before the next: torch's
    microbatches_per_round = m // max(1, m // p); Megatron-LM's microbatch_group_size_per_vp_stage, p by default
    (the two agree where Megatron's rule m % p == 0 holds)."""
    return microbatches // max(1, microbatches // pp)


def interleaved_warmup(pp: int, virtual_stages: int, microbatches: int, rank: int) -> int:
    """Forwards interleaved 1F1B runs on `rank` before its first backward: (v-1)·round + 2·(p-1-r), capped at the
    m·v chunks of the step (Megatron-LM, core/pipeline_parallel/schedules.py get_pp_rank_microbatches; torch's
    ScheduleInterleaved1F1B warm-up)."""
    return min((virtual_stages - 1) * interleaved_round(pp, microbatches) + 2 * (pp - 1 - rank),
               microbatches * virtual_stages)


def interleaved_moments(pp: int, virtual_stages: int, microbatches: int,
                        rank: int) -> Tuple[Tuple[Tuple[int, ...], int], ...]:
    """The moments interleaved 1F1B's peak can fall on, for one rank, as split_backward_moments gives them: (chunks
    held by each local stage; chunks of the pipeline's last stage holding the loss). After the warm-up every step
    runs one forward, then one backward that frees a whole chunk (loss included); forward j runs local stage
    (j // round) % v, backward b local stage v-1-(b // round) % v (Megatron-LM's get_model_chunk_id, torch's
    forward_stage_index / backward_stage_index). The peak follows a forward: warm-up + 1 chunks, spread over the
    local stages in the order the rounds visit them, so a heavier first or last stage counts by its own chunks."""
    m, p, v, r = microbatches, pp, virtual_stages, rank
    per_round, warmup = interleaved_round(p, m), interleaved_warmup(p, v, m, r)
    counts, moments = [0] * v, []
    for j in range(m * v):
        counts[(j // per_round) % v] += 1
        moments.append((tuple(counts), counts[v - 1] if r == p - 1 else 0))
        if j >= warmup:
            counts[v - 1 - ((j - warmup) // per_round) % v] -= 1
    return tuple(moments)


def staged_moments(schedule: str, pp: int, virtual_stages: int, microbatches: int,
                   rank: int) -> Tuple[Tuple[Tuple[int, ...], int], ...]:
    """The replayed moments of a STAGED_SCHEDULES schedule."""
    if schedule == "Interleaved1F1B":
        return interleaved_moments(pp, virtual_stages, microbatches, rank)
    return split_backward_moments(schedule, pp, virtual_stages, microbatches, rank)


@lru_cache(maxsize=4096)
def distinct_moments(schedule: str, pp: int, virtual_stages: int, microbatches: int,
                     rank: int) -> Tuple[Tuple[Tuple[int, ...], int], ...]:
    """staged_moments without repeats, and without a moment another holds at least as much of everywhere: the
    peak is a maximum of non-negative weighings of them, which such a moment never sets. Memoised: a steady
    schedule repeats the same holdings once per micro-batch."""
    moments = tuple(dict.fromkeys(staged_moments(schedule, pp, virtual_stages, microbatches, rank)))
    # Visited by falling total, a moment's holders come before it (a distinct one holds more in all), and any
    # holder is itself held by a kept one: checking the kept ones alone is enough.
    kept: List[Tuple[Tuple[int, ...], int]] = []
    for moment in sorted(moments, key=lambda m: sum(m[0]) + m[1], reverse=True):
        if not any(_holds_at_least(other, moment) for other in kept):
            kept.append(moment)
    kept_set = set(kept)
    return tuple(moment for moment in moments if moment in kept_set)


def _holds_at_least(other: Tuple[Tuple[int, ...], int], moment: Tuple[Tuple[int, ...], int]) -> bool:
    """Whether `other` holds at least `moment`'s chunks of every local stage and its loss parts."""
    return other[1] >= moment[1] and all(a >= b for a, b in zip(other[0], moment[0]))


def split_backward_moments(schedule: str, pp: int, virtual_stages: int, microbatches: int,
                           rank: int) -> Tuple[Tuple[Tuple[int, ...], int], ...]:
    """The moments a split-backward schedule's peak can fall on, for one rank: (chunks held by each of
    its local stages, in rank_stages order; chunks of the pipeline's last stage still holding the loss).

    torch 2.13 (pipelining/_backward.py) runs the input pass with retain_graph=True, so it frees only
    what the loss alone reads (logits, labels: the graph above the stage output is detached); the
    weight pass then releases the rest of the micro-batch when its autograd graph is dropped. Stage 0
    skips the input pass and runs a full backward at W. A chunk is thus held from its F to its W (or
    full B), the loss part from F to I, and peaks follow an F. The orders are torch 2.13's:
    ZB-V (schedules.py, ScheduleZBVZeroBubble) peaks after its chunk-0 or chunk-1 forwards with
    (2p-r, r) or (2p-r-1, r+1) chunks (each capped at m); DualPipeV's overlapped F0B1 / F1B0 steps
    hold (2p-r, r+1), 2p+1 chunks where its paper counts whole micro-batches. InterleavedZeroBubble
    warms up (v-1)·per_round + p-1-r forwards, then per op runs F, I and, r ops late, W: replayed
    below by its stage-index arithmetic (forwards in rounds of per_round through the local stages,
    backwards in reverse stage order)."""
    m, p, v, r = microbatches, pp, virtual_stages, rank
    if schedule == "ZBVZeroBubble":
        holds_loss = r == 0  # the V puts the last stage on rank 0, as its second local stage
        return tuple(((min(2 * p - c1, m), min(c1, m)), int(holds_loss and c1 > r and c1 <= m))
                     for c1 in (r, r + 1))
    if schedule == "DualPipeV":
        return (((2 * p - r, r + 1), int(r == 0)),)
    if schedule != "InterleavedZeroBubble":
        raise ValueError(f"pp_schedule={schedule!r} does not split its backward")
    per_round = interleaved_round(p, m)
    warmup = min((v - 1) * per_round + p - 1 - r, m * v)
    loss_stage = v - 1 if r == p - 1 else -1

    def forward_stage(j):
        return (j // per_round) % v

    def backward_stage(b):
        return v - 1 - (b // per_round) % v

    counts, loss, moments = [0] * v, 0, []
    for j in range(m * v):
        counts[forward_stage(j)] += 1
        loss += forward_stage(j) == loss_stage
        moments.append((tuple(counts), loss))
        op = j - warmup  # steady op: this forward, input pass #op, weight pass #(op - r)
        if op >= 0:
            loss -= backward_stage(op) == loss_stage
            if op >= r:
                counts[backward_stage(op - r)] -= 1
    return tuple(moments)


class TokenActivations(NamedTuple):
    """Activation bytes per local token for one layout's kernels and TP / SP / CP split."""

    layer: float  # one decoder layer as kept for backward (after checkpointing)
    recompute: float  # one decoder layer rebuilt in backward (full checkpointing), else 0
    outside: Any  # harness.plan.activations.OutsideActivations


_TOKEN_ACTIVATIONS: Dict[tuple, Tuple[ModelSpec, TokenActivations]] = {}


def token_activations(spec: ModelSpec, profile: str, precision: str, on_cpu: bool, tp: int,
                      sequence_parallel: bool, loss_parallel: bool, checkpointing: str, seq_len: int,
                      cp: int) -> TokenActivations:
    """Per token: boundary / (tp if sequence parallel) + (sharded + quadratic x seq) / tp per layer
    (Korthikanti et al. 2022, sec. 4.2.2, TP + SP); selective recomputation drops the quadratic term
    (sec. 4.2.1) on Megatron, and keeps the matmul and attention outputs on the torch engines
    (op_policy_activations); full recomputation keeps only each layer's input (sec. 5) and rebuilds one layer."""
    key = (id(spec), profile, precision, on_cpu, tp, sequence_parallel, loss_parallel, checkpointing, seq_len, cp)
    hit = _TOKEN_ACTIVATIONS.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    e = COMPUTE_BYTES[precision]
    act = layer_activations(spec, profile, e, e if on_cpu else 1, on_cpu, seq_len)  # CPU dropout mask in dtype
    if profile == "megatron" and precision == "fp8":
        act = te_fp8_saved_inputs(spec, act, e, seq_len)
    sp = tp if sequence_parallel else 1
    ends = act.boundary / sp + act.linear_inputs / sp_saved_divisor(profile, tp, sequence_parallel)
    # Keys per query: the whole sequence (ring attention visits every key block; with CP the s^2 term
    # only exists for non-flash kernels, which validation rejects with cp > 1).
    full = ends + (act.sharded + act.quadratic * seq_len) / tp + act.mask * seq_len
    if checkpointing == "full":
        layer, recompute = act.checkpoint / sp, full
    elif checkpointing == "selective" and profile == "hf":
        # torch's op-level policy (op_policy_activations); the backward rebuilds the rest of one layer at a time
        replicated, sharded, per_key = op_policy_activations(spec, e, on_cpu)
        layer = act.checkpoint / sp + replicated + (sharded + per_key * seq_len) / tp
        recompute = max(0.0, full - layer)
    elif checkpointing == "selective":
        layer, recompute = ends + act.sharded / tp, 0.0
    else:
        layer, recompute = full, 0.0
    loss_divisor = tp if (profile == "megatron" or loss_parallel) else 1
    outside = outside_layer_activations(spec, profile, e, e if on_cpu else 1, seq_len // cp, sp,
                                        sp_saved_divisor(profile, tp, sequence_parallel), loss_divisor,
                                        checkpointing != "none")  # selective wraps the layers too
    result = TokenActivations(layer, recompute, outside)
    if len(_TOKEN_ACTIVATIONS) > 1_000_000:
        _TOKEN_ACTIVATIONS.clear()
    _TOKEN_ACTIVATIONS[key] = (spec, result)
    return result


def layout_token_activations(spec: ModelSpec, layout: Any, engine: Any, accelerator: str) -> TokenActivations:
    """token_activations for a layout on an engine (its kernels, sequence and loss parallelism)."""
    support = ENGINE_SUPPORT[engine.name]
    return token_activations(spec, support.activation_profile, layout.precision, accelerator == "cpu", layout.tp,
                             engine.sequence_parallel, engine.loss_parallel and support.tp_shards_vocab[1],
                             layout.activation_checkpointing, layout.seq_len, layout.cp)


def rank_activation_bytes(tok: TokenActivations, layout: Any, rank: int, layers: int, first: bool,
                          last: bool) -> Tuple[int, int]:
    """(activations a pipeline rank keeps at its peak, one layer rebuilt by full recomputation): the
    micro-batches in flight (sec. 4.2.3) x the rank's layers and outside-layer tensors."""
    tokens = layout.micro_batch * (layout.seq_len // layout.cp)
    out = tok.outside
    recompute = int(tokens * tok.recompute)
    if layout.pp > 1 and layout.pp_schedule in STAGED_SCHEDULES:
        return staged_bytes(tok, layout, rank, layers, tokens), recompute
    one_microbatch = (tokens * (layers * tok.layer + (out.first_per_token if first else 0)
                                + (out.last_per_token if last else 0))
                      + out.per_stage + (out.last_constant if last else 0))
    inflight = 1.0 if layout.pp == 1 else inflight_microbatches(layout.pp_schedule, layout.pp,
                                                                layout.pp_virtual_stages, layout.grad_accum, rank)
    return int(inflight * one_microbatch), recompute


def staged_bytes(tok: TokenActivations, layout: Any, rank: int, layers: int, tokens: int) -> int:
    """Peak over staged_moments of the chunks each local stage holds, each stage weighed by its own layers and
    outside-layer tensors; the loss part counts until the backward frees it (the input pass where it is split)."""
    p, v, out = layout.pp, layout.pp_virtual_stages, tok.outside
    stages = rank_stages(layout.pp_schedule, p, v, rank)
    explicit = list(layout.pp_stage_layers)
    chunk = []
    for stage in stages:
        stage_layers = explicit[stage] if explicit else layers / len(stages)
        per_token = (stage_layers * tok.layer + (out.first_per_token if stage == 0 else 0)
                     + (out.last_per_token - out.loss_per_token if stage == p * v - 1 else 0))
        chunk.append(tokens * per_token + out.per_stage)
    loss = tokens * out.loss_per_token + out.last_constant
    moments = distinct_moments(layout.pp_schedule, p, v, layout.grad_accum, rank)
    return int(max(sum(map(mul, counts, chunk)) + held * loss for counts, held in moments))
