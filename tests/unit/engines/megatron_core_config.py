"""megatron.core's TransformerConfig built from pretrain_gpt.py flags, as Megatron-LM's
`core_transformer_config_from_args` does: its __post_init__ (and ModelParallelConfig's, its base) is
Megatron's own validation of heads, query groups, tensor / pipeline / context / expert parallelism,
virtual stages, pipeline layouts, MoE and recompute settings. megatron-core is a test dependency."""

from __future__ import annotations

from typing import Any, Dict


def transformer_config(flags: Dict[str, Any]):
    """megatron.core TransformerConfig from pretrain_gpt.py flags (as core_transformer_config_from_args)."""
    import megatron.core.transformer.transformer_config as core
    import torch
    import torch.nn.functional as F

    f = flags
    dtype = torch.bfloat16 if f.get("--bf16") else torch.float16 if f.get("--fp16") else torch.float32
    pp = f["--pipeline-model-parallel-size"]
    vpp = None
    if "--num-layers-per-virtual-pipeline-stage" in f:
        vpp = f["--num-layers"] // pp // f["--num-layers-per-virtual-pipeline-stage"]
    return core.TransformerConfig(
        num_layers=f["--num-layers"], hidden_size=f["--hidden-size"], ffn_hidden_size=f["--ffn-hidden-size"],
        num_attention_heads=f["--num-attention-heads"], kv_channels=f["--kv-channels"],
        num_query_groups=f.get("--num-query-groups"),
        tensor_model_parallel_size=f["--tensor-model-parallel-size"], pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        pipeline_model_parallel_layout=f.get("--pipeline-model-parallel-layout"),
        context_parallel_size=f["--context-parallel-size"],
        expert_model_parallel_size=f["--expert-model-parallel-size"],
        sequence_parallel=f.get("--sequence-parallel", False),
        num_moe_experts=f.get("--num-experts"), moe_router_topk=f.get("--moe-router-topk", 2),
        moe_router_load_balancing_type=f.get("--moe-router-load-balancing-type", "aux_loss"),
        moe_aux_loss_coeff=f.get("--moe-aux-loss-coeff", 0.0),
        moe_token_dispatcher_type=f.get("--moe-token-dispatcher-type", "allgather"),
        gated_linear_unit=f.get("--swiglu", False), activation_func=F.silu if f.get("--swiglu") else F.gelu,
        bias_activation_fusion=False,
        add_bias_linear=not f.get("--disable-bias-linear", False), add_qkv_bias=f.get("--add-qkv-bias", False),
        qk_layernorm=f.get("--qk-layernorm", False),
        normalization=f["--normalization"], layernorm_epsilon=f["--norm-epsilon"],
        attention_dropout=f["--attention-dropout"], hidden_dropout=f["--hidden-dropout"],
        bf16=f.get("--bf16", False), fp16=f.get("--fp16", False), params_dtype=dtype,
        pipeline_dtype=dtype if pp > 1 else None,
        recompute_granularity=f.get("--recompute-granularity"), recompute_method=f.get("--recompute-method"),
        recompute_num_layers=f.get("--recompute-num-layers"),
        # arguments.py's tuple_type and moe_freq_type: "4095,0" -> (4095, 0), "[1,0]" -> [1, 0]
        window_size=tuple(int(i) for i in f["--window-size"].strip("()").split(",")) if "--window-size" in f else None,
        window_attn_skip_freq=([int(i) for i in f["--window-attn-skip-freq"].strip("[]").split(",")]
                               if "--window-attn-skip-freq" in f else None),
        fp8=f.get("--fp8-format"), fp8_amax_history_len=f.get("--fp8-amax-history-len", 1),
        fp8_amax_compute_algo=f.get("--fp8-amax-compute-algo", "most_recent"),
    )  # fmt: skip
