"""When FSDP frees a unit's gathered parameters after its forward: one rule for the nd engine's plan and for the
time and memory models that predict it."""

from __future__ import annotations

from typing import Any


def reshard_after_forward(layout: Any) -> bool:
    """FSDP2's `reshard_after_forward` for a layout whose parameters are sharded over the data axis.

    ZeRO-3 (FULL_SHARD) frees each unit's gathered parameters after its forward and gathers them again for its
    backward; ZeRO-2 (SHARD_GRAD_OP) keeps them from forward to backward. Under pipeline parallelism a stage runs
    a forward and a backward for every micro-batch, and torch's pipelining already keeps the parameters gathered
    after each backward but the last (PipelineStage.backward_maybe_with_nosync sets reshard_after_backward False,
    perform_reduce_grad reshards once per step): resharding after forward would gather the stage again in every
    micro-batch. So pipelining keeps them gathered, as torchtitan does ("to avoid per-microbatch all-gathers":
    torchtitan/distributed/fsdp.py, get_fsdp_reshard_after_forward_policy's default): one all-gather per unit
    and step, the stage's unsharded parameters live across the step's micro-batches.
    """
    return layout.zero_stage >= 3 and layout.pp == 1
