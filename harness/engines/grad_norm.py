"""Global gradient-norm clipping over any mix of plain tensors and DTensors on different device meshes."""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from harness.engines.shards import local_shard


def shard_count(grad) -> int:
    """How many distinct pieces the full gradient is cut into across this gradient's mesh (1: a plain tensor).

    Every mesh dim whose placement is not Replicate cuts the tensor, each rank along it holding a different
    piece. Asking `is_shard()` instead misses FSDP2's `_StridedShard`, the data-axis placement of a parameter
    tensor parallelism already split on the same dim (q/k/v, gate/up, embedding, lm_head): in torch 2.13 it is
    not a `Shard` subclass and its `is_shard()` is False (pytorch/pytorch PR #167887 changes that).
    """
    if not isinstance(grad, DTensor):
        return 1
    count = 1
    for size, placement in zip(grad.device_mesh.shape, grad.placements):
        if placement.is_partial():
            raise RuntimeError(f"unreduced (Partial) gradient with placements {grad.placements}")
        count *= 1 if placement.is_replicate() else size
    return count


def clip_grad_norm(grads: Iterable, max_norm: float, ranks_per_model: int, device, group=None) -> float:
    """Scale `grads` in place to a global L2 norm of at most `max_norm`; returns the norm before clipping.

    torch's rule (coefficient max_norm / (norm + 1e-6), clamped to 1), computed without stacking DTensors:
    torch.nn.utils.get_total_norm stacks the per-tensor norms, which fails once gradients live on two meshes
    (FSDP2 with tp: norm weights on the data mesh, projections on the (data, tp) mesh). Instead each rank sums
    the squares of its local shards, each weighted by shards / ranks_per_model, and one all-reduce over `group`
    (every rank that holds a piece of the model, `ranks_per_model` of them per model copy, e.g. one pipeline
    stage's ranks) adds them: a piece held by r = ranks_per_model / shards ranks is counted r times 1/r, so each
    element counts exactly once, whatever its placements.
    """
    grads = [grad for grad in grads if grad is not None]
    total = torch.zeros((), dtype=torch.float64, device=device)
    for grad in grads:
        local = local_shard(grad)
        if local.numel():
            total += local.double().pow(2).sum().to(device) * (shard_count(grad) / ranks_per_model)
    dist.all_reduce(total, group=group)
    norm = float(total.sqrt())
    coef = min(1.0, max_norm / (norm + 1e-6))
    if coef < 1.0:
        for grad in grads:
            local_shard(grad).mul_(coef)
    return norm
