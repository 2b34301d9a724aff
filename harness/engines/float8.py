"""FP8 training on the ranks: torchao's float8 linears, converted before any parallelism is applied (torchtitan's
converter order), from the settings the launch side rendered (harness.plan.regime.torchao_float8_config)."""

from __future__ import annotations

from typing import Any, Dict


def convert_to_float8(model, settings: Dict[str, Any]) -> None:
    """Swap the decoder layers' nn.Linear modules for torchao Float8Linear (in place)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    skip, multiple = set(settings["skip_modules"]), settings["dim_multiple"]

    def keep(module, fqn: str) -> bool:
        if fqn.rsplit(".", 1)[-1] in skip:
            return False
        return module.in_features % multiple == 0 and module.out_features % multiple == 0

    config = Float8LinearConfig.from_recipe_name(settings["recipe_name"])
    if settings["enable_fsdp_float8_all_gather"]:
        config = Float8LinearConfig(**{**config.__dict__, "enable_fsdp_float8_all_gather": True})
    convert_to_float8_training(model, config=config, module_filter_fn=keep)


def float8_linear_count(model) -> int:
    """The torchao Float8Linear modules in `model` (by class name: a run without FP8 never imports torchao)."""
    return sum(type(module).__name__ == "Float8Linear" for module in model.modules())
