"""What one forward of a transformers model keeps for its backward, counted from outside the model: every storage
autograd packs (saved_tensors_hooks) and every tensor the garbage collector can reach after the forward (where
torch's selective checkpointing caches the outputs it keeps), parameters and tensors alive before excluded.

    python tests/unit/plan/held_activations.py '<hf config as JSON>' MODE MICRO_BATCH SEQ_LEN

prints the bytes; MODE is none, selective (the nd engine's policy, harness.engines.nd_session) or full. One
process per measurement: tensors of an earlier model would be counted otherwise."""

from __future__ import annotations

import gc
import json
import sys
from typing import Any, Dict, Set

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from transformers import AutoConfig, AutoModelForCausalLM

from harness.engines.nd_session import _selective_policy


def _reachable_storages() -> Dict[int, int]:
    found = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and not obj.is_meta:
            storage = obj.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
    return found


def held_bytes(fields: Dict[str, Any], mode: str, micro_batch: int, seq_len: int) -> int:
    torch.manual_seed(0)
    config = AutoConfig.for_model(**fields)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=fields.get("attn_implementation", "sdpa"))
    model = model.train()
    if mode != "none":
        options = {"context_fn": _selective_policy()} if mode == "selective" else {}
        for index, layer in enumerate(model.model.layers):
            model.model.layers[index] = checkpoint_wrapper(layer, preserve_rng_state=False, **options)
    ids = torch.randint(0, config.vocab_size, (micro_batch, seq_len))
    gc.collect()
    before: Set[int] = set(_reachable_storages()) | {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: Dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = model(input_ids=ids, labels=ids)
    gc.collect()
    kept.update(_reachable_storages())
    del output
    return sum(nbytes for pointer, nbytes in kept.items() if pointer not in before)


if __name__ == "__main__":
    print(held_bytes(json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
