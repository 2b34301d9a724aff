"""Tiny configs of every decoder-only transformers family with a tensor-parallel plan, and a FLOP count of
their own forward + backward (torch.utils.flop_counter)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, Tuple

# One small value per config key, applied where the family's config has that key.
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4,
            moe_num_experts=4, num_experts_per_tok=2, moe_k=2, top_k=2, n_shared_experts=1,
            first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, n_group=1, topk_group=1, sliding_window=32, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8)
# Where one value does not fit a family's own rules.
FAMILY_FIELDS: Dict[str, Dict[str, Any]] = {
    # Mamba-2 heads of 16 dims, a 16-dim state, 32-token scan chunks (the defaults are a full-size model's)
    "granitemoehybrid": dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=32),
    "nemotron_h": dict(mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=32,
                       moe_shared_expert_intermediate_size=32),
    # Phi-4-multimodal's image and audio encoders, small (a text forward holds them idle)
    "phi4_multimodal": dict(vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=2),
                            audio_config=dict(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2,
                                              ext_pw_out_channel=32, depthwise_separable_out_channel=32,
                                              nemo_conv_channels=32)),
    "minimax": dict(block_size=8),  # two lightning-attention blocks in the 16-token FLOP count
    # a Kimi delta attention layer (4 heads of 16 dims; bailing_hybrid's are its MLA head_dim) then a softmax
    # attention one; 2 of the 4 experts a token (the experts-per-token defaults exceed the tiny expert count)
    "kimi_linear": dict(linear_num_heads=4, linear_head_dim=16, layer_types=["linear_attention", "full_attention"],
                        num_experts_per_token=2, num_shared_experts=1),
    "bailing_hybrid": dict(layer_group_size=2, num_experts_per_token=2, num_shared_experts=1, num_expert_group=1),
    # Gemma 4: global layers with 32-dim heads and keys as values (one kv head), the last two layers reading the
    # keys and values of the first two (with double-wide MLPs); gemma4_text also with its MoE block beside the
    # MLP and small per-layer embeddings (the default table is 262144 x 256 per layer)
    **{name: dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2, global_head_dim=32,
                  attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2,
                  use_double_wide_mlp=True, **extra)
       for name, extra in (("gemma4_unified_text", {}),
                           ("gemma4_text", dict(enable_moe_block=True, top_k_experts=2, vocab_size_per_layer_input=256,
                                                hidden_size_per_layer_input=16)))},
    # Inkling: a sliding-window layer of 8 heads of 8 dims (4 kv heads) and a full one of TINY's heads, a dense MLP
    # then a MoE one, relative-position banks of 32 (the window) and 48 distances
    "inkling_text": dict(swa_num_attention_heads=8, swa_num_key_value_heads=4, swa_head_dim=8, local_layer_ids=[0],
                         sliding_window_size=32, rel_extent=48, mlp_layer_types=["dense", "sparse"]),
    # Inkling 2: sliding-window and full layers alternating (dynamic short convolutions of keys and values in the
    # full ones, whose block attention residual has 3 queries), blocks of 2 layers (the stacked block states grow
    # at layers 0 and 2: 2, 2, 3 entries before the attention of layers 1..3, 2, 2, 3, 3 before the MLP, 3 before
    # the final norm); every vocabulary row a real token's (the loss reads the unpadded ones only)
    "inkling2_text": dict(num_hidden_layers=4, layer_types=["hybrid_sliding", "hybrid"] * 2,
                          n_layers_per_attn_res_block=2, swa_num_attention_heads=8, swa_num_key_value_heads=4,
                          swa_head_dim=8, sliding_window_size=32, rel_extent=48, unpadded_vocab_size=256),
    # A Gated DeltaNet layer, then a QSA-indexed attention layer: 4-token key blocks (four complete blocks in
    # the 16-token FLOP count), a 32-token budget (the defaults leave the indexer unset)
    "qwen4_exp_text": dict(layer_types=["linear_attention", "indexed_attention"], indexer_n_heads=2,
                           indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=32, indexer_compress_ratio=4),
    # one short-convolution layer with a dense MLP, one attention layer with the MoE (no default layer_types)
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    # four layers (local, global, local, global), the last two reading the first two's keys and values; per-layer
    # inputs of 8 dims from a 128-token table, a rank-8 Laurel residual (the defaults are a full-size model's)
    "gemma3n_text": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                         num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
                         laurel_rank=8),
    # 2 declared layers (each two attention + MLP halves and a shortcut MoE), 4 real and 4 zero-computation
    # experts, 2 picks a token: 2·4/8 = 1 real expert a token
    "longcat_flash": dict(num_layers=2, ffn_hidden_size=96, expert_ffn_hidden_size=32, moe_topk=2, zero_expert_num=4),
    # DeepSeek-V4's default layer_types at 4 layers (heavily compressed, HCA, HCA, compressed sparse, CSA), one
    # shared key-value head, entries pooled from 4-token (CSA) and 8-token (HCA) windows (four and two complete
    # ones in the 16-token FLOP count), an indexer of 2 heads of 16 dims keeping 8 entries
    "deepseek_v4": dict(num_hidden_layers=4, num_key_value_heads=1, index_n_heads=2, index_head_dim=16, index_topk=8,
                        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}),
    # rotary parameters per layer type (a NoPE global layer), M-RoPE sections within the 8 frequencies of 16 dims
    "cohere_compass_text": dict(layer_types=["sliding_attention", "full_attention"], rope_parameters={
        "sliding_attention": dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2]),
        "full_attention": None}),
}
# Configs beyond a family's tiny one, for what it does not reach: case name -> (family, fields over the tiny ones).
# DeepSeek-V4 with sliding-window layers only: its hyper-connections (the N x N stream mixing included), shared-
# key-value attention with sinks, grouped output projection, hash-routed and top-k MoE layers, without the
# compressed attention layers of its default config.
VARIANTS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "deepseek_v4_sliding": ("deepseek_v4", dict(num_hidden_layers=2, layer_types=["sliding_attention"] * 2,
                                                mlp_layer_types=["hash_moe", "moe"], num_key_value_heads=1)),
    # HRM with three H cycles of two L runs, L_bp_cycles [0, 2] left-padded to [1, 0, 2]: the L stack's layers run
    # 1 + 0 + 2 = 3 times with gradient and 3 under no_grad (a cycle without any, one with all), the H stack's 3
    "hrm_text_cycles": ("hrm_text", dict(H_cycles=3, L_cycles=2, L_bp_cycles=[0, 2])),
}
# The FLOP count's config where a family's transformers forward runs matmuls that are not the model's FLOPs.
# Llama 4's text MoE multiplies every routed expert for every token (the router's sigmoid scores are 0 for
# the experts a token is not routed to): with every expert routed (k = E) its matmuls are the model's.
FLOP_FIELDS: Dict[str, Dict[str, Any]] = {
    "llama4_text": {"num_experts_per_tok": TINY["num_local_experts"]},
    # LongCat-Flash routes among real and zero-computation experts by its router's scores: with every expert
    # picked (k = E + Z) each token reaches all E real ones, k·E / (E + Z) = E, whatever the scores.
    "longcat_flash": {"moe_topk": 8},
}


def family_names() -> Tuple[str, ...]:
    """Decoder-only causal LM families whose config carries a `base_model_tp_plan`."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    names = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
            continue
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # composite configs that need sub-configs
            continue
        if getattr(config, "base_model_tp_plan", None) and not getattr(config, "is_encoder_decoder", False):
            names.append(model_type)
    return tuple(names)


