"""Host work of a training step: what an engine adds besides the model's own kernels (its Python hooks, bucket
copies and DTensor dispatch), on the critical path of CPU ranks; and on GPUs the dispatch of the model's eager
ops, which the device waits for when its kernels are shorter than their dispatch."""

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


# What the host spends on one micro-batch of transformers' eager Llama code (bf16 autocast, SDPA, forward and
# backward), in dispatched-op equivalents: seconds over the host's op latency (a chain of small autograd ops), so
# that the figures move with the host's speed. Measured on the host of an H200 (hardware.py cites its 14.7 us):
#   - without checkpointing, 256 a decoder layer: transformers' 16-layer 1B model took 56-69 ms a micro-batch
#     from 32 to 1,024 tokens, and a TorchDispatchMode counts 4,160 aten ops (compute and view ops alike):
#     4,160 x 14.7 us = 61 ms, so here an op-equivalent is a dispatched op (tools/gpu_host_overhead.py;
#     tests/unit/plan/test_gpu_host.py recounts them on CPU through nd's stage: 244 a layer, 71 outside, the
#     head and loss);
#   - under activation checkpointing, 547 a decoder layer: the engines wrap each layer in torch's non-reentrant
#     checkpoint, and nd's own step took 128.7-131.7 ms a micro-batch (one of 2,048 tokens, two of 1,024;
#     tools/gpu_step_phases.py), 8,840 op-equivalents less 71 outside, over 16 layers. It dispatches 378 ops a
#     layer; the checkpoint's saved-tensor hooks (Python, per saved tensor) take the rest.
#     Selective checkpointing reruns every op of the layer too (saved outputs are looked up, not skipped).
EAGER_LAYER_DISPATCHES = {"none": 256, "checkpointed": 547}
EAGER_OUTSIDE_DISPATCHES = 71
# Engines whose ranks run transformers' modeling code eagerly (Megatron-LM runs its own layers).
EAGER_MODEL_ENGINES = ("deepspeed", "fsdp", "nd")
# What an engine's hooks add on a GPU host, per parameter tensor per micro-batch, in the same units (HOST_OPS below
# holds the CPU figures, where the hooks' copies run on the host too). FSDP2's fully_shard over the 1B model's 146
# tensors, one rank, no checkpointing: 91-101 ms a micro-batch against 56-69 ms without it, +35 ms = 16 a tensor
# (tools/gpu_host_overhead.py). DeepSpeed ZeRO-3 was measured whole (tools/gpu_engine_floor.py: two micro-batches
# of 64 tokens, 585 ms a step against nd's 201 ms), but one accumulation count does not split its hooks per
# micro-batch from its per-step partition work, and all of it per micro-batch would put gpu-check's offloaded
# run 16% slow: not counted. The other mechanisms are not measured on a GPU host: none counted.
GPU_HOST_OPS_PER_TENSOR = {"fsdp2": 16, "fsdp2_reshard": 16}


def dispatch_s(engine: Any, layout: Any, hw: Any, layers: float, last: bool, tensors: int) -> float:
    """Seconds the host takes to dispatch one micro-batch of the model's eager ops on a GPU rank holding `layers`
    decoder layers (and the head and loss on the `last` stage) and `tensors` parameter tensors. The host runs
    ahead of the device, so a micro-batch takes the longer of this and its kernels: the 1B Llama under
    checkpointing is host-bound on an H200 up to 2k tokens a micro-batch. Layers under torch.compile run
    Inductor's generated launches, not the dispatcher: not counted. 0 on CPUs (their op latency is on the
    critical path already)."""
    if not hw.host_op_latency_s or engine.name not in EAGER_MODEL_ENGINES:
        return 0.0
    mode = "none" if layout.activation_checkpointing == "none" else "checkpointed"
    ops = 0.0 if engine.compile else EAGER_LAYER_DISPATCHES[mode] * layers
    ops += EAGER_OUTSIDE_DISPATCHES if last else 0.0  # the head and the loss; the embedding's few ops aside
    ops += sum(GPU_HOST_OPS_PER_TENSOR.get(key, 0) for key in host_mechanisms(engine, layout)) * tensors
    return ops * hw.host_op_latency_s


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
