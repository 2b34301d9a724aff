"""Bytes per parameter each engine keeps for each training state, and which ZeRO stage shards them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional, Sequence, Tuple, Union

# fp8: activations, saved tensors and everything FP8 does not convert stay bf16 (harness.plan.regime).
COMPUTE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2}

# DeepSpeed's ZeRO bucket defaults (deepspeed/runtime/zero/config.py, 0.19.8): reduce_bucket_size and
# allgather_bucket_size 5e8 elements (reduce_bucket_size written into every rendered config: harness.engines.
# deepspeed), stage3_max_live_parameters 1e9. The time model counts collectives by them (time_model), the memory
# plan the reduction buckets (memory.deepspeed_bucket_bytes).
DEEPSPEED_BUCKET_NUMEL = 500_000_000
DEEPSPEED_MAX_LIVE_PARAMETERS = 1e9
# stage3_max_reuse_distance's default (the same config.py): ZeRO-3 keeps a parameter gathered after a module when
# its next use lies within this many elements of the trace (states.deepspeed_kept_numel).
DEEPSPEED_MAX_REUSE_DISTANCE = 1e9


def deepspeed_overlap_comm(zero_stage: int, accelerator: str) -> bool:
    """Whether a rendered ZeRO config overlaps the gradient reduction with backward: from stage 2 on an
    accelerator (DeepSpeed's own default is stage 3 only; on CPU ranks nothing runs beside the backward)."""
    return zero_stage >= 2 and accelerator != "cpu"


@dataclass(frozen=True)
class StateConvention:
    """One engine at one precision: bytes per parameter of each state (Rajbhandari et al. 2020, sec. 3.1:
    mixed-precision Adam keeps 2 + 2 + K bytes, K = 12 = fp32 master 4 + momentum 4 + variance 4)."""

    param: int  # the model's parameter tensors as they sit between steps
    grad: int  # gradients the backward writes
    master: int  # separate fp32 copy owned by the optimizer (0: the parameters are the master)
    moments: int  # Adam exp_avg + exp_avg_sq
    optimizer_grad: int = 0  # fp32 gradient copy the optimizer keeps between steps (Megatron fp16)
    working: int = 2  # bytes of the unsharded compute copy gathered when parameters are sharded
    # Lowest zero_stage at which each state is partitioned over the data-parallel shard group.
    param_shard_stage: int = 3
    grad_shard_stage: int = 2
    optimizer_shard_stage: int = 1  # master, moments and the optimizer's gradient copy
    # Unsharded layers alive at once at the param-sharding stage 3 (DeepSpeed: params + grads of the
    # live layer, its estimator's 4 x largest_layer bytes; FSDP2: current + prefetched layer).
    gathered_layers: int = 2
    # DeepSpeed ZeRO-3 also keeps gathered what it reuses within stage3_max_reuse_distance (states.gathered_bytes).
    kept_by_reuse: bool = False
    # How a partition is sized: "even" (numel / N, the ZeRO paper), "deepspeed" (flat groups padded to
    # 2 x N elements at ZeRO-1/2, each tensor padded to N at ZeRO-3), "dim0" (FSDP2: each tensor's
    # dim 0 chunked, padded to ceil(d0 / N) rows), "flat" (FSDP1: one flat parameter per wrapped unit,
    # see flat_shard_numel).
    partition: str = "even"
    # Bytes per parameter of a gradient once offloaded (the CPU optimizer steps in fp32).
    offload_grad: int = 4
    # Gradient and optimizer state for every parameter, given a gradient or not (DeepSpeed's flat partitions,
    # measured at ZeRO-3 with a no_grad sparse-attention indexer; FSDP1's flat parameter has one gradient per
    # unit); False: only for parameters the backward reaches (FSDP2 leaves .grad None and torch's AdamW
    # creates no state without a gradient, measured).
    states_for_untrained: bool = True
    # States held in buffers allocated once, at their exact size, for the whole run (Megatron-LM: its
    # DistributedDataParallel keeps every parameter and gradient in one contiguous buffer per dtype, its
    # communication buckets being views of it, core/distributed/param_and_grad_buffer.py _ParamAndGradBuffer; the
    # optimizer's fp32 shards and Adam state are allocated once and never freed). The allocator cannot fragment
    # them, so the memory allowance's fraction leaves them out (harness.plan.memory.allowance_bytes).
    preallocated: bool = False


# The one table. Keys: (engine, precision) or, for stage-specific behaviour, (engine, precision, stage).
# deepspeed: bf16/fp16 module weights + grads, fp32 master partition + moments (probed with 0.19.8 on
# 2 CPU ranks: ZeRO-1/2 keep a 4-byte master even in fp32; ZeRO-0 fp32 is plain torch AdamW).
# fsdp / nd (FSDP2 + MixedPrecisionPolicy): fp32 sharded parameters are the master, fp32 gradients,
# a bf16 copy gathered for compute; SHARD_GRAD_OP (stage 2) already shards parameters at rest.
# megatron_lm: Megatron-LM docs "distributed optimizer": bf16 6 + 12/d, fp16 4 + 16/d, fp32 8 + 8/d
# bytes per parameter (d = data-parallel size), i.e. fp32 main grads for bf16, an fp32 grad copy for fp16.
STATE_CONVENTIONS: Dict[Union[Tuple[str, str], Tuple[str, str, int]], StateConvention] = {
    ("deepspeed", "bf16"): StateConvention(2, 2, 4, 8, partition="deepspeed"),
    ("deepspeed", "fp16"): StateConvention(2, 2, 4, 8, partition="deepspeed"),
    ("deepspeed", "fp32"): StateConvention(4, 4, 4, 8, working=4, partition="deepspeed"),
    # DeepSpeed's ZeRO-1 reduce-scatters gradients into the rank's partition when backward returns
    # (measured with 0.19.8), so at the optimizer step it holds what ZeRO-2 holds; the full-size
    # gradients exist only during backward (and across accumulation steps).
    ("deepspeed", "bf16", 1): StateConvention(2, 2, 4, 8, grad_shard_stage=1, partition="deepspeed"),
    ("deepspeed", "fp16", 1): StateConvention(2, 2, 4, 8, grad_shard_stage=1, partition="deepspeed"),
    ("deepspeed", "fp32", 1): StateConvention(4, 4, 4, 8, working=4, grad_shard_stage=1, partition="deepspeed"),
    # ZeRO-3 keeps its gradient partition in the 16-bit accumulation dtype, on the host when the
    # optimizer is offloaded (stage3.py grad_partitions_flat_buffer); ZeRO-1/2 offload reduces
    # straight into the fp32 host partition (4 bytes, the default).
    ("deepspeed", "bf16", 3): StateConvention(2, 2, 4, 8, partition="deepspeed", offload_grad=2),
    ("deepspeed", "fp16", 3): StateConvention(2, 2, 4, 8, partition="deepspeed", offload_grad=2),
    ("deepspeed", "fp32", 0): StateConvention(4, 4, 0, 8, working=4),
    ("fsdp", "bf16"): StateConvention(4, 4, 0, 8, param_shard_stage=2, partition="dim0", states_for_untrained=False),
    ("fsdp", "fp16"): StateConvention(4, 4, 0, 8, param_shard_stage=2, partition="dim0", states_for_untrained=False),
    ("fsdp", "fp32"): StateConvention(4, 4, 0, 8, working=4, param_shard_stage=2, partition="dim0",
                                       states_for_untrained=False),
    ("nd", "bf16"): StateConvention(4, 4, 0, 8, param_shard_stage=2, partition="dim0", states_for_untrained=False),
    ("nd", "fp16"): StateConvention(4, 4, 0, 8, param_shard_stage=2, partition="dim0", states_for_untrained=False),
    ("nd", "fp32"): StateConvention(4, 4, 0, 8, working=4, param_shard_stage=2, partition="dim0",
                                       states_for_untrained=False),
    ("megatron_lm", "bf16"): StateConvention(2, 4, 4, 8, preallocated=True),
    ("megatron_lm", "fp16"): StateConvention(2, 2, 4, 8, optimizer_grad=4, preallocated=True),
    ("megatron_lm", "fp32"): StateConvention(4, 4, 0, 8, working=4, preallocated=True),
}

STATE_CONVENTIONS.update({key: replace(conv, kept_by_reuse=True) for key, conv in list(STATE_CONVENTIONS.items())
                          if key[0] == "deepspeed"})

# fp8 keeps bf16's states: torchao's Float8Linear holds the high-precision weight and casts it per GEMM,
# Transformer Engine likewise keeps bf16 parameters (its FP8 copies are transients; harness.plan.regime).
# DeepSpeed's row exists for the table's completeness; validation refuses fp8 there.
STATE_CONVENTIONS.update({(key[0], "fp8", *key[2:]): conv for key, conv in list(STATE_CONVENTIONS.items())
                          if key[1] == "bf16"})


def state_convention(engine: str, precision: str, zero_stage: int, fsdp_version: int = 2,
                     grad_reduce_in_bf16: bool = False) -> Optional[StateConvention]:
    """The table entry for this engine, precision and stage (stage-specific entries win); FSDP1 keeps
    the same bytes per parameter as FSDP2 but partitions flat parameters. Megatron-LM's --grad-reduce-in-bf16
    makes its gradient buffer bf16 in a bf16 / fp8 run (arguments.py: accumulate_allreduce_grads_in_fp32 off, the
    buffer in the parameters' dtype): 2 + 2 + 12/d bytes a parameter, where the table's row is 2 + 4 + 12/d."""
    conv = STATE_CONVENTIONS.get((engine, precision, zero_stage)) or STATE_CONVENTIONS.get((engine, precision))
    if conv is not None and engine == "fsdp" and fsdp_version == 1:
        conv = replace(conv, partition="flat", states_for_untrained=True)
    if conv is not None and engine == "megatron_lm" and grad_reduce_in_bf16 and precision in ("bf16", "fp8"):
        conv = replace(conv, grad=2)
    return conv


def flat_shard_numel(param_numels: Sequence[int], group: int, aligned_numel: int = 0) -> int:
    """Elements each rank of a `group`-rank shard group stores of one FSDP1 unit's FlatParameter.

    torch 2.13, torch/distributed/fsdp/_flat_param.py:
    - `_init_flat_param_and_metadata` concatenates the unit's parameters (a shared parameter once).
      With use_orig_params=True every parameter's start is first padded to a multiple of
      `_get_aligned_numel` = 16 bytes / itemsize of the forward dtype (8 for bf16, 4 for fp32), and the
      total is then padded to a multiple of the group size; with use_orig_params=False nothing is padded.
    - `FlatParamHandle._get_shard` takes `flat.chunk(group)[rank]` and pads it to the first chunk's
      size, ceil(total / group): every rank holds that many elements, the last ones partly zeros.
    Gradients and Adam moments are shaped like this shard (use_orig_params=False keeps the flat
    gradient; the optimizer steps the flat parameter).
    """
    total = 0
    for numel in param_numels:
        if aligned_numel:
            total = -(-total // aligned_numel) * aligned_numel
        total += numel
    return -(-total // group)


def partition_numel(rule: str, tensors: Sequence[Tuple[int, int, int]], total: int, group: int, sharded: bool,
                    zero_stage: int) -> int:
    """Elements one rank stores of a state over a data-parallel shard group of `group` ranks.

    `tensors` are the rank's tensors as (numel, dim0, count) groups, `total` their numel sum. The
    largest partition is returned: padding is allocated on every rank, so it is what a rank holds.
    """
    if rule == "deepspeed" and zero_stage in (1, 2):
        # stage_1_and_2: one flat group padded to nccl_start_alignment_factor (2) x N elements; the
        # 16-bit weights live in that padded flat buffer even though they are not partitioned.
        aligned = -(-total // (2 * group)) * 2 * group
        return aligned // group if sharded else aligned
    if not sharded or group == 1:
        return total
    if rule == "even":
        return -(-total // group)
    if rule == "dim0":
        # FSDP2 (fully_shard) chunks dim 0 and pads every shard to ceil(d0 / N) rows.
        return sum(count * -(-d0 // group) * (n // d0) for n, d0, count in tensors if d0)
    if rule == "deepspeed":
        # stage3 partition_parameters: each tensor padded to a multiple of N, then split evenly.
        return sum(count * -(-n // group) for n, _, count in tensors)
    raise ValueError(f"unknown partition rule {rule!r}")