@lru_cache(maxsize=None)
def _default_fields(model_type: str) -> Dict[str, Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]().to_dict()


def tiny_fields(model_type: str) -> Dict[str, Any]:
    base = _default_fields(model_type)
    text = base.get("text_config")
    if "num_hidden_layers" not in base and isinstance(text, dict) and text.get("model_type"):
        # a composite config whose causal LM is its text decoder (Llama 4): the text decoder's tiny config
        inner = {k: v for k, v in tiny_fields(text["model_type"]).items() if k != "model_type"}
        return {"model_type": model_type, "text_config": inner, **FAMILY_FIELDS.get(model_type, {})}
    fields = {k: v for k, v in TINY.items() if k in base}
    if "qk_rope_head_dim" in base:  # multi-latent attention: head_dim is the rotary dim
        fields["head_dim"] = fields["qk_rope_head_dim"]
    if "kv_lora_rank" in base:  # ... and every head has its own keys and values
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    fields.update(FAMILY_FIELDS.get(model_type, {}))
    return {"model_type": model_type, **fields}


def case_fields(case: str) -> Dict[str, Any]:
    """The tiny config of a family, or of a VARIANTS case."""
    family, extra = VARIANTS.get(case, (case, {}))
    return {**tiny_fields(family), **extra}


def flop_fields(case: str) -> Dict[str, Any]:
    """The tiny config whose forward + backward FLOPs are counted (FLOP_FIELDS applied)."""
    family = VARIANTS.get(case, (case,))[0]
    fields = {**case_fields(case), **FLOP_FIELDS.get(family, {})}
    text = fields.get("text_config")
    if isinstance(text, dict):  # a composite config: its text decoder's FLOP_FIELDS
        fields["text_config"] = {**text, **FLOP_FIELDS.get(_default_fields(family)["text_config"]["model_type"], {})}
    return fields


