"""The shape of a decoder-only transformer read from Hugging Face config fields, with exact parameter counts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

# transformers' own defaults for the fields a preset may omit (checked against transformers by a test).
_LLAMA_FAMILY = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
}
_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "llama": _LLAMA_FAMILY,
    "mistral": {**_LLAMA_FAMILY, "intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 131072},
    "qwen2": {**_LLAMA_FAMILY, "vocab_size": 151936, "intermediate_size": 22016,
              "max_position_embeddings": 32768},
    "qwen3": {**_LLAMA_FAMILY, "vocab_size": 151936, "intermediate_size": 22016, "head_dim": 128,
              "max_position_embeddings": 32768},
    "mixtral": {**_LLAMA_FAMILY, "intermediate_size": 14336, "num_key_value_heads": 8,
                "max_position_embeddings": 131072, "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {**_LLAMA_FAMILY, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                  "num_hidden_layers": 24, "num_key_value_heads": 4, "head_dim": None,
                  "max_position_embeddings": 32768, "num_experts": 128, "num_experts_per_tok": 8,
                  "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": ()},
    "gpt2": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
             "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
             "attn_pdrop": 0.1, "tie_word_embeddings": True},
}
SUPPORTED_MODEL_TYPES = tuple(_DEFAULTS)


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only model: its shape and its parameter counts (counted as transformers builds it)."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int  # intermediate size of the dense MLP, or of one expert
    vocab_size: int
    max_positions: int
    tied_embeddings: bool
    mlp_kind: str  # "swiglu" (gate, up, down) or "gelu" (fc, proj)
    num_experts: int  # 0 for a dense model
    experts_per_token: int  # 0 for a dense model
    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    norm_kind: str  # "rmsnorm" (weight) or "layernorm" (weight + bias)
    qk_norm: bool  # per-head RMSNorm on q and k (qwen3)
    learned_positions: int  # rows of a learned position table (gpt2), else 0
    attention_dropout: float
    hidden_dropout: float  # dropout on the residual branches
    embedding_dropout: float
    activation: str  # hidden_act / activation_function
    attn_implementation: str  # "sdpa" (transformers' default), "eager" or "flash_attention_2"
    # Parameter counts; per-layer figures are for one decoder layer.
    attention_params: int  # q, k, v, o projections with their biases and q/k norms
    expert_params: int  # one expert (MoE) or the whole MLP (dense)
    router_params: int
    norm_params: int  # the two norms of one layer
    layer_params: int
    active_layer_params: int  # touched by one token: attention, norms, router, k experts
    embedding_params: int  # token (+ position) tables; a tied lm_head is counted here
    lm_head_params: int  # 0 when tied
    final_norm_params: int
    total_params: int
    non_embedding_params: int  # total - embedding (an untied lm_head stays in)
    active_params: int  # parameters one token touches (total for a dense model)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def gated_mlp(self) -> bool:
        return self.mlp_kind == "swiglu"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def model_spec_from_hf(name: str, hf_config: Mapping[str, Any]) -> ModelSpec:
    """Build the spec from config fields (`model_type` plus keys), filling transformers' defaults."""
    model_type = hf_config.get("model_type")
    if model_type not in _DEFAULTS:
        raise ValueError(
            f"model {name!r}: model_type={model_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    fields = {**_DEFAULTS[model_type], **{k: v for k, v in hf_config.items() if v is not None}}
    shape = _gpt2_shape(fields) if model_type == "gpt2" else _llama_family_shape(model_type, fields)
    shape["attn_implementation"] = str(
        fields.get("attn_implementation") or fields.get("_attn_implementation") or "sdpa")
    return _with_counts(name, model_type, shape)


# Which biases each family builds (transformers hard-codes some, reads `attention_bias`/`mlp_bias` for others).
_BIASES = {
    "llama": ("attention_bias", "attention_bias", "mlp_bias"),
    "qwen3": ("attention_bias", "attention_bias", None),
    "qwen3_moe": ("attention_bias", "attention_bias", None),
    "qwen2": (True, False, None),  # q/k/v bias=True, o_proj bias=False
    "mistral": (False, False, None),
    "mixtral": (False, False, None),
}
# Config key holding the expert count of each MoE family.
_EXPERT_KEY = {"mixtral": "num_local_experts", "qwen3_moe": "num_experts"}


def _flag(f: Dict[str, Any], rule: Any) -> bool:
    return bool(f.get(rule, False)) if isinstance(rule, str) else bool(rule)


def _llama_family_shape(model_type: str, f: Dict[str, Any]) -> Dict[str, Any]:
    """llama / mistral / qwen2 / qwen3 / mixtral / qwen3_moe: RMSNorm, gated MLP, rotary positions."""
    heads = int(f["num_attention_heads"])
    experts = int(f[_EXPERT_KEY[model_type]]) if model_type in _EXPERT_KEY else 0
    if model_type == "qwen3_moe" and (int(f["decoder_sparse_step"]) != 1 or list(f["mlp_only_layers"])):
        raise ValueError("qwen3_moe with dense layers (decoder_sparse_step != 1 or mlp_only_layers) "
                         "is not supported")
    qkv_bias, out_bias, mlp_bias = _BIASES[model_type]
    return {
        "num_layers": int(f["num_hidden_layers"]),
        "hidden_size": int(f["hidden_size"]),
        "num_heads": heads,
        "num_kv_heads": int(f["num_key_value_heads"] or heads),
        "head_dim": int(f["head_dim"] or int(f["hidden_size"]) // heads),
        "ffn_size": int(f["moe_intermediate_size"] if model_type == "qwen3_moe" else f["intermediate_size"]),
        "vocab_size": int(f["vocab_size"]),
        "max_positions": int(f["max_position_embeddings"]),
        "tied_embeddings": bool(f["tie_word_embeddings"]),
        "mlp_kind": "swiglu",
        "num_experts": experts,
        "experts_per_token": int(f["num_experts_per_tok"]) if experts else 0,
        "qkv_bias": _flag(f, qkv_bias),
        "out_bias": _flag(f, out_bias),
        "mlp_bias": _flag(f, mlp_bias),
        "norm_kind": "rmsnorm",
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "learned_positions": 0,
        "attention_dropout": float(f.get("attention_dropout", 0.0)),
        "hidden_dropout": 0.0,
        "embedding_dropout": 0.0,
        "activation": str(f["hidden_act"]),
    }


def _gpt2_shape(f: Dict[str, Any]) -> Dict[str, Any]:
    """GPT-2: LayerNorm with bias, fused qkv Conv1D with bias, 4h GELU MLP, learned positions, tied head."""
    hidden, heads = int(f["n_embd"]), int(f["n_head"])
    return {
        "num_layers": int(f["n_layer"]),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "ffn_size": int(f["n_inner"] or 4 * hidden),
        "vocab_size": int(f["vocab_size"]),
        "max_positions": int(f["n_positions"]),
        "tied_embeddings": bool(f["tie_word_embeddings"]),
        "mlp_kind": "gelu",
        "num_experts": 0,
        "experts_per_token": 0,
        "qkv_bias": True,
        "out_bias": True,
        "mlp_bias": True,
        "norm_kind": "layernorm",
        "qk_norm": False,
        "learned_positions": int(f["n_positions"]),
        "attention_dropout": float(f["attn_pdrop"]),
        "hidden_dropout": float(f["resid_pdrop"]),
        "embedding_dropout": float(f["embd_pdrop"]),
        "activation": str(f["activation_function"]),
    }


def _with_counts(name: str, model_type: str, s: Dict[str, Any]) -> ModelSpec:
    """Count parameters tensor by tensor, the way transformers allocates them (tied tables once)."""
    h, d, ffn = s["hidden_size"], s["head_dim"], s["ffn_size"]
    q_out, kv_out = s["num_heads"] * d, s["num_kv_heads"] * d
    norm = h * (2 if s["norm_kind"] == "layernorm" else 1)
    attention = (h * (q_out + 2 * kv_out) + q_out * h
                 + (q_out + 2 * kv_out) * s["qkv_bias"] + h * s["out_bias"]
                 + 2 * d * s["qk_norm"])
    matrices = 3 if s["mlp_kind"] == "swiglu" else 2
    expert = matrices * h * ffn + ((matrices - 1) * ffn + h) * s["mlp_bias"]
    experts, router = (s["num_experts"], h * s["num_experts"]) if s["num_experts"] else (1, 0)
    active_experts = s["experts_per_token"] or 1
    layer = attention + 2 * norm + router + experts * expert
    active_layer = attention + 2 * norm + router + active_experts * expert
    embedding = (s["vocab_size"] + s["learned_positions"]) * h
    lm_head = 0 if s["tied_embeddings"] else s["vocab_size"] * h
    L = s["num_layers"]
    total = embedding + L * layer + norm + lm_head
    return ModelSpec(
        name=name, model_type=model_type, **s,
        attention_params=attention, expert_params=expert, router_params=router, norm_params=2 * norm,
        layer_params=layer, active_layer_params=active_layer, embedding_params=embedding,
        lm_head_params=lm_head, final_norm_params=norm, total_params=total,
        non_embedding_params=total - embedding,
        active_params=embedding + L * active_layer + norm + lm_head,
    )


class ParamTensor(NamedTuple):
    """One parameter tensor as transformers allocates it, and the dim tensor parallelism splits."""

    shape: Tuple[int, ...]
    tp_dim: Optional[int]  # None: replicated across the TP group
    expert: bool = False  # dim 0 indexes experts (split by expert parallelism)


def param_tensors(spec: ModelSpec) -> Tuple[Tuple[ParamTensor, ...], Tuple[ParamTensor, ...], Tuple[ParamTensor, ...]]:
    """(one decoder layer, first-stage tensors, last-stage tensors), in transformers' shapes.

    Megatron's split (Shoeybi et al. 2019, sec. 3): q/k/v and the MLP's first matrices are
    column-parallel (output dim), o and the MLP's last matrix row-parallel (input dim), their biases
    follow the output dim, norms and the router are replicated, embedding and lm_head split the vocab.
    nn.Linear stores (out, in); GPT-2's Conv1D stores (in, out).
    """
    h, d, f = spec.hidden_size, spec.head_dim, spec.ffn_size
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    col, row = (1, 0) if spec.model_type == "gpt2" else (0, 1)
    layer = []
    if spec.model_type == "gpt2":
        layer += [ParamTensor((h, 3 * h), col), ParamTensor((3 * h,), 0), ParamTensor((h, h), row),
                  ParamTensor((h,), None)]
    else:
        layer += [ParamTensor((q, h), col), ParamTensor((kv, h), col), ParamTensor((kv, h), col),
                  ParamTensor((h, q), row)]
        if spec.qkv_bias:
            layer += [ParamTensor((q,), 0), ParamTensor((kv,), 0), ParamTensor((kv,), 0)]
        if spec.out_bias:
            layer.append(ParamTensor((h,), None))
        if spec.qk_norm:
            layer += [ParamTensor((d,), None), ParamTensor((d,), None)]
    if spec.is_moe:
        e = spec.num_experts
        layer += [ParamTensor((e, h), None), ParamTensor((e, 2 * f, h), 1, True), ParamTensor((e, h, f), 2, True)]
    elif spec.model_type == "gpt2":
        layer += [ParamTensor((h, f), col), ParamTensor((f,), 0), ParamTensor((f, h), row), ParamTensor((h,), None)]
    else:
        layer += [ParamTensor((f, h), col), ParamTensor((f, h), col), ParamTensor((h, f), row)]
        if spec.mlp_bias:
            layer += [ParamTensor((f,), 0), ParamTensor((f,), 0), ParamTensor((h,), None)]
    norm = [ParamTensor((h,), None)] * (2 if spec.norm_kind == "layernorm" else 1)
    layer += norm * 2
    first = [ParamTensor((spec.vocab_size, h), 0)]
    if spec.learned_positions:
        first.append(ParamTensor((spec.learned_positions, h), None))
    last = list(norm)
    if not spec.tied_embeddings:
        last.append(ParamTensor((spec.vocab_size, h), 0))
    return tuple(layer), tuple(first), tuple(last)
