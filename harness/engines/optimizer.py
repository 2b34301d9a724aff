"""The optimizer every engine runs: AdamW with one set of betas and eps, so that engines compare on equal terms."""

from __future__ import annotations

from typing import Any, Dict

from harness.config.schema import BenchConfig

# GPT-3's AdamW settings (Brown et al. 2020, appendix B: beta1 0.9, beta2 0.95, eps 1e-8), as Megatron-LM and
# torchtitan train LLMs.
ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8


def adamw_settings(bench: BenchConfig) -> Dict[str, Any]:
    """AdamW's arguments as data (learning rate and weight decay from the bench settings)."""
    return {"lr": bench.lr, "betas": list(ADAMW_BETAS), "eps": ADAMW_EPS, "weight_decay": bench.weight_decay}