@lru_cache(maxsize=None)
def family_meta_model(case: str):
    """The tiny model (of a family or a VARIANTS case) on the meta device, built once per session."""
    from plan_helpers import meta_model

    return meta_model(case_fields(case))


# Families holding modules a text forward never runs (Phi-4-multimodal's image and audio encoders).
IDLE_MODULES = ("phi4_multimodal",)


@lru_cache(maxsize=None)
def idle_parameters(case: str) -> Dict[str, int]:
    """Parameters (name: numel) of the modules a text forward of the tiny model never calls, found by forward
    hooks on a CPU forward; empty for the families whose every module runs."""
    if VARIANTS.get(case, (case,))[0] not in IDLE_MODULES:
        return {}
    import torch
    from transformers import AutoModelForCausalLM

    from harness.config.model_shape import hf_config_object

    model = AutoModelForCausalLM.from_config(hf_config_object(case_fields(case)), dtype=torch.float32)
    called = set()
    for name, module in model.named_modules():
        module.register_forward_pre_hook(lambda _m, _a, name=name: called.add(name))
    ids = torch.randint(3, 200, (1, 16))
    model(input_ids=ids, labels=ids)
    return {name: p.numel() for name, p in model.named_parameters() if name.rsplit(".", 1)[0] not in called}


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """A convolution's backward: the input gradient and the weight gradient each multiply as many pairs as the
    forward. torch's own formula (flop_counter.conv_backward_flop) counts the weight gradient of a grouped
    convolution as if it were dense, C times too many for a depthwise one (C = channels, Mamba's conv1d)."""
    from torch.utils.flop_counter import conv_flop_count

    return (int(output_mask[0]) + int(output_mask[1])) * conv_flop_count(x_shape, w_shape, grad_out_shape,
                                                                         transposed)


def triangular_solve_flops(a_shape, b_shape, *args, unitriangular=False, out_shape=None, **kwargs) -> int:
    """A triangular solve with m right-hand sides (torch's counter has no formula): n(n - 1)/2 multiply-adds
    per column with a unit diagonal, n(n + 1)/2 with divisions by the diagonal counted as multiplies."""
    n, m = a_shape[-1], b_shape[-1]
    batch = 1
    for size in b_shape[:-2]:
        batch *= size
    return batch * m * n * (n - 1 if unitriangular else n + 1)


# transformers' torch fallbacks that contract operands elementwise (a broadcast product, then a sum over a dim)
# where a fused kernel runs a GEMM: Kimi delta attention's per-channel-decayed scores and the row-by-row inverse
# of its chunk system; Inkling 2's dynamic short convolution, (windows * taps).sum(-1) with taps the static
# weights plus per-token projected ones (a function of the modeling module, or Class.method).
# ElementwiseContractions counts them inside these functions only.
CONTRACTING_FALLBACKS = ("chunk_kimi_delta_attention", "Inkling2DynamicShortConvolution.forward")


