"""What one rank holds of a tensor that may be a DTensor, and the state bytes of a rank whose weights are shards."""

from __future__ import annotations

from typing import Dict, Iterable

import torch
from torch.distributed.tensor import DTensor

from harness.modeling.tensor_bytes import optimizer_state_bytes, sum_tensor_bytes


def local_shard(tensor):
    """The tensor this rank stores: a DTensor's local shard (its storage, so in-place ops reach the DTensor),
    any other tensor (or None) itself."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def plain(tensor):
    """A plain tensor of a (possibly replicated DTensor) value such as a scalar loss."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def sharded_state_bytes(params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> Dict[str, int]:
    """Exact local bytes of parameters, gradients and optimizer state where the sharded parameters are the
    fp32 master weights (FSDP2, FSDP1's flat shards, DTensor TP): each DTensor counts its local shard only,
    and there is no separate master copy."""
    params = list(params)
    return {
        "param_bytes": sum_tensor_bytes(map(local_shard, params)),
        "grad_bytes": sum_tensor_bytes(local_shard(p.grad) for p in params),
        "optimizer_bytes": optimizer_state_bytes(optimizer),
        "host_bytes": 0,
    }
