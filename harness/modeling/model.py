"""Build the Hugging Face model from its config fields (random init, no weights downloaded)."""

from __future__ import annotations

import contextlib
from typing import Any, Dict

import torch

from harness.config.model_shape import decoder_layer_name, hf_config_object, wrapped_layer


def build_model(fields: Dict[str, Any], seed: int, on_meta: bool = False) -> torch.nn.Module:
    """Same seed, same weights on every rank and in every layout: losses compare across layouts.

    `on_meta` builds shapes only (no storage, no initialisation cost): the engine shards the model, then
    materialises and initialises each rank's share (harness.engines.materialize)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        model = AutoModelForCausalLM.from_config(hf_config_object(fields), dtype=torch.float32)
    model.config.use_cache = False
    return model


def decoder_layer_class(model: torch.nn.Module) -> type:
    """The repeated block (wrap / checkpoint unit): the class `model_shape.decoder_layer_name` finds."""
    name = wrapped_layer({"decoder_layer": decoder_layer_name(model), "architecture": type(model).__name__,
                          "no_split_modules": list(getattr(model, "_no_split_modules", None) or [])})
    return next(type(module) for module in model.modules() if type(module).__name__ == name)
