"""Engines: each turns a Plan into backend files and a launch line (`render`), and wraps the model (`apply`)."""

from __future__ import annotations

import importlib
from types import ModuleType

ENGINE_MODULES = {
    "deepspeed": "harness.engines.deepspeed",
    "fsdp": "harness.engines.fsdp",
    "nd": "harness.engines.nd",
    "megatron_lm": "harness.engines.megatron_lm",
}


def engine_module(name: str) -> ModuleType:
    if name not in ENGINE_MODULES:
        raise ValueError(f"engine.name={name!r} is not one of {sorted(ENGINE_MODULES)}")
    return importlib.import_module(ENGINE_MODULES[name])
