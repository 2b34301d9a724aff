"""Meta-device placement of a Hugging Face causal LM's modules: free what a rank does not hold, and give a
meta-built, already sharded module real storage initialised as the model's own init does.

A rank of a large model never holds more than its share: the model is built on the meta device
(harness.modeling.model.build_model(on_meta=True)), the engine splits and shards it (pipeline stages,
DTensor TP, FSDP2), and only then does each rank allocate and initialise the local tensors it owns.
"""

from __future__ import annotations

from typing import List, Tuple

import torch


def materialize(module, model, device, seed: int) -> None:
    """Allocate `module`'s parameters and buffers on `device` (local shards for DTensors) and initialise
    them with `model._init_weights` (transformers' per-module init: normal(0, initializer_range) for
    linear and embedding weights, ones for norms, rotary inverse frequencies recomputed).

    Every rank seeds alike: DTensor's random ops draw each shard from its offset of one global stream
    where the device has an RNG tracker (CUDA), so a sharded weight equals the unsharded init and replicas
    agree; on CPU each shard draws the same local stream (replicas still agree; shards repeat values,
    which changes nothing a benchmark measures)."""
    aliases = shared_parameters(module)
    module.to_empty(device=device)
    retie(module, aliases)
    for tensor in (*module.parameters(), *module.buffers()):
        # transformers marks tensors it initialised at construction (here: on meta) and skips them later.
        if hasattr(tensor, "_is_hf_initialized"):
            del tensor._is_hf_initialized
    torch.manual_seed(seed)
    with torch.no_grad():
        for sub in module.modules():
            model._init_weights(sub)


def shared_parameters(module) -> List[Tuple[str, str]]:
    """(alias, owner) names of each parameter `module` holds under two names (tied input and output
    embeddings). `to_empty` allocates per module, so it would give the alias a tensor of its own: two
    matrices trained, and a second gradient and Adam state held."""
    owners, aliases = {}, []
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in owners:
            aliases.append((name, owners[id(param)]))
        else:
            owners[id(param)] = name
    return aliases


def retie(module, aliases: List[Tuple[str, str]]) -> None:
    """Point every alias back at its owner's (now allocated) parameter."""
    for alias, owner in aliases:
        parent, _, attr = alias.rpartition(".")
        setattr(module.get_submodule(parent), attr, module.get_parameter(owner))


def release_unowned(model, owned) -> None:
    """Move the model's modules that hold none of the parameters of `owned` (this rank's stage modules) to
    the meta device, freeing them; a meta-built model stays as it is."""
    kept = {id(param) for module in owned for param in module.parameters()}
    inner = model.model
    for module in (inner.embed_tokens, *inner.layers, inner.norm, model.lm_head):
        if not any(id(param) in kept for param in module.parameters()):
            module.to("meta")