def elementwise_contractions():
    """A TorchDispatchMode counting the elementwise contractions torch's FLOP counter does not see (its formulas
    are matmuls, convolutions and attention). Inside a fallback named in CONTRACTING_FALLBACKS (`inside`, set by
    contracting_fallbacks), a sum over dims (aten.sum.dim_IntList) of an aten.mul's output, a square x·x
    excepted (a norm), is a contraction: 2 FLOPs per element of the product it sums, one multiply-add per pair as
    a matmul of the same pairs counts (the decay weighting the pairs is part of the product). The product's mul
    and the muls it multiplies (a·b·c) are marked on their autograd nodes, and in the backward each sum those
    nodes run (torch._C._current_autograd_node names the node running) counts the same way: the reduction over a
    broadcast dim that gives a factor its gradient (a factor of full shape gets its gradient elementwise, no sum,
    nothing counted). A factor that is itself a broadcast sum of terms (aten.add inside the fallback: Inkling 2's
    static taps plus per-token ones) is marked too: each reduction its backward runs to give a term its gradient
    (the product's gradient summed over the term's broadcast dims) counts the same way."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten, mark = torch.ops.aten, "elementwise_contraction"

    class ElementwiseContractions(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.flops, self.inside, self.products = 0, 0, {}  # id -> (output, its factors; () for a sum)

        def product(self, tensor):
            entry = self.products.get(id(tensor))
            return entry if entry is not None and entry[0]() is tensor else None

        def mark(self, tensor):
            entry = self.product(tensor)
            if entry is not None and tensor.grad_fn is not None:  # a product, or a sum of broadcast terms (no factors)
                tensor.grad_fn.metadata[mark] = True
                for factor in entry[1]:
                    if factor() is not None:
                        self.mark(factor())

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self.inside and func is aten.mul.Tensor and all(isinstance(a, torch.Tensor) for a in args[:2]) \
                    and args[0] is not args[1]:
                self.products[id(out)] = (weakref.ref(out), tuple(weakref.ref(a) for a in args[:2]))
            elif self.inside and func is aten.add.Tensor and all(isinstance(a, torch.Tensor) for a in args[:2]) \
                    and args[0].shape != args[1].shape:
                self.products[id(out)] = (weakref.ref(out), ())
            elif func is aten.sum.dim_IntList:
                node = torch._C._current_autograd_node()
                if self.inside and self.product(args[0]) is not None and self.product(args[0])[1]:
                    self.mark(args[0])
                    self.flops += 2 * args[0].numel()
                elif node is not None and node.metadata.get(mark):
                    self.flops += 2 * args[0].numel()
            return out

    return ElementwiseContractions()


def contracting_fallbacks(model, counter):
    """Wraps the CONTRACTING_FALLBACKS of the model's own modeling module so that `counter.inside` is set while
    one runs; an ExitStack to enter around the counted forward + backward."""
    import contextlib
    import sys
    from unittest import mock

    module, stack = sys.modules[type(model).__module__], contextlib.ExitStack()

    def scoped(fallback):
        def run(*args, **kwargs):
            counter.inside += 1
            try:
                return fallback(*args, **kwargs)
            finally:
                counter.inside -= 1
        return run

    for name in CONTRACTING_FALLBACKS:
        owner_name, _, attribute = name.rpartition(".")
        owner = getattr(module, owner_name, None) if owner_name else module
        if owner is not None and hasattr(owner, attribute):
            stack.enter_context(mock.patch.object(owner, attribute, scoped(getattr(owner, attribute))))
    return stack


def cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's fused CPU attention (F.scaled_dot_product_attention's CPU kernel; Inkling 2's block attention
    residuals call it directly): its QK^T and AV, as torch counts the CUDA kernels (sdpa_flop_count)."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                            **kwargs) -> int:
    """The fused CPU attention's backward: its gradient products, dO·V^T and P^T·dO (AV's), dS·K and dS^T·Q
    (QK^T's), twice the forward as for any product whose two operands carry a gradient (the kernel computes all
    three). The kernel also recomputes the scores Q·K^T from the saved log-sum-exp (torch's CUDA formula,
    sdpa_backward_flop_count, counts that too): recomputation, which model FLOPs leave out."""
    b, heads, queries, qk = query_shape
    keys, v = key_shape[-2], value_shape[-1]
    return 2 * 2 * b * heads * queries * keys * (qk + v)


@lru_cache(maxsize=None)
def measured_flops(case: str, seq_len: int) -> float:
    """FLOPs torch counts for one forward + backward of one sequence: eager attention and eager experts,
    so that every matmul is an aten op the counter knows; with the elementwise contractions of the fallbacks
    named in CONTRACTING_FALLBACKS (elementwise_contractions)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    from harness.config.model_shape import hf_config_object

    fields = dict(flop_fields(case), attn_implementation="eager")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config_object(fields), dtype=torch.float32,
                                             experts_implementation="eager")
    ids = torch.randint(3, model.config.vocab_size, (1, seq_len))
    contractions = elementwise_contractions()
    with FlopCounterMode(display=False,
                         custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops,
                                         torch.ops.aten.linalg_solve_triangular: triangular_solve_flops,
                                         torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa_flops,
                                         torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
                                             cpu_sdpa_backward_flops}) as counter, \
            contractions, contracting_fallbacks(model, contractions):
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return float(counter.get_total_flops() + contractions.flops)
