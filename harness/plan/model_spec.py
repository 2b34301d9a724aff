"""The shape of a decoder-only transformer, derived from transformers' own model, with exact parameter counts."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from harness.config.model_shape import HYPER_CONNECTION_OUTSIDE, OTHER_MODALITY, model_shape


class ParamTensor(NamedTuple):
    """One parameter tensor as transformers allocates it, and the dim tensor parallelism splits."""

    shape: Tuple[int, ...]
    tp_dim: Optional[int]  # None: replicated across the TP group
    expert: bool = False  # dim 0 indexes experts (split by expert parallelism)
    trained: bool = True  # False: run forward only, never given a gradient (FORWARD_ONLY)
    linear: bool = False  # an nn.Linear module's weight: what torchao's float8 training converts


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only model: its shape and its parameter counts (counted as transformers builds it)."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # transformers' head_dim (the rotary dim of multi-latent attention)
    ffn_size: int  # intermediate size of the dense MLP, or of one routed expert
    vocab_size: int
    max_positions: int
    tied_embeddings: bool
    mlp_kind: str  # "swiglu" (gated: gate, up, down) or "gelu" (two matrices)
    num_experts: int  # routed experts; 0 for a dense model
    experts_per_token: int  # 0 for a dense model
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    norm_kind: str  # "rmsnorm" (weight) or "layernorm" (weight + bias)
    qk_norm: bool  # per-head norm on q and k (qwen3, olmo2, gemma3)
    learned_positions: int  # rows of a learned position table (gpt2), else 0
    attention_dropout: float
    hidden_dropout: float  # dropout on the residual branches
    embedding_dropout: float
    activation: str  # hidden_act / activation_function
    attn_implementation: str  # "sdpa" (transformers' default), "eager" or "flash_attention_2"
    # Parameter counts; per-layer figures are for the most common decoder layer.
    attention_params: int  # the attention block with its biases and q/k norms
    expert_params: int  # one routed expert (MoE) or the whole MLP (dense)
    router_params: int
    norm_params: int  # the norms of one layer outside attention
    layer_params: int
    active_layer_params: int  # touched by one token: attention, norms, router, shared + k routed experts
    embedding_params: int  # token (+ position) tables; a tied lm_head is counted here
    lm_head_params: int  # 0 when tied
    final_norm_params: int  # the final norm alone (hyper_connection_params apart)
    total_params: int
    non_embedding_params: int  # total - embedding (an untied lm_head stays in)
    active_params: int  # parameters one token touches (total for a dense model)
    # Per decoder layer, in order: what differs between layers (dense-first MoE, local/global attention).
    layer_total_params: Tuple[int, ...] = ()
    layer_active_params: Tuple[int, ...] = ()
    attention_windows: Tuple[int, ...] = ()  # keys a query may see: 0 all earlier keys, w a sliding window
    attention_chunks: Tuple[int, ...] = ()  # 0, or C: a query sees only the keys of its own C-token chunk
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): per layer, whether a lightning indexer scores every
    # earlier key (indexer_heads heads of indexer_head_dim) to pick the index_topk keys attention sees.
    attention_indexed: Tuple[bool, ...] = ()
    indexer_heads: int = 0
    indexer_head_dim: int = 0
    indexer_layers: int = 0  # indexed layers that run their own indexer (HY-V4's "shared" layers reuse one)
    indexer_block: int = 0  # Qwen4's QSA indexer: it scores keys mean-pooled in blocks of this many tokens
    # Compressed attention (DeepSeek-V4's CSA / HCA): per layer, m where a compressor pools the layer's keys from
    # windows of m tokens into one entry each, attended beside the sliding window (0: none); empty when no layer
    # has one. compressed_topk: the compressed entries an indexed (CSA) layer's indexer keeps per query.
    attention_compression: Tuple[int, ...] = ()
    compressed_topk: int = 0
    # Per layer with a compressor: (its projections' weights, the trained and the forward-only parameters of the
    # position-bias tables added elementwise to a compressor's gate scores: its own, its indexer's), the last two
    # parameters no token multiplies as a weight; empty when no layer has a compressor.
    layer_compressors: Tuple[Tuple[int, int, int], ...] = ()
    # Hyper-connections (DeepSeek-V4, HY-V4, Qwen4): the residual is hyper_streams streams of hidden_size; each
    # sub-layer collapses them into its input and spreads its output back through small learned mixing weights.
    hyper_streams: int = 0
    hyper_connection_params: int = 0  # outside the layers, on the last stage: the streams' final collapse
    # Per layer: multiply-adds per token of the stream-mixing products (DeepSeek-V4's N x N `comb` times the N
    # streams, N²·h per hyper-connection), products of two activations, not weights.
    layer_stream_mixing: Tuple[int, ...] = ()
    # What the hyper-connections save: their modules per layer (attention's and the MLP's), their form -
    # "pre_post" (HY-V4: sigmoid pre and post weights from one projection of the N·h streams), "sinkhorn"
    # (DeepSeek-V4: pre, post and an N x N comb made doubly stochastic by hyper_sinkhorn_iterations rounds of
    # Sinkhorn-Knopp) or "gated" (Qwen4: a gated residual whose per-channel mix goes through a rank
    # hyper_connection_rank bottleneck) - and those sizes.
    hyper_connections: int = 0
    hyper_connection_form: str = ""
    hyper_connection_rank: int = 0
    hyper_sinkhorn_iterations: int = 0
    layer_forward_only_params: Tuple[int, ...] = ()  # per layer: parameters of FORWARD_ONLY modules
    # Per layer, the token mixer: "attention" (softmax attention of the layer's window / chunk),
    # "selective_scan" (Mamba-1, Gu & Dao 2023: a state of d_inner x N per token, no keys) or
    # "gated_delta_rule" (Gated DeltaNet, Yang et al. 2024: a dk x dv state per value head, updated by the
    # delta rule in chunks), "state_space_duality" (Mamba-2, Dao & Gu 2024: a p x N state per head, scanned in
    # chunks), "kimi_delta_rule" (Kimi delta attention, Kimi Linear 2025: Gated DeltaNet with a decay per key
    # channel instead of per head), "lightning_attention" (MiniMax-01, Qin et al. 2024: linear attention in
    # blocks, a d x d state per head), "short_conv" (LFM2: x gated by B, a causal depthwise convolution of K
    # taps, gated by C; its only products are its weights') or "none" (an MLP-only layer, Nemotron-H's); these
    # three stay empty when every layer is softmax attention.
    layer_mixers: Tuple[str, ...] = ()
    layer_scan_states: Tuple[int, ...] = ()  # per layer: d_inner·N of its selective scan (its A), else 0
    # Per layer: multiply-adds per sequence a causal depthwise convolution of C channels and K taps spends on
    # the K - 1 outputs its left padding adds and transformers then drops, C·K·(K - 1).
    layer_conv_padding: Tuple[int, ...] = ()
    # Gated DeltaNet layers: value heads (queries and keys repeated to as many); Kimi delta attention: its heads
    # (keys and values one head dim)
    delta_rule_heads: int = 0
    delta_rule_key_dim: int = 0
    delta_rule_value_dim: int = 0
    # Kimi delta attention's forget and output gates: the rank of their low-rank factorisation (Kimi Linear's
    # f_a / g_a projections, a softplus decay), 0 for full-rank gates (Bailing's f_proj / g_proj, a bounded sigmoid)
    delta_rule_gate_rank: int = 0
    ssd_heads: int = 0  # Mamba-2 layers: heads, head dim, state size and the scan's chunk length
    ssd_head_dim: int = 0
    ssd_state_size: int = 0
    ssd_chunk: int = 0
    lightning_block: int = 0  # lightning attention layers: block length (heads and head_dim as attention's)
    # What the mixers' saved activations depend on beyond the above: the taps K of their causal depthwise
    # convolution (its channels per layer are layer_conv_padding / (K·(K - 1))), a selective scan's state size N
    # and time-step rank R, and whether it normalises its time step, B and C (Jamba's dt / b / c layernorms).
    conv_kernel: int = 0
    scan_state_size: int = 0
    scan_dt_rank: int = 0
    scan_norms: bool = False
    # Gemma 3n: per layer, the streams n of its AltUp (alternating updates, Baykal et al. 2023), else 0 (its
    # stream projections outside the layers are input_params and final_norm_params).
    layer_altup_streams: Tuple[int, ...] = ()
    # LongCat-Flash: zero-computation (identity) experts routed among the num_experts real ones (a token's
    # experts_per_token picks include them), and two softmax attentions in each decoder layer.
    zero_experts: int = 0
    attention_sublayers: int = 1
    qk_head_dim: int = 0  # dims of the QK^T and AV products (multi-latent attention differs from head_dim)
    v_head_dim: int = 0
    # Per layer, where layers' attention differs in shape (Gemma 4's wider global heads, Inkling's sliding and
    # full layers): query heads, kv heads and the head dim of both the QK^T and AV products; empty when every
    # layer has num_heads, num_kv_heads and qk_head_dim / v_head_dim (attention_shapes reads either).
    attention_heads: Tuple[int, ...] = ()
    attention_kv_heads: Tuple[int, ...] = ()
    attention_head_dims: Tuple[int, ...] = ()
    # Per layer: the size d_rel x E of a relative-position bank every head's d_rel states multiply (Inkling's
    # rel_logits_proj: a bias per query and backward distance up to E), else 0; empty when no layer has one.
    layer_relative_banks: Tuple[int, ...] = ()
    # Per layer: (runs with gradient, runs under no_grad) in one forward, where layers are weight-shared stacks run
    # several times (HRM's H and L stacks, each distinct layer held once); empty: each layer runs once, with gradient.
    layer_runs: Tuple[Tuple[int, int], ...] = ()
    # Inkling 2: per layer, the (queries, entries) of each block attention residual it runs (attention_input, then
    # mlp_input): learned queries attending over the stacked block states and the partial one; empty without.
    # final_block_residual: the one before the final norm (final_input), () without.
    layer_block_residuals: Tuple[Tuple[Tuple[int, int], ...], ...] = ()
    final_block_residual: Tuple[int, ...] = ()
    # Inkling 2: per layer, C·K summed over its dynamic short convolutions (C channels, K taps: static_weight's
    # K x C, per-token taps projected by weight_proj), else 0; empty where no layer has one.
    layer_dynamic_convs: Tuple[int, ...] = ()
    idle_params: int = 0  # held by the first stage, never run by a text forward (encoders of other modalities)
    input_params: int = 0  # run by the first stage on the embeddings besides the tables (an embedding's own norm,
    # Gemma 4's per-layer-input projection and norm)
    # What FP8 can convert where it swaps nn.Linear modules only (torchao's float8 training): the share of the
    # attention block's and of the MLP's weight-matrix FLOPs per token run by nn.Linear weights (linear_share).
    # 0 for GPT-2's Conv1D projections; a transformers MoE MLP's routed experts are grouped tensors, not modules.
    linear_attention_share: float = 1.0
    linear_mlp_share: float = 1.0
    # The attention block's trained nn.Linear weights as (in, out, TP-split dim of the (out, in) weight or None):
    # the GEMMs multi-latent attention runs (its low-rank q / kv projections replicated over TP, the up-projections
    # and output split), which the per-head formula of compute_time.layer_gemm_blocks does not describe.
    attention_matrices: Tuple[Tuple[int, int, Optional[int]], ...] = ()
    attn_logit_softcapping: Optional[float] = None  # elementwise tanh: no matmul FLOPs
    final_logit_softcapping: Optional[float] = None
    tp_plan_source: str = "transformers"  # "transformers", "harness" (what transformers lacks) or "none"
    layer_tensors: Tuple[ParamTensor, ...] = ()  # the most common decoder layer, in module order
    # Every distinct decoder layer's tensors (in module order), and the kind of each layer: what a pipeline
    # stage holds when layers differ (DeepSeek-V3's dense first layers before its MoE ones).
    layer_kinds: Tuple[Tuple[ParamTensor, ...], ...] = ()
    layer_pattern: Tuple[int, ...] = ()
    first_tensors: Tuple[ParamTensor, ...] = ()  # embedding tables, then the input-side tensors (input_params)
    last_tensors: Tuple[ParamTensor, ...] = ()  # final norm, untied lm_head
    no_split_modules: Tuple[str, ...] = ()
    pp_plan: Tuple[str, ...] = ()  # top-level modules of transformers' pipeline plan
    # What activations depend on beyond the shapes above, in the most common layer: its hidden-size norms
    # (two in a pre-norm layer, four in Gemma 2's sandwich, one where attention and MLP run in parallel) and the
    # intermediate size of its shared experts together (0 without).
    layer_norms: int = 2
    # Per layer, its hidden-size norms where layers differ in them (AXK1's MoE layers add a norm after the MLP);
    # empty where every layer has layer_norms.
    layer_hidden_norms: Tuple[int, ...] = ()
    shared_ffn_size: int = 0
    # Per layer: (routed experts, one routed expert's intermediate size, intermediate size of what every token
    # runs: the dense MLP or the shared experts), so that dense-first MoE layers save what they run.
    layer_mlps: Tuple[Tuple[int, int, int], ...] = ()
    # Sizes of the norms inside attention over a latent rather than a head (multi-latent attention's q_a and
    # kv_a norms); each is followed by a projection of its output.
    attention_latent_norms: Tuple[int, ...] = ()
    # Per latent norm, the output width of the projection it normalises (its own size, or wider where the norm
    # reads a slice: DeepSeek's kv_a output is the kv_lora_rank latent and the rotary key), empty where none.
    attention_latent_outputs: Tuple[int, ...] = ()
    # Per token, the output of the projection the values are split from where it holds more than the values
    # (multi-latent attention's kv_b: a·(qk_nope + v) of which V is a·v), else 0.
    attention_value_source: int = 0
    # Per token, the intermediate of a grouped output projection (DeepSeek-V4: o_a_proj maps each of o_groups head
    # groups to o_lora_rank, o_b_proj reads the o_groups·o_lora_rank concatenation), else 0.
    attention_output_latent: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def gated_mlp(self) -> bool:
        return self.mlp_kind == "swiglu"

    @property
    def decoder_active_params(self) -> int:
        """Parameters of all decoder layers one token touches."""
        return sum(self.layer_active_params)

    def attention_shapes(self) -> Tuple[Tuple[int, int, int, int], ...]:
        """Per layer: (query heads, kv heads, QK^T dim, AV dim), from the per-layer tuples where layers differ."""
        if self.attention_heads:
            return tuple((a, kv, d, d) for a, kv, d in zip(self.attention_heads, self.attention_kv_heads,
                                                           self.attention_head_dims, strict=True))
        return ((self.num_heads, self.num_kv_heads, self.qk_head_dim, self.v_head_dim),) * len(self.attention_windows)

    def mean_attention(self) -> Tuple[float, float, float, float]:
        """(heads, kv heads, heads x head dim, kv heads x head dim) of a softmax-attention layer: the spec's, or
        their means over the attention layers where layers differ in shape (work and saved tensors add up layer by
        layer)."""
        if not self.attention_heads:
            return (self.num_heads, self.num_kv_heads, self.num_heads * self.head_dim,
                    self.num_kv_heads * self.head_dim)
        mixers = self.layer_mixers or ("attention",) * len(self.attention_heads)
        rows = [(a, kv, a * d, kv * d) for (a, kv, d, _), mixer in zip(self.attention_shapes(), mixers, strict=True)
                if mixer == "attention"] or [(0, 0, 0, 0)]
        return tuple(sum(column) / len(rows) for column in zip(*rows))  # type: ignore[return-value]

    @property
    def moe_layer_share(self) -> float:
        """The share of decoder layers holding routed experts (DeepSeek-V3's first 3 of 61 are dense)."""
        if not self.layer_kinds or not self.layer_pattern:
            return 1.0 if self.is_moe else 0.0
        routed = [any(t.expert for t in kind) for kind in self.layer_kinds]
        return sum(routed[i] for i in self.layer_pattern) / len(self.layer_pattern)

    def attention_dims(self) -> Tuple[float, float, float, float]:
        """(heads, kv heads, heads x QK^T dim, heads x AV dim) of a softmax-attention layer, means over the
        attention layers: the products' own widths (multi-latent attention's 192-wide queries and keys against
        128-wide values, where mean_attention gives the heads' rotary head_dim)."""
        mixers = self.layer_mixers or ("attention",) * len(self.attention_shapes())
        rows = [(a, kv, a * qd, a * vd) for (a, kv, qd, vd), mixer in zip(self.attention_shapes(), mixers, strict=True)
                if mixer == "attention"] or [(0, 0, 0, 0)]
        return tuple(sum(column) / len(rows) for column in zip(*rows))  # type: ignore[return-value]

    @property
    def split_heads(self) -> Tuple[int, int]:
        """(query heads, kv heads) a tensor-parallel degree must divide: the spec's, or their greatest common
        divisor over the layers where layers differ (Gemma 4's global layers may have a single kv head)."""
        if not self.attention_heads:
            return self.num_heads, self.num_kv_heads
        return math.gcd(*self.attention_heads), math.gcd(*self.attention_kv_heads)

    def runs(self) -> Tuple[Tuple[int, int], ...]:
        """Per layer: (runs with gradient, runs under no_grad) in one forward (once with gradient by default)."""
        return self.layer_runs or ((1, 0),) * self.num_layers

    @property
    def saved_layer_runs(self) -> int:
        """Layer runs whose activations a forward saves for the backward: one per layer, or each weight-shared
        layer's runs with gradient (a no_grad run saves nothing)."""
        return sum(grad for grad, _ in self.runs())

    @property
    def decoder_forward_only_params(self) -> int:
        """Parameters of all decoder layers that run forward only (no gradient, no optimizer step)."""
        return sum(self.layer_forward_only_params)

    def to_dict(self) -> Dict[str, Any]:
        """JSON-native: tuples (per-layer figures, tensor shapes) become lists."""
        return _plain(asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def model_spec_from_hf(name: str, hf_config: Mapping[str, Any]) -> ModelSpec:
    """Build the spec from config fields (`model_type` plus keys), through transformers' own model."""
    return model_spec_from_shape(name, model_shape(hf_config))


Row = Sequence[Any]  # [name inside the layer, shape, tp_dim, routed expert]
# The token mixer's tensors: attention, or a state-space mixer in its place (Jamba's "mamba"), or LFM2's short
# convolution ("conv")
_ATTENTION = re.compile(r"^(?![^.]*norm)([^.]*(attn|attention|mamba)[^.]*|conv)\.")
_QK_NORM = re.compile(r"(^|\.)(q|k|query|key)_(norm|layernorm)\.")
_POSITIONS = re.compile(r"(wpe|pos)")
# A sparse-attention indexer (DeepSeek Sparse Attention's lightning indexer, Qwen4's QSA, DeepSeek-V4's CSA).
_INDEXER = re.compile(r"(^|\.)indexer\.")
# Modules transformers runs under torch.no_grad inside a training forward: the indexers (deepseek_v32,
# glm_moe_dsa ...). Their parameters get no gradient from the loss.
FORWARD_ONLY = _INDEXER
# A decoder layer's hyper-connection modules (DeepSeek-V4 / HY-V4 attn_hc, ffn_hc; Qwen4 *_hyper_connection)
_HYPER = re.compile(r"^([^.]*_hc|[^.]*hyper_connection[^.]*)\.")
_HYPER_FN = re.compile(r"^[^.]*_hc\.fn$")  # DeepSeek-V4 / HY-V4: the (pre, post[, comb]) weights' projection
_HYPER_MIX_DOWN = re.compile(r"^[^.]*hyper_connection[^.]*\.input_mix_weight_down\.weight$")  # Qwen4: (r, N·h)
# Gemma 3n's per-layer modules beside attention and MLP: AltUp's predict / correct coefficients and router,
# the Laurel low-rank residual, the per-layer-input gate and projection.
_LAYER_EXTRAS = re.compile(r"^(altup|laurel|per_layer_input_gate|per_layer_projection|post_per_layer_input_norm)\.")
_ATTENTION_SUBLAYER = re.compile(r"^self_attn\.(\d+)\.")  # LongCat-Flash: two attentions a layer, self_attn.0 / .1
_ALTUP_PREDICTION = re.compile(r"^altup\.prediction_coefs\.weight$")  # (n², n)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for size in shape:
        n *= int(size)
    return n


def _is_norm(row: Row) -> bool:
    leaf = row[0].rsplit(".", 2)
    return len(row[1]) == 1 and ("norm" in row[0] or (len(leaf) > 1 and leaf[-2].startswith("ln")))


class _Layer(NamedTuple):
    total: int
    active: int
    routed_experts: int


def _expert_numel(routed: Sequence[Row]) -> int:
    """Parameters of one routed expert: its slice (dim 0) of each stacked expert tensor."""
    return sum(_numel(r[1]) // int(r[1][0]) for r in routed)


def _layer_counts(rows: Sequence[Row], experts_per_token: int, zero_experts: int = 0) -> _Layer:
    """A token visits k of E routed experts: active = the rest + k experts' slices. With Z zero-computation
    (identity) experts beside the E real ones (LongCat-Flash), the k picks land on real experts in proportion
    E / (E + Z), k·E / (E + Z) real experts a token (the expectation under balanced routing); the stacked tensors
    may hold rows for the zero experts too (LongCat's gate_up_proj, E + Z rows, never read)."""
    routed = [r for r in rows if r[3]]
    experts = max(int(r[1][0]) for r in routed) - zero_experts if routed else 0
    routed_numel = sum(_numel(r[1]) for r in routed)
    total = sum(_numel(r[1]) for r in rows)
    touched = _expert_numel(routed) * experts_per_token * experts // (experts + zero_experts) if experts else 0
    return _Layer(total, total - routed_numel + touched, experts)


# Inkling's full attention layers are "hybrid" (its sliding window ones "hybrid_sliding"): softmax attention among
# short convolutions (a layer whose tensors show another mixer is named by that mixer, _attention_fields)
_FULL_ATTENTION = ("full_attention", "attention", "global_attention", "hybrid")
_MIXERS = ("selective_scan", "gated_delta_rule", "kimi_delta_rule", "state_space_duality", "lightning_attention",
           "short_conv", "none")
_SCAN_STATE = re.compile(r"(^|\.)A_log$")  # Mamba-1's A, (d_inner, N); Mamba-2 and delta rules keep one per head
_DEPTHWISE_CONV = re.compile(r"(^|\.)(conv1d|conv\.conv)\.weight$")
_DELTA_RULE_DECAY = re.compile(r"(^|\.)linear_attn\.A_log$")  # Gated DeltaNet: one decay per value head
_KIMI_DECAY = re.compile(r"(^|\.)forget_gate\.A_log$")  # Kimi delta attention: a decay rate per head
_KIMI_LOW_RANK_GATE = re.compile(r"(^|\.)forget_gate\.f_a_proj\.weight$")  # Kimi Linear's (rank, hidden)
_SSD_DECAY = re.compile(r"^(mamba|mixer)\.A_log$")  # Mamba-2: one decay per head
_MLP_ONLY = ("mlp", "moe")  # layer_types of layers without a token mixer (Nemotron-H)
_LIGHTNING_GATE = re.compile(r"^self_attn\.output_gate\.weight$")  # MiniMax's lightning attention output gate
_SHORT_CONV = re.compile(r"^conv\.conv\.weight$")  # LFM2's gated short convolution (Lfm2ShortConv)
_SCAN_DT = re.compile(r"(^|\.)dt_proj\.weight$")  # Mamba-1's time-step projection, (d_inner, R)
_SCAN_NORM = re.compile(r"(^|\.)(dt|b|c)_layernorm\.weight$")  # Jamba's norms of the time step, B and C
# Modules of a non-attention token mixer: their norms are the mixer's own, not multi-latent attention's latents
_MIXER_MODULE = re.compile(r"^(mamba|mixer|linear_attn)\.")
_LATENT_NORM = re.compile(r"^(.*)_(layer)?norm\.weight$")  # a latent norm P_norm / P_layernorm reads P_proj*'s output
_VALUE_SOURCE = re.compile(r"(^|\.)kv_b_proj\.weight$")  # multi-latent attention: k_nope and V per head, split
_GROUPED_OUTPUT = re.compile(r"(^|\.)o_a_proj\.weight$")  # DeepSeek-V4: (o_groups·o_lora_rank, heads·d / o_groups)


def _mixer(rows: Sequence[Row], layer_type: Optional[str]) -> str:
    """A layer's token mixer, from its tensors (and layer_types for a layer that has none)."""
    if any(_SCAN_STATE.search(r[0]) and len(r[1]) == 2 for r in rows):
        return "selective_scan"
    if any(_DELTA_RULE_DECAY.search(r[0]) and len(r[1]) == 1 for r in rows):
        return "gated_delta_rule"
    if any(_KIMI_DECAY.search(r[0]) for r in rows):
        return "kimi_delta_rule"
    if any(_SSD_DECAY.search(r[0]) and len(r[1]) == 1 for r in rows):
        return "state_space_duality"
    if any(_LIGHTNING_GATE.search(r[0]) for r in rows):
        return "lightning_attention"
    if any(_SHORT_CONV.search(r[0]) and len(r[1]) == 3 for r in rows):
        return "short_conv"
    return "none" if layer_type in _MLP_ONLY else "attention"


def _mixer_fields(kinds: Sequence[Sequence[Row]], pattern: Sequence[int],
                  layer_types: Optional[Sequence[str]]) -> Dict[str, Any]:
    """Per layer: its token mixer, the d_inner·N of a selective scan and a causal convolution's padding work,
    read from the layer's tensors (a 2-D A_log is Mamba-1's state matrix, a 1-D linear_attn.A_log Gated
    DeltaNet's decays, a forget_gate.A_log Kimi delta attention's decay rates, a 1-D mamba / mixer A_log
    Mamba-2's, an output gate lightning attention's, a layer-level conv.conv.weight LFM2's short convolution;
    conv1d.weight and conv.conv.weight are (C, 1, K)); all empty when every layer is softmax attention."""
    def scan(rows: Sequence[Row]) -> int:
        return sum(_numel(r[1]) for r in rows if _SCAN_STATE.search(r[0]) and len(r[1]) == 2)

    def padding(rows: Sequence[Row]) -> int:
        return sum(_numel(r[1]) * (int(r[1][-1]) - 1) for r in rows
                   if _DEPTHWISE_CONV.search(r[0]) and len(r[1]) == 3 and int(r[1][1]) == 1)

    mixers = tuple(_mixer(kinds[i], layer_types[layer] if layer_types else None) for layer, i in enumerate(pattern))
    if set(mixers) == {"attention"}:  # every layer is softmax attention: the per-layer mixer fields stay empty,
        paddings = tuple(padding(kinds[i]) for i in pattern)  # but for short convolutions beside it (Inkling)
        return {"layer_mixers": (), **({"layer_conv_padding": paddings} if any(paddings) else {})}
    rows = [r for i in pattern for r in kinds[i]]
    taps = [int(r[1][-1]) for r in rows if _DEPTHWISE_CONV.search(r[0]) and len(r[1]) == 3 and int(r[1][1]) == 1]
    states = [r[1] for r in rows if _SCAN_STATE.search(r[0]) and len(r[1]) == 2]
    ranks = [int(r[1][1]) for r in rows if _SCAN_DT.search(r[0]) and len(r[1]) == 2]
    return {"layer_mixers": mixers, "layer_scan_states": tuple(scan(kinds[i]) for i in pattern),
            "layer_conv_padding": tuple(padding(kinds[i]) for i in pattern), "conv_kernel": max(taps, default=0),
            "scan_state_size": int(states[0][1]) if states else 0, "scan_dt_rank": max(ranks, default=0),
            "scan_norms": any(_SCAN_NORM.search(r[0]) for r in rows)}


_COMPRESSED = ("compressed_sparse_attention", "heavily_compressed_attention")  # DeepSeek-V4's CSA / HCA
# DeepSeek-V4's compressor: its gate's position bias is (m, d) (HCA) or (m, 2d) (CSA's two overlapping series),
# one row per token of the m-token window it pools; the indexer's own compressor has one too (compressor.indexer.)
_COMPRESSOR_BIAS = re.compile(r"(^|\.)compressor\.position_bias$")
_POSITION_BIAS = re.compile(r"(^|\.)position_bias$")
_COMPRESSOR_PROJECTION = re.compile(r"(^|\.)compressor\.[^.]*_proj\.weight$")  # kv_proj, gate_proj (not the indexer's)


def _attention_fields(name: str, model_type: str, fields: Mapping[str, Any], mixers: Sequence[str],
                      own_indexer: Sequence[bool], compression: Sequence[int] = ()) -> Dict[str, Any]:
    """Per layer: window 0 (every earlier key) or the sliding window w; chunk 0 or the chunk C of chunked
    attention (Llama 4's local layers: a query sees the keys of its own C-token chunk); indexed layers
    (DeepSeek Sparse Attention) attend to the index_topk keys their indexer picks among the earlier ones,
    as many per query as a sliding window of index_topk (Qwen4's QSA: its token budget); `own_indexer` says
    which layers run an indexer of their own (HY-V4's "shared" layers reuse the previous one's pick). DeepSeek-V4's
    compressed layers (`compression`: m per layer) attend the sliding window w and their compressed entries; a CSA
    layer's indexer picks among those entries, an HCA layer has none. A selective-scan layer (whatever its
    layer_types name, Jamba's "linear_attention"), Gated DeltaNet, Kimi delta attention, Mamba-2, lightning
    attention, short convolution (LFM2's "conv") or MLP-only layer scores no keys: (0, 0, False), and flops counts
    its mixer's own products instead. Layers of other kinds (convolution) have
    FLOPs and saved tensors the planner has no formula for: such families are refused by name."""
    n = fields["num_layers"]
    window = int(fields.get("sliding_window") or 0)
    types = fields.get("layer_types") or [("sliding_attention" if window else "full_attention")] * n
    types = [(mixers[i] if mixers and mixers[i] != "attention" else kind) for i, kind in enumerate(types)]
    spans = {**{kind: (0, 0, False) for kind in _FULL_ATTENTION}, "sliding_attention": (window, 0, False),
             "hybrid_sliding": (window, 0, False),
             "chunked_attention": (0, int(fields.get("attention_chunk_size") or 0), False),
             "indexed_attention": (int(fields.get("index_topk") or 0), 0, True),
             "compressed_sparse_attention": (window, 0, True), "heavily_compressed_attention": (window, 0, False),
             **{kind: (0, 0, False) for kind in _MIXERS}}
    missing = sorted({kind for kind, rate in zip(types, compression or (0,) * n) if kind in _COMPRESSED and not rate})
    if missing:
        raise ValueError(f"model {name!r} ({model_type}): layer_types {missing} are compressed attention without "
                         "a compressor position bias (compressor.position_bias) giving the compression rate")
    other = sorted({kind for kind in types if kind not in spans})
    if other:
        raise ValueError(f"model {name!r} ({model_type}): layer_types {other} are not supported; the planner "
                         "models softmax attention layers (full, sliding window, chunked, indexed or compressed), "
                         "Mamba-1 selective scans, Mamba-2, Gated DeltaNet, Kimi delta attention, lightning attention, "
                         "short convolutions and MLP-only layers only")
    indexed = tuple(spans[kind][2] for kind in types)
    return {"attention_windows": tuple(spans[kind][0] for kind in types),
            "attention_chunks": tuple(spans[kind][1] for kind in types), "attention_indexed": indexed,
            "indexer_heads": int(fields.get("index_n_heads") or 0) if any(indexed) else 0,
            "indexer_head_dim": int(fields.get("index_head_dim") or 0) if any(indexed) else 0,
            "indexer_layers": sum(i and own for i, own in zip(indexed, own_indexer, strict=True)),
            "indexer_block": int(fields.get("index_block") or 0) if any(indexed) else 0}


def _token_mixing(name: str, model_type: str, fields: Mapping[str, Any], kinds: Sequence[Sequence[Row]],
                  pattern: Sequence[int]) -> Dict[str, Any]:
    """Each layer's mixer (from its tensors) and its attention span (from layer_types)."""
    mixers = _mixer_fields(kinds, pattern, fields.get("layer_types"))
    if {"gated_delta_rule", "kimi_delta_rule"} & set(mixers["layer_mixers"]):
        mixers.update(delta_rule_heads=int(fields["linear_value_heads"]),
                      delta_rule_key_dim=int(fields["linear_key_head_dim"]),
                      delta_rule_value_dim=int(fields["linear_value_head_dim"]))
        ranks = [int(r[1][0]) for i in pattern for r in kinds[i] if _KIMI_LOW_RANK_GATE.search(r[0])]
        mixers.update(delta_rule_gate_rank=max(ranks, default=0))
    if "state_space_duality" in mixers["layer_mixers"]:
        mixers.update(ssd_heads=int(fields["ssm_heads"]), ssd_head_dim=int(fields["ssm_head_dim"]),
                      ssd_state_size=int(fields["ssm_state_size"]), ssd_chunk=int(fields["ssm_chunk_size"]))
    if "lightning_attention" in mixers["layer_mixers"]:
        mixers.update(lightning_block=int(fields["lightning_block_size"]))
    own_indexer = tuple(any(_INDEXER.search(r[0]) for r in kinds[i]) for i in pattern)
    compression = _compression_fields(kinds, pattern)
    attention = _attention_fields(name, model_type, fields, mixers["layer_mixers"], own_indexer,
                                  compression.get("attention_compression", ()))
    if compression and any(attention["attention_indexed"]):
        compression["compressed_topk"] = int(fields.get("index_topk") or 0)
    return {**mixers, **attention, **compression}


def _compression_fields(kinds: Sequence[Sequence[Row]], pattern: Sequence[int]) -> Dict[str, Any]:
    """Per layer, DeepSeek-V4's compression rate m (the rows of its compressor's position bias, one per token of
    the window it pools), its compressor's projection weights and the (trained, forward-only) parameters of its
    position biases; empty without."""
    rates = tuple(max((int(r[1][0]) for r in kinds[i] if _COMPRESSOR_BIAS.search(r[0])), default=0) for i in pattern)
    if not any(rates):
        return {}

    def counts(rows: Sequence[Row]) -> Tuple[int, int, int]:
        biases = [r for r in rows if _POSITION_BIAS.search(r[0])]
        return (sum(_numel(r[1]) for r in rows if _COMPRESSOR_PROJECTION.search(r[0])),
                sum(_numel(r[1]) for r in biases if not FORWARD_ONLY.search(r[0])),
                sum(_numel(r[1]) for r in biases if FORWARD_ONLY.search(r[0])))

    return {"attention_compression": rates, "layer_compressors": tuple(counts(kinds[i]) for i in pattern)}


def _hyper_connection_fields(fields: Mapping[str, Any], kinds: Sequence[Sequence[Row]], pattern: Sequence[int],
                              outside: int) -> Dict[str, Any]:
    """Residual streams N, the collapse's parameters outside the layers, and per layer the stream-mixing
    products: a DeepSeek-V4 hyper-connection's fn projects the N·h streams to (2 + N)·N weights (pre, post and
    the N x N comb); comb^T times the N x h streams is N²·h multiply-adds per token (HY-V4's fn has 2N rows, no
    comb; Qwen4's gated residual mixes elementwise). Pre (collapse) and post (spread) are elementwise."""
    streams = int(fields.get("hyper_streams") or 0)
    if not streams:
        return {}
    hidden = int(fields["hidden_size"])

    def mixing(rows: Sequence[Row]) -> int:
        return sum(streams * streams * hidden for r in rows
                   if _HYPER_FN.match(r[0]) and int(r[1][0]) == (2 + streams) * streams)

    rows = kinds[pattern[0]] if pattern else ()
    fns = [int(r[1][0]) for r in rows if _HYPER_FN.match(r[0])]
    downs = [int(r[1][0]) for r in rows if _HYPER_MIX_DOWN.match(r[0])]
    form = ("gated" if downs else "sinkhorn" if (2 + streams) * streams in fns else "pre_post" if fns else "")
    return {"hyper_streams": streams, "hyper_connection_params": outside,
            "layer_stream_mixing": tuple(mixing(kinds[i]) for i in pattern),
            "hyper_connections": len(fns) + len(downs), "hyper_connection_form": form,
            "hyper_connection_rank": max(downs, default=0),
            "hyper_sinkhorn_iterations": int(fields.get("hyper_sinkhorn_iters") or 0) if form == "sinkhorn" else 0}


_RELATIVE_BANK = re.compile(r"(^|\.)rel_logits_proj\.proj$")  # Inkling: (d_rel, E), one bias profile per state
# Inkling 2's short convolutions whose taps are static weights (K, C) plus per-token ones projected from the layer
# input, applied elementwise
_DYNAMIC_CONV = re.compile(r"(^|\.)static_weight$")
# Inkling 2's block attention residuals: learned queries, (h,) or (q, h), attending over the stacked block states
BLOCK_RESIDUAL_QUERY = re.compile(r"(^|\.)(attention_input|mlp_input|final_input)\.query$")


def _block_residual_fields(name: str, shape: Mapping[str, Any]) -> Dict[str, Any]:
    """Inkling 2's block attention residuals and dynamic short convolutions, per layer (empty without).

    Entries (transformers' Inkling2TextModel): the model keeps the stacked block states, none before layer 0; a
    layer at a block boundary (index % B == 0, B = n_layers_per_attn_res_block) appends its input to them after it
    runs. Before layer i they hold n_i = #{j < i : j % B == 0} states. The layer's attention_input (none at
    layer 0) attends over those and the partial block state (its input): n_i + 1 entries; at a boundary the layer
    appends its input before its mlp_input, which attends over n_i + [i % B == 0] + 1 entries; final_input over
    n_L + 1. Queries: a (h,) query is 1, a (q, h) one q (the full layers' attention_input: q, k and v inputs)."""
    fields, kinds, pattern, last = shape["fields"], shape["layer_kinds"], shape["layer_pattern"], shape["last"]
    hidden = int(fields["hidden_size"])

    def queries(rows: Sequence[Row], module: str) -> List[int]:
        return [_numel(r[1]) // hidden for r in rows
                if BLOCK_RESIDUAL_QUERY.search(r[0]) and r[0].endswith(f"{module}.query")]

    out: Dict[str, Any] = {}
    convs = tuple(sum(_numel(r[1]) for r in kinds[i] if _DYNAMIC_CONV.search(r[0])) for i in pattern)
    if any(convs):
        out["layer_dynamic_convs"] = convs
    if not any(BLOCK_RESIDUAL_QUERY.search(r[0]) for r in [*last, *(r for kind in kinds for r in kind)]):
        return out
    block = int(fields.get("attention_residual_block") or 0)
    if block <= 0:
        raise ValueError(f"model {name!r} ({shape['model_type']}): block attention residuals without a block size "
                         "(n_layers_per_attn_res_block) giving the stacked entries they attend over")
    stacked, layers = 0, []
    for index, kind in enumerate(pattern):
        boundary = int(index % block == 0)
        layers.append(tuple([(q, stacked + 1) for q in queries(kinds[kind], "attention_input")]
                            + [(q, stacked + boundary + 1) for q in queries(kinds[kind], "mlp_input")]))
        stacked += boundary
    final = queries(last, "final_input")
    return {**out, "layer_block_residuals": tuple(layers),
            "final_block_residual": (final[0], stacked + 1) if final else ()}


def _attention_shape_fields(name: str, model_type: str, fields: Mapping[str, Any],
                            kinds: Sequence[Sequence[Row]], pattern: Sequence[int]) -> Dict[str, Any]:
    """Per-layer heads, kv heads and head dims where layers' attention differs in shape (empty where every layer
    has the spec's), and each layer's relative-position bank (empty where no layer has one)."""
    layers = [tuple(int(x) for x in row) for row in fields.get("layer_attention") or ()]
    common = (fields["num_heads"], fields["num_kv_heads"], fields["head_dim"])
    out: Dict[str, Any] = {}
    if any(row != common for row in layers):
        if not fields["qk_head_dim"] == fields["v_head_dim"] == fields["head_dim"]:
            raise ValueError(f"model {name!r} ({model_type}): per-layer head shapes with q·k dims or value dims other "
                             "than head_dim (multi-latent attention) are not supported")
        out.update(attention_heads=tuple(r[0] for r in layers), attention_kv_heads=tuple(r[1] for r in layers),
                   attention_head_dims=tuple(r[2] for r in layers))
    banks = tuple(sum(_numel(r[1]) for r in kinds[i] if _RELATIVE_BANK.search(r[0]) and len(r[1]) == 2)
                  for i in pattern)
    if any(banks):
        out.update(layer_relative_banks=banks)
    return out


def _block_flags(rows: Sequence[Row], hidden: int) -> Dict[str, Any]:
    """Biases, q/k norms and norm kind read from the tensor names of one layer."""
    hyper = [r for r in rows if _HYPER.match(r[0])]
    rows = [r for r in rows if not _HYPER.match(r[0])]
    attention = [r for r in rows if _ATTENTION.match(r[0])]
    rest = [r for r in rows if not _ATTENTION.match(r[0]) and not _LAYER_EXTRAS.match(r[0])]
    norms = [r for r in rest if _is_norm(r)]
    mlp = [r for r in rest if not _is_norm(r)]
    biases = [r for r in attention if r[0].endswith(".bias") and "norm" not in r[0]]
    return {
        "attention": attention, "norms": norms, "mlp": mlp, "hyper": hyper,
        "qkv_bias": any(r[2] == 0 for r in biases),
        "out_bias": any(r[2] is None and list(r[1]) == [hidden] for r in biases),
        "mlp_bias": any(len(r[1]) == 1 for r in mlp),
        # an indexer's own key norm (DeepSeek Sparse Attention's indexer.k_norm) is not attention's
        "qk_norm": any(_QK_NORM.search(r[0]) and not _INDEXER.search(r[0]) for r in attention),
        "norm_kind": "layernorm" if any(r[0].endswith(".bias") for r in norms) else "rmsnorm",
    }


def _hidden_norms(norms: Sequence[Row], hidden: int, hyper: Sequence[Row] = ()) -> int:
    """Norm modules over the hidden size outside attention (one weight each; a LayerNorm's bias is not a
    second norm). A non-parametric norm (OLMo's) leaves no tensor: a layer without any is taken as pre-norm,
    unless its hyper-connections hold the layer's norms (Qwen4's hc_norm over the N·h streams: none of h)."""
    count = sum(1 for r in norms if r[0].endswith("weight") and list(r[1]) == [hidden])
    return count or (0 if any(_is_norm(r) for r in hyper) else 2)


def _always_on_ffn(mlp: Sequence[Row], experts: int, hidden: int, gated: bool) -> int:
    """Intermediate size of what every token runs: a dense MLP, or a MoE layer's shared experts. Their
    matrices are the MLP's non-routed ones other than the router (E x h) and scalar gates (1 x h);
    gated = 3·h·f, else 2·h·f."""
    numel = sum(_numel(r[1]) for r in mlp if not r[3] and len(r[1]) == 2 and 1 not in r[1]
                and not (experts and int(r[1][0]) == experts))
    return numel // ((3 if gated else 2) * hidden)


def _layer_mlp(rows: Sequence[Row], k: int, hidden: int, gated: bool) -> Tuple[int, int, int]:
    """(routed experts, one routed expert's intermediate size, the always-on intermediate size) of a layer."""
    experts = _layer_counts(rows, k).routed_experts
    routed = sum(_numel(r[1]) for r in rows if r[3] and len(r[1]) >= 2)
    mlp = _block_flags(rows, hidden)["mlp"]
    return (experts, routed // (experts * (3 if gated else 2) * hidden) if experts else 0,
            _always_on_ffn(mlp, experts, hidden, gated))


def _tensors(rows: Sequence[Row], frozen: Sequence[str] = ()) -> Tuple[ParamTensor, ...]:
    """Rows as ParamTensors; forward-only, idle (other-modality) and frozen (requires_grad False: HRM's z_L_init)
    tensors get no gradient."""
    return tuple(ParamTensor(tuple(int(size) for size in r[1]), r[2], bool(r[3]),
                             not (FORWARD_ONLY.search(r[0]) or OTHER_MODALITY.search(r[0]) or r[0] in frozen),
                             _is_linear(r))
                 for r in rows)


def _is_linear(row: Row) -> bool:
    """Whether a row is an nn.Linear module's weight (model_shape's fifth column; outside rows have none)."""
    return len(row) > 4 and bool(row[4])


def _linear_fields(flags: Mapping[str, Any], experts: int, k: int) -> Dict[str, Any]:
    """The spec's nn.Linear fields: each block's linear share and the attention block's matrices."""
    return {"linear_attention_share": linear_share(flags["attention"], experts, k),
            "linear_mlp_share": linear_share(flags["mlp"], experts, k),
            "attention_matrices": tuple((int(r[1][1]), int(r[1][0]), r[2]) for r in flags["attention"]
                                        if len(r[1]) == 2 and _is_linear(r) and not FORWARD_ONLY.search(r[0]))}


def linear_share(rows: Sequence[Row], experts: int, k: int) -> float:
    """The share of a block's weight-matrix FLOPs per token that runs through nn.Linear modules: each matrix's
    active elements (a routed expert tensor's k of its E rows) weigh it, as each multiplies every token that
    reaches it once. 1.0 for a block without matrices."""
    def active(r: Row) -> float:
        return _numel(r[1]) * (k / experts if r[3] and experts else 1.0)

    matrices = [r for r in rows if len(r[1]) >= 2]
    total = sum(active(r) for r in matrices)
    return sum(active(r) for r in matrices if _is_linear(r)) / total if total else 1.0


def _representative(kinds: List[List[Row]], pattern: Sequence[int], k: int) -> int:
    """The most common layer kind (the larger on a tie): what per-layer shapes describe."""
    counts = Counter(pattern)
    return max(counts, key=lambda i: (counts[i], _layer_counts(kinds[i], k).total))


def _outside_counts(name: str, shape: Mapping[str, Any],
                    per_layer: Sequence[_Layer]) -> Tuple[int, int, int, int, int, int]:
    """(embedding tables, input-side parameters, idle encoders of other modalities, untied lm_head, final norm and
    the rest, the hyper-connection collapse), once they add up to transformers' total."""
    first, inputs, last = shape["first"], shape.get("inputs", []), shape["last"]
    hyper = [bool(HYPER_CONNECTION_OUTSIDE.search(r[0])) for r in last]
    counts = (sum(_numel(r[1]) for r in first), sum(_numel(r[1]) for r in inputs if not OTHER_MODALITY.search(r[0])),
              sum(_numel(r[1]) for r in inputs if OTHER_MODALITY.search(r[0])),
              sum(_numel(r[1]) for r, h in zip(last, hyper) if r[2] == 0 and not h),
              sum(_numel(r[1]) for r, h in zip(last, hyper) if r[2] != 0 and not h),
              sum(_numel(r[1]) for r, h in zip(last, hyper) if h))
    total = sum(counts) + sum(x.total for x in per_layer)
    if total != shape["total_params"]:
        raise ValueError(f"model {name!r}: {total} parameters counted tensor by tensor, "
                         f"{shape['total_params']} in transformers' model (shared tensors?)")
    return counts


def _altup_streams(kinds: Sequence[Sequence[Row]], pattern: Sequence[int]) -> Tuple[int, ...]:
    """Per layer, the streams n of Gemma 3n's AltUp (its prediction coefficients are n² x n), empty without."""
    streams = tuple(sum(int(r[1][1]) for r in kinds[i] if _ALTUP_PREDICTION.match(r[0])) for i in pattern)
    return streams if any(streams) else ()


def model_spec_from_shape(name: str, shape: Mapping[str, Any]) -> ModelSpec:
    """Counts and shape fields from the tensors transformers allocated (harness.config.model_shape)."""
    f, k, zero = shape["fields"], int(shape["experts_per_token"]), int(shape["fields"].get("zero_experts") or 0)
    kinds, pattern = shape["layer_kinds"], shape["layer_pattern"]
    per_layer = [_layer_counts(kinds[i], k, zero) for i in pattern]
    experts = max(layer.routed_experts for layer in per_layer)
    if experts and not k:
        raise ValueError(f"model {name!r} ({shape['model_type']}): {experts} routed experts but no experts-per-"
                         "token field (num_experts_per_tok) in its config")
    rows = kinds[_representative(kinds, pattern, k)]
    layer = _layer_counts(rows, k, zero)
    h, ffn = f["hidden_size"], int(f["ffn_size"] if experts else f["dense_ffn_size"])
    flags = _block_flags(rows, h)
    routed = [r for r in rows if r[3]]
    expert = _expert_numel(routed) if layer.routed_experts else sum(_numel(r[1]) for r in flags["mlp"])
    router = sum(_numel(r[1]) for r in flags["mlp"] if layer.routed_experts and not r[3]
                 and int(r[1][0]) == layer.routed_experts + zero)
    matrices = (_expert_numel([r for r in routed if len(r[1]) >= 2]) if layer.routed_experts
                else sum(_numel(r[1]) for r in flags["mlp"] if len(r[1]) >= 2))
    first, inputs, last = shape["first"], shape.get("inputs", []), shape["last"]
    embedding, input_params, idle, lm_head, final_norm, hyper_outside = _outside_counts(name, shape, per_layer)
    outside_last = lm_head + final_norm + hyper_outside
    total = embedding + input_params + idle + sum(x.total for x in per_layer) + outside_last
    return ModelSpec(
        name=name, model_type=shape["model_type"], num_layers=f["num_layers"], hidden_size=h,
        num_heads=f["num_heads"], num_kv_heads=f["num_kv_heads"], head_dim=f["head_dim"], ffn_size=ffn,
        vocab_size=f["vocab_size"], max_positions=f["max_positions"],
        tied_embeddings=bool(shape["tied_embeddings"]),
        mlp_kind="swiglu" if matrices == 3 * h * ffn else "gelu",
        num_experts=experts, experts_per_token=k if experts else 0, zero_experts=zero if experts else 0,
        attention_sublayers=max(1, len({m.group(1) for r in rows if (m := _ATTENTION_SUBLAYER.match(r[0]))})),
        qkv_bias=flags["qkv_bias"], out_bias=flags["out_bias"], mlp_bias=flags["mlp_bias"],
        norm_kind=flags["norm_kind"], qk_norm=flags["qk_norm"],
        learned_positions=sum(int(r[1][0]) for r in first if r[2] is None and _POSITIONS.search(r[0])),
        attention_dropout=f["attention_dropout"], hidden_dropout=f["hidden_dropout"],
        embedding_dropout=f["embedding_dropout"], activation=f["activation"],
        attn_implementation=f["attn_implementation"],
        attention_params=sum(_numel(r[1]) for r in flags["attention"]), expert_params=expert,
        **_linear_fields(flags, layer.routed_experts, k),
        router_params=router, norm_params=sum(_numel(r[1]) for r in flags["norms"]),
        layer_params=layer.total, active_layer_params=layer.active, embedding_params=embedding,
        lm_head_params=lm_head, final_norm_params=final_norm, total_params=total,
        non_embedding_params=total - embedding, idle_params=idle,
        active_params=embedding + input_params + sum(x.active for x in per_layer) + outside_last,
        input_params=input_params, **_attention_shape_fields(name, shape["model_type"], f, kinds, pattern),
        layer_altup_streams=_altup_streams(kinds, pattern), **_block_residual_fields(name, shape),
        layer_total_params=tuple(x.total for x in per_layer), layer_active_params=tuple(x.active for x in per_layer),
        **_token_mixing(name, shape["model_type"], f, kinds, pattern), qk_head_dim=f["qk_head_dim"],
        **_hyper_connection_fields(f, kinds, pattern, hyper_outside), v_head_dim=f["v_head_dim"],
        layer_forward_only_params=tuple(sum(_numel(r[1]) for r in kinds[i] if FORWARD_ONLY.search(r[0]))
                                        for i in pattern),
        attn_logit_softcapping=f["attn_logit_softcapping"], final_logit_softcapping=f["final_logit_softcapping"],
        tp_plan_source=shape["tp_plan_source"], layer_tensors=_tensors(rows),
        layer_kinds=tuple(_tensors(kind) for kind in kinds), layer_pattern=tuple(int(i) for i in pattern),
        first_tensors=_tensors(first, shape.get("frozen", ())) + _tensors(inputs, shape.get("frozen", ())),
        last_tensors=_tensors(last, shape.get("frozen", ())), layer_runs=_layer_runs(shape),
        no_split_modules=tuple(shape["no_split_modules"]), pp_plan=tuple(shape["pp_plan"]),
        **_activation_fields(kinds, pattern, flags, layer.routed_experts, k, h, matrices == 3 * h * ffn,
                             f.get("layer_types")),
    )


def _layer_runs(shape: Mapping[str, Any]) -> Tuple[Tuple[int, int], ...]:
    """Per layer (runs with gradient, runs under no_grad), from the shape's layer_runs (model_shape.recurrent_runs:
    HRM's weight-shared stacks); empty where each layer runs once."""
    runs = tuple((int(grad), int(no_grad)) for grad, no_grad in shape.get("layer_runs") or ())
    if runs and len(runs) != int(shape["fields"]["num_layers"]):
        raise ValueError(f"{len(runs)} layer run counts for {shape['fields']['num_layers']} layers")
    return runs


def _activation_fields(kinds: Sequence[Sequence[Row]], pattern: Sequence[int], flags: Mapping[str, Any],
                       experts: int, k: int, hidden: int, gated: bool,
                       layer_types: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """What saved activations depend on beyond the shape: norms and shared experts of the most common layer,
    each layer's MLP, multi-latent attention's latent norms. A layer that is a single block under `mixer.`
    (Nemotron-H: a Mamba-2, attention or MLP layer each) runs an MLP only where it has no token mixer."""
    mlps = [_layer_mlp(kind, k, hidden, gated) for kind in kinds]

    def mlp(layer: int, i: int) -> Tuple[int, int, int]:
        single = all(r[0].startswith("mixer.") for r in kinds[i] if not _is_norm(r))
        mixer = _mixer(kinds[i], layer_types[layer] if layer_types else None)
        return (0, 0, 0) if single and mixer != "none" else mlps[i]

    lightning = any(_LIGHTNING_GATE.search(r[0]) for r in flags["attention"])  # its output norm is its own
    latents = [r for r in flags["attention"] if _is_norm(r) and r[0].endswith("weight") and not _QK_NORM.search(r[0])
               and not _MIXER_MODULE.match(r[0]) and not lightning]
    layer_flags = [_block_flags(kinds[i], hidden) for i in pattern]
    norms = tuple(_hidden_norms(layer["norms"], hidden, layer["hyper"]) for layer in layer_flags)
    return {"layer_norms": _hidden_norms(flags["norms"], hidden, flags["hyper"]),
            "layer_hidden_norms": norms if len(set(norms)) > 1 else (),
            "shared_ffn_size": _always_on_ffn(flags["mlp"], experts, hidden, gated) if experts else 0,
            "layer_mlps": tuple(mlp(layer, i) for layer, i in enumerate(pattern)),
            "attention_latent_norms": tuple(int(r[1][0]) for r in latents),
            "attention_latent_outputs": tuple(_latent_output(r, flags["attention"]) for r in latents),
            "attention_value_source": sum(int(r[1][0]) for r in flags["attention"] if _VALUE_SOURCE.search(r[0])),
            "attention_output_latent": sum(int(r[1][0]) for r in flags["attention"] if _GROUPED_OUTPUT.search(r[0]))}


def _latent_output(norm: Row, attention: Sequence[Row]) -> int:
    """The output width of the projection a latent norm reads: P_proj*'s rows for the norm P_norm / P_layernorm
    (DeepSeek's kv_a_layernorm reads the latent slice of kv_a_proj_with_mqa's latent + rotary key), else the norm's
    own size."""
    size = int(norm[1][0])
    match = _LATENT_NORM.match(norm[0])
    if not match:
        return size
    rows = [int(r[1][0]) for r in attention if r[0].startswith(match.group(1) + "_proj") and r[0].endswith("weight")
            and len(r[1]) == 2 and int(r[1][0]) >= size]
    return min(rows, default=size)


def param_tensors(spec: ModelSpec) -> Tuple[Tuple[ParamTensor, ...], Tuple[ParamTensor, ...], Tuple[ParamTensor, ...]]:
    """(the most common decoder layer, first-stage tensors, last-stage tensors), in transformers' shapes and
    order; `spec.layer_kinds[spec.layer_pattern[i]]` are layer i's own tensors.

    The split dims come from transformers' `base_model_tp_plan` (Megatron's split, Shoeybi et al. 2019,
    sec. 3: colwise projections split their output features and bias, rowwise ones their input features;
    norms, routers and what the plan leaves out are replicated); embedding and lm_head split the vocab.
    """
    return spec.layer_tensors, spec.first_tensors, spec.last_tensors
