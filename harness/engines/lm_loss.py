"""The causal-LM loss as the engines compute it outside the model: next-token labels, mean cross-entropy, and
the loss of one micro-batch whose sequence is split over context-parallel ranks."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor.experimental import context_parallel

from harness.engines.shards import plain

# transformers' label for "no loss here" (ForCausalLMLoss's ignore_index): the last position of each row.
IGNORE_INDEX = -100


def shifted_labels(tokens: torch.Tensor) -> torch.Tensor:
    """Next-token labels; the last position of each row is ignored (transformers' ForCausalLMLoss)."""
    pad = torch.full_like(tokens[:, :1], IGNORE_INDEX)
    return torch.cat([tokens[:, 1:], pad], dim=1)


def causal_lm_loss(logits, labels):
    """Mean cross-entropy over the labelled positions (a DTensor under loss parallelism)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=IGNORE_INDEX)


def context_parallel_loss(forward: Callable, tokens: torch.Tensor, cp_mesh, n_micro: int) -> torch.Tensor:
    """Forward and backward of one micro-batch with its sequence split over the `cp_mesh` ranks (load-balanced
    causal chunks, torch's context_parallel); `forward(tokens, positions) -> logits`.

    Labels are shifted before the split (the model's own shift would pair tokens across chunk borders) and
    positions are global. Each rank's loss is its labelled tokens' summed cross-entropy over the micro-batch's
    mean count per cp rank, so the gradient mean over the data x cp ranks is the exact micro-batch mean; the
    returned loss is that mean, on every rank.
    """
    cp = cp_mesh.size()
    labels = shifted_labels(tokens)
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens).contiguous()
    count = (labels != IGNORE_INDEX).sum()
    buffers = [tokens, labels, positions]
    with context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(buffers)):
        logits = forward(tokens, positions)
        summed = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1), ignore_index=IGNORE_INDEX,
                                 reduction="sum")  # fmt: skip
        loss = summed * cp / count
        (loss / n_micro).backward()
    value = plain(loss).detach().float()
    dist.all_reduce(value, group=cp_mesh.get_group())
    return value / cp
