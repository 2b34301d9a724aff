"""Shared helpers of the plan tests: model shapes, presets, configs and transformers' own counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import yaml

from harness.config.schema import (
    BenchConfig, ClusterConfig, LayoutConfig, ModelConfig, RunConfig, engine_config,
)

ROOT = Path(__file__).resolve().parents[3]
MODEL_PRESETS = sorted((ROOT / "hydra_configs" / "model").glob("*.yaml"))

# Published config.json shapes, kept here so the tests do not depend on the presets being present.
REAL_SHAPES: Dict[str, Dict[str, Any]] = {
    "llama3_1_8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        max_position_embeddings=131072, tie_word_embeddings=False),
    "llama3_1_70b": dict(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                         max_position_embeddings=131072, tie_word_embeddings=False),
    "llama3_1_405b": dict(model_type="llama", vocab_size=128256, hidden_size=16384, intermediate_size=53248,
                          num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8, head_dim=128,
                          max_position_embeddings=131072, tie_word_embeddings=False),
    "mistral_7b": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=32768, sliding_window=4096, tie_word_embeddings=False),
    "qwen2_5_7b": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=131072, tie_word_embeddings=False),
    "mixtral_8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
                         tie_word_embeddings=False),
    "gpt2": dict(model_type="gpt2", vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
                 n_inner=None, activation_function="gelu_new", tie_word_embeddings=True),
    "tiny_llama": dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, tie_word_embeddings=False),
}


def preset(path: Path) -> Dict[str, Any]:
    return yaml.safe_load(path.read_text())


def run_config(model: str = "tiny_llama", hf_config: Dict[str, Any] = None, engine: Dict[str, Any] = None,
               cluster: Dict[str, Any] = None, bench: Dict[str, Any] = None, **layout: Any) -> RunConfig:
    """A RunConfig on the 2-process CPU cluster unless told otherwise; keyword arguments go to the layout."""
    cluster_fields = dict(name="cpu", nodes=1, accelerators_per_node=2, accelerator="cpu",
                          memory_per_accelerator_gib=8.0)
    cluster_fields.update(cluster or {})
    if cluster_fields["accelerator"] != "cpu":  # a GPU node's host (DGX H100: 2 TiB), unless the test names one
        cluster_fields.setdefault("host_memory_gib", 2048.0)
    layout_fields = dict(dp_shard=2, zero_stage=2, micro_batch=2, seq_len=64)
    layout_fields.update(layout)
    return RunConfig(
        model=ModelConfig(name=model, hf_config=dict(hf_config or REAL_SHAPES[model])),
        engine=engine_config(**(engine or {})),
        layout=LayoutConfig(**layout_fields),
        cluster=ClusterConfig(**cluster_fields),
        bench=BenchConfig(**(bench or {})),
    )


def meta_model(fields: Dict[str, Any]):
    """transformers' own model for these config fields, on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))


def hf_counts(model, experts_per_token: int = 0, num_experts: int = 0, zero_experts: int = 0,
              idle: Dict[str, int] = None) -> Dict[str, int]:
    """Total (tied counted once), embedding (nn.Embedding tables) and active-per-token parameters. With Z
    zero-computation experts beside the E real ones (LongCat-Flash's fused expert tensors), a token's k picks
    reach k·E / (E + Z) real experts, each its slice (dim 0) of every expert tensor. Idle parameters (name:
    numel, in modules a text forward never runs) are neither embedding nor active."""
    import torch

    idle = idle or {}
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(m.weight.numel() for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Embedding) and f"{name}.weight" not in idle)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    active = total - experts + (experts * experts_per_token // num_experts if num_experts else experts)
    if zero_experts:
        slices = sum(p.numel() // p.shape[0] for name, p in model.named_parameters() if ".experts." in name)
        active = total - experts + slices * experts_per_token * num_experts // (num_experts + zero_experts)
    active -= sum(idle.values())
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding, "active": active}
