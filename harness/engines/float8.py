"""FP8 training on the ranks: torchao's float8 linears, converted before any parallelism is applied (torchtitan's
converter order), from the settings the launch side rendered (harness.plan.regime.torchao_float8_config)."""

from __future__ import annotations

from typing import Any, Dict


def convert_to_float8(model, settings: Dict[str, Any]) -> None:
    """Swap the decoder layers' nn.Linear modules for torchao Float8Linear (in place)."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:  # not a declared dependency: FP8 runs only on FP8 GPUs with torchao installed
        raise RuntimeError("layout.precision=fp8 needs torchao's float8 training (pip install torchao) on an FP8 "
                           f"GPU: {exc}") from exc
    skip, multiple = set(settings["skip_modules"]), settings["dim_multiple"]

    def keep(module, fqn: str) -> bool:
        if fqn.rsplit(".", 1)[-1] in skip:
            return False
        return module.in_features % multiple == 0 and module.out_features % multiple == 0

    config = Float8LinearConfig.from_recipe_name(settings["recipe_name"])
    if settings["enable_fsdp_float8_all_gather"]:
        config = Float8LinearConfig(**{**config.__dict__, "enable_fsdp_float8_all_gather": True})
    convert_to_float8_training(model, config=config, module_filter_fn=keep)
