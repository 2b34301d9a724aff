"""Training FLOPs per token of a decoder-only transformer, under an explicit, named convention."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

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
    attention_core: float  # QK^T and AV, no weights
    outside_layers: float  # final norm and, by convention, the lm_head


def forward_flops_per_token(spec: ModelSpec, seq_len: int, convention: FlopConvention) -> ForwardFlops:
    """Forward FLOPs of one token in a sequence of `seq_len` tokens.

    Weights: a token multiplies each weight it touches once and adds once, 2 FLOPs per parameter
    (Kaplan et al. 2020, table 1: C_forward ~ 2N). GQA, SwiGLU vs two-matrix MLPs, biases and MoE are
    all inside the exact active parameter count; norms and biases are O(h), counted like weights as
    6N does. Embedding lookups are gathers, not FLOPs; a tied lm_head still is a matmul (h x V).
    Attention core: per layer and query token, QK^T dots the query with T keys over a heads of dim d
    (2·a·d·T) and AV sums T values (2·a·d·T): 4·a·d·T, i.e. 4·H·Q·T in PaLM's letters (appendix B).
    A causal mask leaves on average T/2 keys per query: half of it.
    """
    layers = 2.0 * spec.num_layers * spec.active_layer_params
    attention = 4.0 * spec.num_layers * spec.num_heads * spec.head_dim * seq_len
    if convention.attention == "causal":
        attention /= 2
    head = spec.vocab_size * spec.hidden_size if convention.include_lm_head else 0
    return ForwardFlops(layers, attention, 2.0 * (spec.final_norm_params + head))


def flops_per_token(spec: ModelSpec, seq_len: int, convention: FlopConvention) -> float:
    """Model FLOPs of one training token: forward + backward, the backward costing twice the forward
    (a gradient for the input and one for the weight): 3 x forward, i.e. 6N + 12LHQT (PaLM appendix B)
    with the full convention, 6N + 6LHQT with the causal one. Recomputation is never counted here."""
    forward = forward_flops_per_token(spec, seq_len, convention)
    return 3.0 * (forward.layers + forward.attention_core + forward.outside_layers)


def recompute_flops_per_token(
    spec: ModelSpec, seq_len: int, convention: FlopConvention, checkpointing: str
) -> float:
    """Extra forward FLOPs activation checkpointing spends (HFU counts them, MFU does not).

    full: every checkpointed decoder layer runs its forward again in the backward (Korthikanti et al.
    2022, sec. 5: 4 passes instead of 3); selective: only the attention core (QK^T, softmax, AV) is
    recomputed (Korthikanti et al. 2022, sec. 4.2). Embedding, final norm and lm_head are not recomputed.
    """
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"activation_checkpointing={checkpointing!r} must be one of {CHECKPOINTING}")
    if checkpointing == "none":
        return 0.0
    forward = forward_flops_per_token(spec, seq_len, convention)
    if checkpointing == "selective":
        return forward.attention_core
    return forward.layers + forward.attention_core
