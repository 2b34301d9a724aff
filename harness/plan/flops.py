"""Training FLOPs per token of a decoder-only transformer, under an explicit, named convention."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Tuple

from harness.config.schema import Checkpointing, FlopAttention, allowed
from harness.plan.model_spec import ModelSpec

ATTENTION_CONVENTIONS = allowed(FlopAttention)
CHECKPOINTING = allowed(Checkpointing)


@dataclass(frozen=True)
class FlopConvention:
    """How model FLOPs are counted; its `name` is stored next to every MFU the harness reports.

    attention: "full" counts the whole T x T score matrix (PaLM appendix B, torchtitan); "causal"
    counts the half a causal mask keeps (Kaplan et al. 2020 table 1, FlashAttention's benchmarks).
    include_lm_head: count the output projection h x V (Megatron, PaLM) or leave it out (Kaplan).
    """

    attention: str = "causal"
    include_lm_head: bool = True
    # e.g. "6N+6LHQT:attn=causal:lm_head"; derived from the two fields above, never set by hand.
    name: str = field(init=False, default="")

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_CONVENTIONS:
            raise ValueError(f"attention={self.attention!r} must be one of {ATTENTION_CONVENTIONS}")
        factor = "12" if self.attention == "full" else "6"
        head = "lm_head" if self.include_lm_head else "no_lm_head"
        object.__setattr__(self, "name", f"6N+{factor}LHQT:attn={self.attention}:{head}")


class ForwardFlops(NamedTuple):
    """Forward FLOPs of one token, split by what recomputation can repeat."""

    layers: float  # weights of the decoder layers a token touches (k experts + router for MoE)
    attention_core: float  # the token mixers' own products, no weights: QK^T and AV, or a selective scan
    outside_layers: float  # final norm and, by convention, the lm_head
    forward_only: float = 0.0  # work with no backward: modules run under no_grad (a sparse-attention indexer)
    backward_excess: float = 0.0  # what the mixers' backward spends beyond twice their forward (delta rule,
    # lightning attention): negative where the autograd graph skips products
    no_grad_runs: float = 0.0  # layer runs under no_grad (HRM's L stack): forward once, never recomputed


def keys_per_query(seq_len: int, window: int, attention: str, chunk: int = 0) -> float:
    """Keys one query is scored against, averaged over a sequence of `seq_len` tokens.

    full: every key the window admits, min(T, w) (w = 0: no window, T). causal: query i sees
    min(i, w) earlier keys; averaged over T queries (continuous limit) that is T/2 without a window
    (Kaplan et al. 2020) and w - w^2 / (2T) for a sliding window w < T (Beltagy et al. 2020's local
    attention, as in Mistral and Gemma 2/3's local layers), equal to T/2 at w = T.
    Chunked attention (Llama 4's local layers) cuts the sequence into chunks of C tokens, T = nC + r, and a
    query sees only its own chunk: full counts each chunk's whole block, (n·C² + r²) / T keys per query
    (T when C >= T), causal half of it (T/2 when C >= T, as without a window).
    """
    if chunk > 0:
        n, r = divmod(seq_len, chunk)
        block = (n * chunk * chunk + r * r) / seq_len
        return block / 2 if attention == "causal" else block
    if window <= 0 or window >= seq_len:
        return seq_len / 2 if attention == "causal" else float(seq_len)
    return window - window * window / (2 * seq_len) if attention == "causal" else float(window)


def forward_flops_per_token(spec: ModelSpec, seq_len: int, convention: FlopConvention) -> ForwardFlops:
    """Forward FLOPs of one token in a sequence of `seq_len` tokens.

    Weights: a token multiplies each weight it touches once and adds once, 2 FLOPs per parameter
    (Kaplan et al. 2020, table 1: C_forward ~ 2N). GQA, multi-latent attention's low-rank
    projections, gated vs two-matrix MLPs, biases, shared and k routed experts are all inside the
    exact per-layer active parameter counts; norms and biases are O(h), counted like weights as 6N
    does. Embedding lookups are gathers, not FLOPs; a tied lm_head still is a matmul (h x V).
    Elementwise work (logit soft-capping, embedding scaling, activations) is not counted.
    Attention core: per softmax-attention layer and query token, QK^T dots a query of a heads of
    dim d_qk with each key (2·a·d_qk per key) and AV sums the values (2·a·d_v per key): with
    d_qk = d_v = d and T keys that is 4·H·Q·T in PaLM's letters (appendix B). Keys per query follow
    the layer's window (keys_per_query), times the layer's attentions (LongCat-Flash's two halves a layer); heads
    and dims the layer's own (ModelSpec.attention_shapes: Gemma 4's global layers, Inkling's sliding and full ones
    differ). Parameters run on the embeddings before the first layer (ModelSpec.input_params: Gemma 4's and 3n's
    per-layer-input projection, Gemma 3n's AltUp stream projections) and after the last one (final_norm_params:
    Gemma 3n's AltUp unembedding) count 2 per token like weights.
    Forward-only work (a sparse-attention indexer, whose pick reaches the loss only as a mask): 2 FLOPs per
    indexer parameter and its scores (indexer_flops_per_token) in each layer with an indexer of its own.
    Compressed attention (DeepSeek-V4's CSA / HCA layers): a query scores its compressed entries beside the
    sliding window's keys (compressed_keys_per_query), at the layer's heads and dims; the compressor's projections
    are weights, its position biases are not (compressor_flops), and a CSA layer's indexer scores the compressed
    entries forward only (indexer_flops_per_token).
    Hyper-connections (DeepSeek-V4, HY-V4, Qwen4): their projections are weights like any other (the streams'
    final collapse outside the layers with the final norm); DeepSeek-V4's comb^T times the N streams adds
    2·N²·h per hyper-connection (layer_stream_mixing), and its backward is twice that (both factors carry a
    gradient), as for weights.
    Weight-shared stacks run several times a forward (HRM): each run counts, its no_grad runs forward only
    (weight_shared_runs).
    Inkling 2: its dynamic short convolutions' elementwise contraction (dynamic_conv_flops) and its block attention
    residuals' QK^T and AV over the stacked block states (block_residual_flops; final_input's with the final norm).
    """
    forward_only = 2.0 * spec.decoder_forward_only_params
    layers = (2.0 * (spec.decoder_active_params - sum(spec.layer_scan_states)) - forward_only
              + 2.0 * sum(spec.layer_stream_mixing) + altup_flops(spec))
    layers += relative_bias_flops(spec) + dynamic_conv_flops(spec)
    residuals = block_residual_flops(spec)
    layers += residuals[0]
    compressor = compressor_flops(spec, seq_len)
    layers, forward_only = layers + compressor[0], forward_only + compressor[1]
    per_layer_attention = attention_flops_per_layer(spec, seq_len, convention)
    attention = sum(per_layer_attention)
    attention += mixer_flops_per_token(spec, seq_len)
    forward_only += indexer_flops_per_token(spec, seq_len, convention) * spec.indexer_layers
    head = spec.vocab_size * spec.hidden_size if convention.include_lm_head else 0
    excess = (delta_rule_flops(spec, seq_len)[1] + kimi_delta_rule_flops(spec, seq_len)[1]
              + lightning_flops(spec, seq_len)[1] + compressor[2])
    outside = 2.0 * (spec.input_params + spec.final_norm_params + spec.hyper_connection_params + head) + residuals[1]
    runs = weight_shared_runs(spec, per_layer_attention)
    return ForwardFlops(layers + runs[0], attention + runs[1], outside, forward_only, excess, runs[2])


def attention_flops_per_layer(spec: ModelSpec, seq_len: int, convention: FlopConvention) -> Tuple[float, ...]:
    """Per decoder layer, the forward FLOPs of one token's QK^T and AV (forward_flops_per_token's attention core
    before the non-attention mixers): 2·a·(d_qk + d_v) per key and attention, 0 for a layer of another mixer."""
    n = len(spec.attention_windows)
    chunks = spec.attention_chunks or (0,) * n
    mixers = spec.layer_mixers or ("attention",) * n
    compression = spec.attention_compression or (0,) * n
    indexed = spec.attention_indexed if spec.attention_compression else (False,) * n  # CSA layers cap their entries
    return tuple(
        spec.attention_sublayers * 2.0 * heads * (qk + v) * (
            keys_per_query(seq_len, window, convention.attention, chunk)
            + compressed_keys_per_query(seq_len, rate, spec.compressed_topk if picked else 0, convention.attention))
        if mixer == "attention" else 0.0
        for window, chunk, mixer, rate, picked, (heads, _, qk, v) in zip(
            spec.attention_windows, chunks, mixers, compression, indexed, spec.attention_shapes(), strict=True))


def weight_shared_runs(spec: ModelSpec, per_layer_attention: Tuple[float, ...]) -> Tuple[float, float, float]:
    """(weights, attention core, no_grad) forward FLOPs per token that layers run more than once add to one run
    with gradient per layer (HRM's weight-shared H and L stacks, ModelSpec.layer_runs); zeros where each layer runs
    once.

    A run of layer i multiplies the token by each of its weights once, W_i = 2·(active parameters of i), and scores
    its keys, A_i (attention_flops_per_layer): the same work whichever run it is, since the runs share the weights
    and see the same sequence. The layer's g_i runs with gradient each have a backward of twice their forward (the
    input of every run carries a gradient: it sums the embeddings', which do); the n_i runs under no_grad have
    none. The base count holds one run with gradient, so the runs add (g_i - 1)·W_i to the weights, (g_i - 1)·A_i
    to the attention core (both 3x: forward + backward) and n_i·(W_i + A_i) forward only. What joins the runs is
    elementwise: HRM's input injection (z_L + z_H, z_H + z_L), its stacks' parameter-free final norms, the
    embedding scale and attention's sigmoid gate. The no_grad runs are kept apart from forward_only: full
    recomputation re-runs each checkpointed run with gradient, never a no_grad one (it saved nothing)."""
    if not spec.layer_runs:
        return 0.0, 0.0, 0.0
    weights = [2.0 * active for active in spec.layer_active_params]
    runs = spec.layer_runs
    return (sum((g - 1) * w for (g, _), w in zip(runs, weights, strict=True)),
            sum((g - 1) * a for (g, _), a in zip(runs, per_layer_attention, strict=True)),
            sum(n * (w + a) for (_, n), w, a in zip(runs, weights, per_layer_attention, strict=True)))


def compressed_keys_per_query(seq_len: int, rate: int, topk: int, attention: str) -> float:
    """Compressed entries one query attends beside its sliding window (DeepSeek-V4's compressed attention: rate
    m > 0; 0 adds none), averaged over a sequence of T = q·m + r tokens.

    The compressor closes a window every m tokens and emits one entry for it (HCA: its m tokens; CSA: its m tokens'
    second series and the previous window's first, stride m), q = floor(T / m) entries; entry w holds tokens up to
    (w + 1)·m - 1, so the query at position t (0-based) sees the floor((t + 1) / m) entries whose window is complete
    (transformers' block bias). A CSA layer's indexer keeps at most k = topk of them (k = 0: no cap).
    full: every entry, min(q, k) per query (the whole score matrix over the entries, as "full" counts T keys).
    causal: sum_{t=1..T} min(floor(t / m), k) / T, exactly: uncapped, each j < q is floor(t / m) for m values of t
    (j = 0 for m - 1) and q for r + 1, m·q(q - 1)/2 + q(r + 1); capped at k <= q, the t < k·m give m·k(k - 1)/2 and
    the T - k·m + 1 others k each.
    """
    if rate <= 0:
        return 0.0
    q, r = divmod(seq_len, rate)
    if attention != "causal":
        return float(min(q, topk) if topk else q)
    if topk and q >= topk:
        return (rate * topk * (topk - 1) / 2 + topk * (seq_len - topk * rate + 1)) / seq_len
    return (rate * q * (q - 1) / 2 + q * (r + 1)) / seq_len


def compressor_flops(spec: ModelSpec, seq_len: int) -> Tuple[float, float, float]:
    """(trained, forward-only, backward beyond twice the forward) FLOPs per token the compressors of DeepSeek-V4's
    compressed attention layers add to the 2-per-parameter weight count (transformers' DeepseekV4HCACompressor /
    CSACompressor and the CSA indexer's own compressor), corrections <= 0.

    Per token, the compressor projects the layer input to its entries' values C = H·W_KV and gate scores
    Z = H·W_Z (HCA: d wide; CSA: 2d, two overlapping series): weights, 2 FLOPs per parameter, already counted.
    Each entry is then the gated pooling sum_j softmax_j(Z_j + B) ⊙ C_j over its window's slots: the position
    bias B (m x d, or m x 2d) is added to the scores, the softmax runs per channel over the window, and the
    pooling multiplies and sums per channel: all elementwise (as QSA's mean pooling), so none of it is counted and
    B's parameters, a matrix no token multiplies, leave the weight count: -2 per parameter, in the trained
    compressor and (forward only) in the indexer's. The kv norm and rotary of the entries are elementwise too.
    A sequence shorter than m closes no window: the projections' outputs feed nothing and the backward skips their
    input and weight gradients, -4 per projection weight (the partial window's tokens beyond the last complete one
    are still in the projections' matmuls, and so in their gradients)."""
    rates = spec.attention_compression or (0,) * len(spec.layer_compressors)
    trained = -2.0 * sum(biases for _, biases, _ in spec.layer_compressors)
    forward_only = -2.0 * sum(biases for _, _, biases in spec.layer_compressors)
    unused = -4.0 * sum(weights for (weights, _, _), m in zip(spec.layer_compressors, rates, strict=True)
                        if seq_len < m)
    return trained, forward_only, unused


def relative_bias_flops(spec: ModelSpec) -> float:
    """Forward FLOPs per token a relative-position bank spends beyond the 2 per parameter of the weight count.

    Inkling's rel_logits_proj multiplies each head's d_rel relative states by the d_rel x E bank (E backward
    distances: one bias per query and distance, gathered into the scores), 2·a·d_rel·E per token and layer of
    a heads, where the weight count has 2·d_rel·E; its backward (the states' and the bank's gradients) is twice
    the forward, as the 3x convention has it."""
    heads = [shape[0] for shape in spec.attention_shapes()] if spec.layer_relative_banks else []
    return 2.0 * sum((a - 1) * bank for a, bank in zip(heads, spec.layer_relative_banks, strict=True))


def dynamic_conv_flops(spec: ModelSpec) -> float:
    """Forward FLOPs per token of Inkling 2's dynamic short convolutions beyond the 2 per parameter of the weight
    count (transformers' Inkling2DynamicShortConvolution, keys and values of the full-attention layers).

    Each output channel c of the C = kv heads x head dim sums its K taps over the token's window of the last K
    inputs, with taps w = static_weight (K x C) + the token's dynamic taps (weight_proj of the layer input, one set
    of K per kv head, shared by the head's channels): (windows * w).sum(-1), C·K products summed, 2·C·K per token
    (a contraction, as a matmul of the same pairs counts; the left zero padding adds no outputs). weight_proj is a
    weight (counted); the static taps are a matrix no token multiplies (they are added to the dynamic ones
    elementwise): their C·K parameters leave the weight count, -2·C·K. Net 2·C·K - 2·C·K per convolution.
    Backward, as autograd runs it: the product's gradient reaches the taps' two terms each by one more contraction
    (summed over the head's channels for the dynamic taps, over the tokens for the static ones, 2·C·K each), the
    windows theirs elementwise: twice the forward, as the 3x convention has it."""
    return sum(2.0 * taps - 2.0 * taps for taps in spec.layer_dynamic_convs)


def block_residual_flops(spec: ModelSpec) -> Tuple[float, float]:
    """(in the layers, after the last one) forward FLOPs per token of Inkling 2's block attention residuals
    (transformers' Inkling2BlockAttentionResidual: attention_input, mlp_input, final_input).

    A residual's q learned queries (1, or 3 for a full layer's q, k and v inputs) attend over its N entries (the
    stacked block states and the partial one, ModelSpec.layer_block_residuals / final_block_residual), each of the
    hidden size h, RMS-normed (elementwise): QK^T 2·q·N·h and the softmax-weighted sum AV 2·q·N·h, 4·q·N·h per
    token. The queries' q·h parameters are an operand of QK^T (counted there), not a weight a token multiplies
    besides: they leave the 2-per-parameter count, -2·q·h. Backward: the queries, the entries and the weights each
    get their gradient (dO·V^T, P^T·dO, dS·K, dS^T·Q), twice the forward; the fused kernels' recomputation of
    the scores is recomputation, not counted here."""
    def flops(queries: int, entries: int) -> float:
        return 4.0 * queries * entries * spec.hidden_size - 2.0 * queries * spec.hidden_size

    layers = sum(flops(q, n) for residuals in spec.layer_block_residuals for q, n in residuals)
    return layers, (flops(*spec.final_block_residual) if spec.final_block_residual else 0.0)


def indexer_flops_per_token(spec: ModelSpec, seq_len: int, convention: FlopConvention) -> float:
    """Forward FLOPs of one token in one layer's sparse-attention indexer scores (no weights; run forward only).

    DeepSeek Sparse Attention (DeepSeek-V3.2 report, eq. 1: I_ts = sum_j w_tj ReLU(q_tj · k_s)): per earlier
    key, q·k over the H_I heads of dim d_I (2·H_I·d_I) then the head-weighted sum (2·H_I).
    Qwen4's QSA (Qwen4ExpTextQSAIndexer): query t scores only the complete blocks of c keys among its t + 1
    visible ones, each block's keys mean-pooled first (elementwise), floor((t + 1) / c) pooled keys, 2·H_I·d_I
    each (the ReLU'd head sum is elementwise): sum_{t=1..T} floor(t / c) = c·q(q - 1)/2 + q(r + 1) for
    T = qc + r, / T per token, whatever the convention (the blocks scored are the causal ones).
    DeepSeek-V4's CSA indexer (DeepseekV4IndexerScorer) scores the layer's compressed entries, pooled by its own
    compressor (d_I wide) from the same m-token windows: q_t·K^IComp_s over H_I heads of d_I per entry (2·H_I·d_I),
    the ReLU'd scores then weighted and summed over the heads elementwise (not a matmul: not counted). Entries per
    query: compressed_keys_per_query without a cap (the indexer scores every entry, its top-k comes after).
    """
    rates = [m for m, picked in zip(spec.attention_compression, spec.attention_indexed) if m and picked]
    if rates:
        return 2.0 * spec.indexer_heads * spec.indexer_head_dim * compressed_keys_per_query(
            seq_len, max(rates), 0, convention.attention)
    if spec.indexer_block:
        q, r = divmod(seq_len, spec.indexer_block)
        blocks = spec.indexer_block * q * (q - 1) // 2 + q * (r + 1)
        return 2.0 * spec.indexer_heads * spec.indexer_head_dim * blocks / seq_len
    return 2.0 * spec.indexer_heads * (spec.indexer_head_dim + 1) * keys_per_query(seq_len, 0, convention.attention)


def altup_flops(spec: ModelSpec) -> float:
    """Forward FLOPs per token of Gemma 3n's AltUp beyond its weights (Baykal et al. 2023; transformers'
    Gemma3nTextAltUp). Per layer of n streams and hidden size h: predict mixes the n streams with the token's own
    n x n coefficients, a (h x n)·(n x n) product, 2·h·n²; correct runs the modality router (h x n) again on the
    layer's output, 2·h·n more than its weights' one use. Every operand carries a gradient: the backward is
    twice this. (The stream projections outside the layers are weights: input_params, final_norm_params.)"""
    return sum(2.0 * spec.hidden_size * n * (n + 1) for n in spec.layer_altup_streams)


def mixer_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of one token in the non-attention mixers' own products (no weights).

    Selective scan (Mamba-1, Gu & Dao 2023, alg. 2): h_t = exp(Δ_t·A) ⊙ h_{t-1} + Δ_t·B_t·x_t is elementwise
    over the d_inner x N state (A is used elementwise, so its d_inner·N parameters are not a weight matmul
    and leave the 2N count); y_t = C_t · h_t is one product per channel over the N states, 2·d_inner·N
    FLOPs (transformers' torch fallback, mamba_selective_scan: a matmul of the state with C_t per step).
    Causal depthwise convolution (C channels, K taps): its weights are counted as weights (2·C·K per token),
    but transformers' causal_conv1d_fn pads K - 1 positions on the left and computes T + K - 1 outputs
    before dropping the extra ones: 2·C·K·(K - 1) more per sequence, / T per token. LFM2's short convolution
    (Lfm2ShortConv: B, C, x = in_proj(h); out_proj(C ⊙ conv(B ⊙ x))) is such a convolution between elementwise
    gates: its weights and this padding are all its products.
    """
    scans = 2.0 * sum(spec.layer_scan_states)
    padding = 2.0 * sum(spec.layer_conv_padding) / seq_len
    return (scans + padding + delta_rule_flops(spec, seq_len)[0] + kimi_delta_rule_flops(spec, seq_len)[0]
            + ssd_flops(spec, seq_len) + lightning_flops(spec, seq_len)[0])


def lightning_flops(spec: ModelSpec, seq_len: int) -> Tuple[float, float]:
    """(forward, backward beyond twice the forward) FLOPs per token of the lightning attention layers' own
    products, as transformers' MiniMaxLightningAttention runs them (Qin et al. 2024: blocks of B tokens, the
    last one shorter, no padding). Per head of dim d and block of b tokens: Q·K^T and the decayed scores times
    V within the block (2 x 2b²d), Q times the state of the earlier blocks and the block's K^T·V into the
    next state (2 x 2b·d²). The backward skips what needs no gradient: the first block's state is zeros
    (2b·d², Q·S's state side) and the last block's K^T·V feeds nothing (2 x 2b·d²)."""
    layers = sum(mixer == "lightning_attention" for mixer in spec.layer_mixers)
    if not layers:
        return 0.0, 0.0
    block, d = spec.lightning_block, spec.head_dim
    full, rest = divmod(seq_len, block)
    sizes = [block] * full + ([rest] if rest else [])
    forward = sum(4 * b * b * d + 4 * b * d * d for b in sizes)
    excess = -(2 * sizes[0] * d * d + 4 * sizes[-1] * d * d)
    per_token = layers * spec.num_heads / seq_len
    return forward * per_token, excess * per_token


def ssd_flops(spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the Mamba-2 layers' own products, as transformers' torch fallback
    (mamba2_chunk_scan, Dao & Gu 2024's chunked state space duality) runs them: per head (B and C repeated
    from their groups), head dim p, state N, the sequence padded to n = ceil(T / L) chunks of L tokens:
    C·B^T within each chunk (2L²N) and its masked scores times x (2L²p); each chunk's final state B^T·x
    (2L·N·p); the state passing between chunks over n + 1 states (the zero initial one first), a (n+1) x
    (n+1) product with p·N columns (2(n+1)²·p·N); and C times each chunk's start state (2L·N·p). Every
    operand carries a gradient, so the backward is twice this, as the 3x convention has it."""
    layers = sum(mixer == "state_space_duality" for mixer in spec.layer_mixers)
    if not layers:
        return 0.0
    chunk, p, state = spec.ssd_chunk, spec.ssd_head_dim, spec.ssd_state_size
    n = -(-seq_len // chunk)
    per_head = (2 * n * chunk * chunk * (state + p) + 4 * n * chunk * state * p
                + 2 * (n + 1) * (n + 1) * p * state)
    return per_head * layers * spec.ssd_heads / seq_len


DELTA_RULE_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule: chunk_size's default, which its callers keep


def delta_rule_flops(spec: ModelSpec, seq_len: int) -> Tuple[float, float]:
    """(forward, backward beyond twice the forward) FLOPs per token of the Gated DeltaNet layers' own products,
    as transformers' torch_chunk_gated_delta_rule runs them (Yang et al. 2024's chunkwise form, WY / UT
    transform). Per value head (queries and keys repeated to it), head dims dk and dv, the sequence padded to
    n = ceil(T / C) chunks of C = 64:
      forward, per chunk: K_beta·K^T and Q·K^T (C x dk x C, 2·2C²dk); two unit-lower-triangular solves of the
      C x C system for V_beta and the decayed K_beta (C(C-1) per column: C(C-1)(dv + dk)); the state read and
      update, K_cumdecay·S, Q·S, K^T·V_new (3 x 2C·dk·dv) and the intra-chunk A·V_new (2C²dv).
      backward, beyond twice that: each solve's gradient is one more solve (its forward) plus a C x C product
      for the system's gradient (2C²·m), C(C+1)(dk + dv) per chunk in all; less the products the autograd graph
      never runs: the zero initial state needs no gradient (2 x 2C·dk·dv) and the final state update feeds
      nothing (2 x 2C·dk·dv), 8C·dk·dv per sequence."""
    layers = sum(mixer == "gated_delta_rule" for mixer in spec.layer_mixers)
    if not layers:
        return 0.0, 0.0
    c, dk, dv = DELTA_RULE_CHUNK, spec.delta_rule_key_dim, spec.delta_rule_value_dim
    n = -(-seq_len // c)
    forward = n * (4 * c * c * dk + 2 * c * c * dv + 6 * c * dk * dv + c * (c - 1) * (dk + dv))
    excess = n * c * (c + 1) * (dk + dv) - 8 * c * dk * dv
    per_token = layers * spec.delta_rule_heads / seq_len
    return forward * per_token, excess * per_token


def kimi_delta_rule_flops(spec: ModelSpec, seq_len: int) -> Tuple[float, float]:
    """(forward, backward beyond twice the forward) FLOPs per token of the Kimi delta attention layers' own
    products, as transformers' torch fallback chunk_kimi_delta_attention runs them (Gated DeltaNet's chunkwise
    form with a decay per key channel, so that the decayed q·k and k·k scores are built elementwise: a product
    broadcast over (i, j, channel), then summed over the d channels; matmul-class work, C x d x C, that the
    fused kernels run as GEMMs, counted as a matmul of the same pairs would be). Per head, dk = dv = d, the
    sequence padded to n = ceil(T / C) chunks of C = 64:
      forward, per chunk: the decayed K_beta·K^T and Q·K^T scores (2 x 2C²d); the inverse of the unit lower-
      triangular C x C system built row by row, row i (1 <= i < C) an elementwise i x i vector-matrix product
      summed over i (2i² each: sum 2i² = (C-1)C(2C-1)/3); its products with V_beta and the decayed K_beta
      (2C²d each); the state read, Q·S and K_cumdecay·S, and update K^T·V_new (3 x 2C·d²); the intra-chunk
      scores times V_new (2C²d).
      backward, beyond twice that: a score's two factors each get their gradient by one more contraction over
      the other (twice the forward, as for a matmul); each row of the inverse only once (its gradient's
      contraction; the rows above it get theirs elementwise, a product with no sum) and the first row's 1 x 1
      product not even that: (C-1)C(2C-1)/3 + 2 fewer per chunk; and, as for Gated DeltaNet, the zero initial
      state needs no gradient and the final state update feeds nothing, 8C·d² fewer per sequence."""
    layers = sum(mixer == "kimi_delta_rule" for mixer in spec.layer_mixers)
    if not layers:
        return 0.0, 0.0
    c, d = DELTA_RULE_CHUNK, spec.delta_rule_key_dim
    n = -(-seq_len // c)
    rows = (c - 1) * c * (2 * c - 1) // 3
    forward = n * (10 * c * c * d + 6 * c * d * d + rows)
    excess = -n * (rows + 2) - 8 * c * d * d
    per_token = layers * spec.delta_rule_heads / seq_len
    return forward * per_token, excess * per_token


def flops_per_token(spec: ModelSpec, seq_len: int, convention: FlopConvention) -> float:
    """Model FLOPs of one training token: forward + backward, the backward costing twice the forward
    (a gradient for the input and one for the weight): 3 x forward, i.e. 6N + 12LHQT (PaLM appendix B)
    with the full convention, 6N + 6LHQT with the causal one; forward-only work once (no_grad layer runs too).
    Recomputation is never counted here."""
    forward = forward_flops_per_token(spec, seq_len, convention)
    return (3.0 * (forward.layers + forward.attention_core + forward.outside_layers) + forward.forward_only
            + forward.no_grad_runs + forward.backward_excess)


def recompute_flops_per_token(
    spec: ModelSpec, seq_len: int, convention: FlopConvention, checkpointing: str, profile: str = "megatron"
) -> float:
    """Extra forward FLOPs activation checkpointing spends (HFU counts them, MFU does not).

    full: every checkpointed decoder layer runs its forward again in the backward (Korthikanti et al.
    2022, sec. 5: 4 passes instead of 3; a forward-only indexer runs again too; a weight-shared layer's runs with
    gradient each run again, its no_grad runs not); selective: only the
    attention core (QK^T, softmax, AV) is recomputed (Korthikanti et al. 2022, sec. 4.2) on Megatron (`profile`
    "megatron"); the torch engines' op-level policy ("hf", harness.plan.activations.op_policy_activations) keeps
    every matmul and attention output and reruns elementwise work only, which no convention counts. Embedding,
    final norm and lm_head are not recomputed.
    """
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"activation_checkpointing={checkpointing!r} must be one of {CHECKPOINTING}")
    if checkpointing == "none":
        return 0.0
    forward = forward_flops_per_token(spec, seq_len, convention)
    if checkpointing == "selective":
        return forward.attention_core if profile == "megatron" else 0.0
    return forward.layers + forward.attention_core + forward.forward_only
