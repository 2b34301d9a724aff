"""Host work an engine adds to a training step besides the model's own kernels: its Python hooks, bucket
copies and DTensor dispatch. On CPU ranks it sits on the critical path; on GPUs the host runs ahead of the
device and it is hidden while kernels are longer than their launch."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from harness.plan.resharding import reshard_after_forward

# Per engine mechanism: (eager-op equivalents per parameter tensor per micro-batch, per optimizer step).
# Measured on the reference CPU host (2 cores, torch 2.13, DeepSpeed 0.19.8, Accelerate 1.15, gloo): median
# step times of 1-, 2- and 4-layer tiny Llama runs (2, 4 and 8 layers for the pipelines), 20 timed steps
# each, less the time model without this term, fitted as per step + per tensor x tensors and divided by
# the host's calibrated op latency (so the figures move with the host's speed). One row per mechanism,
# never per layout; read as +-30 %.
HOST_OPS: Dict[str, Tuple[float, float]] = {
    "deepspeed_zero0": (13, 340),  # gradient all-reduce hooks, bf16 optimizer wrapper
    "deepspeed_zero12": (50, 300),  # per-parameter gradient hooks copying into reduce buckets; flat step
    "deepspeed_zero3": (225, 1670),  # per-module fetch / release hooks and the parameter coordinator
    "deepspeed_autotp": (0, 1000),  # AutoTP layers' all-reduce wrappers, model-parallel norm and overflow
    "deepspeed_pipe": (0, 1200),  # PipelineEngine: its schedule interpreter; gradients reduced once per step
    "pipelining": (18, 820),  # torch.distributed.pipelining: per-stage action bookkeeping, p2p setup
    "fsdp2": (60, 0),  # fully_shard pre / post hooks, all-gather copy-in / copy-out per unit
    "fsdp2_reshard": (60, 1500),  # plus the backward prefetch and re-gathers of reshard_after_forward
    "fsdp1": (60, 400),  # flat-parameter hooks
    "dtensor_tp": (170, 1300),  # DTensor dispatch and redistribution of every tensor-parallel op
}


def host_mechanisms(engine: Any, layout: Any) -> List[str]:
    """The HOST_OPS rows a layout runs through."""
    zero, tp = layout.zero_stage, layout.tp
    if engine.name == "deepspeed":
        rows = ["deepspeed_pipe"] if layout.pp > 1 else \
            [{0: "deepspeed_zero0", 3: "deepspeed_zero3"}.get(zero, "deepspeed_zero12")]
        return rows + (["deepspeed_autotp"] if tp > 1 else [])
    if engine.name == "fsdp":
        if engine.fsdp_version == 1:
            return ["fsdp1"]
        return ["fsdp2_reshard" if reshard_after_forward(layout) else "fsdp2"] + (["dtensor_tp"] if tp > 1 else [])
    if engine.name == "nd":
        sharded = layout.dp_shard * layout.cp > 1 and zero >= 2
        rows = ["fsdp2_reshard" if reshard_after_forward(layout) else "fsdp2"] if sharded else []
        return rows + (["dtensor_tp"] if tp > 1 else []) + (["pipelining"] if layout.pp > 1 else [])
    return []


def host_work_s(engine: Any, layout: Any, hw: Any, tensors: int) -> Tuple[float, float]:
    """(seconds per micro-batch, seconds per step) of the engine's host work on a rank holding `tensors`
    parameter tensors; nothing where the device runs beside the host (it overlaps_comm)."""
    if hw.overlaps_comm:
        return 0.0, 0.0
    rows = [HOST_OPS[key] for key in host_mechanisms(engine, layout)]
    per_tensor = sum(row[0] for row in rows)
    per_step = sum(row[1] for row in rows)
    return per_tensor * tensors * hw.op_latency_s, per_step * hw.op_latency_s
