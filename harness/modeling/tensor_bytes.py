"""Bytes that tensors hold: a DTensor counts its local shard, a tensor shared by two names counts once."""

from __future__ import annotations

from typing import Iterable, Optional

import torch


def tensor_bytes(tensor: Optional[torch.Tensor]) -> int:
    """Bytes of the elements a tensor holds (a DTensor counts only its local shard)."""
    if tensor is None:
        return 0
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        tensor = local
    return tensor.numel() * tensor.element_size()


def sum_tensor_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    seen, total = set(), 0
    for tensor in tensors:
        if tensor is None or tensor.numel() == 0:
            continue
        local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's own data_ptr() is 0
        key = (local.data_ptr(), local.numel(), local.dtype)
        if key in seen:
            continue
        seen.add(key)
        total += tensor_bytes(tensor)
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of per-parameter optimizer tensors (Adam moments); 0-d step counters are not state memory."""
    tensors = []
    for state in optimizer.state.values():
        tensors.extend(value for value in state.values() if torch.is_tensor(value) and value.dim() > 0)
    return sum_tensor_bytes(tensors)
