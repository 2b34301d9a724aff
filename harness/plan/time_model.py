"""Predicted step time of one layout on one engine, with its breakdown: compute, communication per axis and
what of it is exposed, pipeline bubble, optimizer and offload traffic."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

from harness.plan.pipeline import SINGLE_STAGE_SCHEDULES, SPLIT_BACKWARD, V_SCHEDULES, rank_stages
from harness.plan.comm import Group, axis_group, collective_time
from harness.plan.compute_time import OpTime, layer_time, outside_time, streaming_time
from harness.plan.conventions import (COMPUTE_BYTES, DEEPSPEED_BUCKET_NUMEL, DEEPSPEED_MAX_LIVE_PARAMETERS,
                                      state_convention)
from harness.plan.engine_factors import scaled
from harness.plan.hardware import NCCL_COLLECTIVE_CTAS, NCCL_P2P_CTAS, HardwareProfile
from harness.plan.host_work import dispatch_s, host_work_s
from harness.plan.regime import (DELAYED_SCALING_ENGINES, autocast_over_fp32_weights, fp8_converted_shares,
                                 fused_elementwise)
from harness.plan.model_spec import ModelSpec, param_tensors
from harness.plan.parallel_dims import ParallelDims
from harness.plan.resharding import reshard_after_forward
from harness.plan.states import rank_layers, rank_params, stage_layer_counts
from harness.plan.support import ENGINE_SUPPORT

# Kernels torch's AdamW issues per parameter tensor when it loops over tensors (its default off CUDA:
# foreach is only chosen for CUDA tensors): lerp/mul/addcmul for the moments, bias corrections, sqrt,
# div, add eps, addcdiv, weight decay.
ADAM_OPS_PER_TENSOR = 12
# Bytes AdamW moves per fp32 parameter. A fused kernel (DeepSpeed's FusedAdam with compiled ops, Megatron-LM's)
# reads p, g, m, v (16) and writes p, m, v (12) in one pass: 28. torch's AdamW (fsdp, nd, DeepSpeed's torch_adam)
# runs one pass per op (torch/optim/adamw.py, foreach or per tensor alike): m.lerp_(g) (12), v *= beta2 (8),
# v.addcmul_(g, g) (12), sqrt(v) into a new tensor (8), its bias correction and + eps in place (8 + 8),
# p.addcdiv_(m, denom) (16): 72 at the harness's default weight decay 0 (a decay adds p *= 1 - lr wd, 8 more).
# On an H200 the 1B model's 1.24e9 parameters took 26.0 ms without decay (tests/data/gpu_step_phases_h200.json)
# and 28.6 ms with it (gpu_host_h200.json): 72 B at 90% of 4.8 TB/s predicts 20.6 ms, the many-tensor foreach
# kernels reaching about 70% of the bandwidth.
FUSED_ADAM_BYTES_PER_PARAM = 28
TORCH_ADAMW_BYTES_PER_PARAM = 72


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step on the slowest rank, and where it goes (seconds)."""

    step_time_s: float
    compute_s: Dict[str, float]  # per operation class, summed over the step's micro-batches
    comm_s: Dict[str, Dict[str, float]]  # per axis: total issued and exposed (not hidden behind compute)
    bubble_s: float
    optimizer_s: float
    offload_s: float
    overlap: Dict[str, str] = field(default_factory=dict)  # per axis: what hides it

    def to_dict(self) -> Dict[str, Any]:
        return {"step_time_s": self.step_time_s, "compute_s": dict(self.compute_s),
                "comm_s": {k: dict(v) for k, v in self.comm_s.items()}, "bubble_s": self.bubble_s,
                "optimizer_s": self.optimizer_s, "offload_s": self.offload_s, "overlap": dict(self.overlap)}


@dataclass(frozen=True)
class Groups:
    """The process group of every axis. Rank order tp fastest, then cp, dp_shard, dp_replicate, pp
    (torchtitan's mesh order, Megatron's default): tp stays inside a node before anything else."""

    tp: Group
    cp: Group
    ep: Group
    dp_shard: Group  # the FSDP / ZeRO shard group (dp_shard x cp ranks hold shards of the same weights)
    dp_replicate: Group
    pp: Group


def layout_groups(layout: Any, gpus_per_node: int) -> Groups:
    """Groups of each axis from the degrees and the node size."""
    tp, cp, shard, rep = layout.tp, layout.cp, layout.dp_shard, layout.dp_replicate
    return Groups(
        tp=axis_group(tp, 1, gpus_per_node),
        cp=axis_group(cp, tp, gpus_per_node),
        ep=axis_group(layout.ep, tp, gpus_per_node),
        dp_shard=axis_group(shard * cp, tp, gpus_per_node),
        dp_replicate=axis_group(rep, tp * cp * shard, gpus_per_node),
        pp=axis_group(layout.pp, tp * cp * shard * rep, gpus_per_node),
    )


def pipeline_time(schedule: str, pp: int, virtual: int, microbatches: int, forward: float,
                  backward: float, weight_grad: Optional[float] = None) -> float:
    """Time of m micro-batches through p stages whose slowest rank spends `forward` + `backward` per
    micro-batch (all its local stages together).

    GPipe and 1F1B: (m + p - 1)(F + B) (Narayanan et al. 2021's bubble (p-1)/m, Huang et al. 2019);
    interleaved with v chunks per rank: the bubble shrinks to (p-1)(F + B)/v. Zero-bubble schedules split
    B into the input gradient I and the weight gradient W and fill the bubble with W (Qi et al. 2023): ZB-H1
    leaves (p-1)(F + I - W), the V-shaped ZB-V and DualPipeV (p-1)(F + I - 2W), clipped at zero, once there are
    at least p x v micro-batches to fill it with; per chunk of 1/v of the rank's layers. W is `weight_grad`, the
    weight-gradient GEMMs alone: a checkpointed layer's recomputation, its attention and elementwise backward
    and its collectives all come before the input gradient, so they are I's (B / 2 when not given)."""
    work = microbatches * (forward + backward)
    if pp <= 1:
        return work
    p, v = pp, max(1, virtual)
    w_total = backward / 2 if weight_grad is None else min(weight_grad, backward)
    f, i, w = forward / v, (backward - w_total) / v, w_total / v
    if schedule in SINGLE_STAGE_SCHEDULES:
        bubble = (p - 1) * (forward + backward)
    elif schedule in ("Interleaved1F1B", "LoopedBFS"):
        bubble = (p - 1) * (f + i + w)
    elif microbatches < p * v and schedule in SPLIT_BACKWARD:
        bubble = (p - 1) * (f + i + w)  # too few micro-batches to fill the bubble with W passes
    elif schedule == "InterleavedZeroBubble":
        bubble = (p - 1) * max(0.0, f + i - w)
    elif schedule in V_SCHEDULES:
        bubble = (p - 1) * max(0.0, f + i - 2 * w)
    else:
        raise ValueError(f"pp_schedule={schedule!r} has no time model")
    return work + bubble


def exposed(comm: float, hiding: float, hw: HardwareProfile, tail: float = 0.0,
            ctas: int = NCCL_COLLECTIVE_CTAS) -> float:
    """What of `comm` the critical path sees when it runs beside `hiding` seconds of compute: all of it
    when the hardware cannot overlap (CPU ranks, one core each). Else an unhidable tail (the first gather before
    any compute, the last reduction after the last backward), then the rest M beside the compute C, which loses
    f = overlap_slowdown of its rate while M runs (the `ctas` SMs it holds: a collective's, a point-to-point
    transfer's fewer, none for host copies on the copy engines). Two streams side by side: where M ends first
    (M < C / (1 - f)) the compute has done M (1 - f) of its work and finishes the rest alone, C + f M; else the
    compute ends inside M, which is then the step, M. What shows beyond C: max(M - C, f M)."""
    if not hw.overlaps_comm:
        return comm
    unhidden = min(comm, tail)
    beside = comm - unhidden
    return unhidden + max(beside - hiding, overlap_slowdown(hw, ctas) * beside)


def overlap_slowdown(hw: HardwareProfile, ctas: int = NCCL_COLLECTIVE_CTAS) -> float:
    """The fraction of compute lost while communication runs beside it: NCCL runs one CTA per channel, each
    holding an SM that no compute kernel shares (NVIDIA/nccl#689: "NCCL CTAs won't share an SM with compute
    kernels"), so a kernel beside it runs on the remaining SMs: ctas / sm_count (hardware.py); none where the
    profile knows no SM count (CPUs)."""
    return ctas / hw.sm_count if hw.sm_count else 0.0


def predict_step_time(spec: ModelSpec, layout: Any, engine: Any, hw: HardwareProfile,
                      peak: float, clip: bool = True, fp8_speedup: float = 1.0) -> StepTime:
    """The step time of the slowest pipeline rank. `peak` is the achievable matmul FLOP/s of one rank in the
    compute precision (bf16 under fp8); `fp8_speedup` how much faster the GEMMs FP8 converts run
    (harness.plan.regime.fp8_gemm_speedup; 1 without FP8)."""
    e = COMPUTE_BYTES[layout.precision]
    groups = layout_groups(layout, hw.gpus_per_node)
    tokens = layout.micro_batch * layout.seq_len // layout.cp
    counts = stage_layer_counts(spec.num_layers, layout.pp, layout.pp_virtual_stages if layout.pp > 1 else 1,
                                layout.pp_stage_layers)
    best: Optional[StepTime] = None
    for rank in _critical_ranks(layout):
        stages = rank_stages(layout.pp_schedule, layout.pp, layout.pp_virtual_stages, rank) if layout.pp > 1 else (0,)
        layers = sum(counts[s] for s in stages)
        first, last = 0 in stages, len(counts) - 1 in stages
        step = _rank_step(spec, layout, engine, hw, (peak, fp8_speedup), groups, e, tokens, layers, first, last,
                          len(stages), rank_layers(counts, stages), clip)
        if best is None or step.step_time_s > best.step_time_s:
            best = step
    assert best is not None
    return scaled(with_straggler_wait(time_sliced(best, ranks_per_core(layout, hw)),
                                      straggler_stretch(layout, engine, hw)), hw.engine_factors.get(engine.name))


def with_straggler_wait(step: StepTime, stretch: float) -> StepTime:
    """The step stretched by `stretch` (straggler_stretch), the wait shown as its own part ("stragglers" beside
    the compute classes): the ranks' own work does not grow with their number, the time they wait for another
    rank's stall does."""
    if stretch == 1.0:
        return step
    wait = step.step_time_s * (stretch - 1.0)
    return replace(step, step_time_s=step.step_time_s + wait, compute_s={**step.compute_s, "stragglers": wait})


def lockstep_ranks(layout: Any, engine: Any) -> int:
    """Ranks that wait for each other at every layer: the data-parallel shard group where parameters are gathered
    layer by layer (FSDP, nd, DeepSpeed ZeRO-3: each layer's compute waits for its gather, which needs every rank),
    else 1. Gradient reductions the compute does not wait for (DDP and ZeRO-1/2 buckets, Megatron-LM's) meet once
    a step, where a stall costs at most itself. Model-parallel groups are left out: Megatron-LM's (up to 128 ranks
    in dgxc_h100*.csv) lose 0-2.8% per GPU from those tables' fewest GPUs to their most, up to 2,304, as the model
    does without them, and charging their groups made both tables' errors grow."""
    conv = state_convention(engine.name, layout.precision, layout.zero_stage, engine.fsdp_version,
                            engine.grad_reduce_in_bf16)
    gathered = conv is not None and layout.zero_stage >= conv.param_shard_stage
    return max(1, layout.dp_shard) if gathered else 1


def straggler_stretch(layout: Any, engine: Any, hw: HardwareProfile) -> float:
    """How much a step stretches because each of the other lockstep ranks a rank meets stalls on its own
    hw.rank_stall_share of the time (its own stalls are in the rates it runs at): the step moves on only while
    none of them stalls (lockstep_wait_share), so it takes 1 / (1 - q) of the stall-free time."""
    others = lockstep_ranks(layout, engine) - 1
    if not hw.rank_stall_share or others < 1:
        return 1.0
    return 1.0 / max(1e-9, 1.0 - lockstep_wait_share([hw.rank_stall_share] * others))


def ranks_per_core(layout: Any, hw: HardwareProfile) -> float:
    """How many ranks share one core: CPU ranks beyond the node's cores time-slice them, so every part of
    the step stretches by ranks / cores (1 where each rank has its own device)."""
    if not hw.cores_per_node:
        return 1.0
    world = layout.dp_replicate * layout.dp_shard * layout.tp * layout.pp * layout.cp
    return max(1.0, min(world, hw.gpus_per_node) / hw.cores_per_node)


def lockstep_wait_share(wait_shares: Sequence[float]) -> float:
    """The share of the time at least one of several ranks waits for a core, each rank waiting its own share
    (runtime.host_state.core_wait_s measures it). Ranks meet in collectives many times a step, so the step moves
    on only while every rank has a core: with independent waits that is prod(1 - share) of the time."""
    running = 1.0
    for share in wait_shares:
        running *= 1.0 - share
    return 1.0 - running


def under_core_wait(step_time_s: float, wait_shares: Sequence[float]) -> float:
    """The step time a prediction for ranks with cores of their own becomes when the ranks wait for a core
    (other processes on their cores) their `wait_shares` of the time. The step is the time every rank runs (what
    the model predicts) plus the time one of them waits: measured = predicted + q x measured with q the
    lockstep_wait_share, so measured = predicted / (1 - q)."""
    return step_time_s / max(1e-9, 1.0 - lockstep_wait_share(wait_shares))


def time_sliced(step: StepTime, factor: float) -> StepTime:
    if factor == 1.0:
        return step
    return StepTime(step.step_time_s * factor, {k: v * factor for k, v in step.compute_s.items()},
                    {axis: {k: v * factor for k, v in c.items()} for axis, c in step.comm_s.items()},
                    step.bubble_s * factor, step.optimizer_s * factor, step.offload_s * factor, dict(step.overlap))


def _critical_ranks(layout: Any):
    if layout.pp == 1 or layout.pp_schedule in V_SCHEDULES:
        return (0,)
    return (0, layout.pp - 1)


def _microbatch_compute(spec, layout, engine, hw, peaks, e, tokens, layers, first, last):
    """(forward, backward, recompute) OpTimes of one micro-batch on this rank; `peaks`: (the achievable
    FLOP/s, the FP8 GEMM speedup)."""
    tp, (peak, fp8_speedup) = layout.tp, peaks
    fused, autocast = fused_elementwise(engine), autocast_over_fp32_weights(engine.name, layout)
    regime = dict(compiled=fused, fp8_speedup=fp8_speedup, cp=layout.cp, autocast_fp32=autocast,
                  fp8_shares=fp8_converted_shares(spec, engine.name), sp=bool(engine.sequence_parallel) and tp > 1,
                  ep=layout.ep, fp8_delayed_scaling=engine.name in DELAYED_SCALING_ENGINES)
    fwd = layer_time(spec, tokens, layout.seq_len, tp, e, hw, peak, backward=False, **regime)
    bwd = layer_time(spec, tokens, layout.seq_len, tp, e, hw, peak, backward=True, **regime)
    vocab_split = ENGINE_SUPPORT[engine.name].tp_shards_vocab[1]
    outside = outside_time(spec, tokens, tp, vocab_split, e, hw, peak, first, last, autocast)
    # Weight-shared stacks (HRM, pp = 1): every run is a forward, the runs with gradient a backward and a recompute
    forward_runs, grad_runs = ((sum(g + n for g, n in spec.layer_runs), spec.saved_layer_runs) if spec.layer_runs
                               else (layers, layers))
    if layout.activation_checkpointing == "full":
        recompute = fwd.scaled(grad_runs)
    elif layout.activation_checkpointing == "selective" and ENGINE_SUPPORT[engine.name].activation_profile == "hf":
        # torch's op-level policy keeps every matmul and attention output: the elementwise work runs again
        recompute = OpTime(elementwise=fwd.elementwise * grad_runs)
    elif layout.activation_checkpointing == "selective":  # Megatron: the attention core runs again
        recompute = OpTime(attention=fwd.attention * grad_runs)
    else:
        recompute = OpTime()
    # The outside work is counted a third in forward, two thirds in backward (its GEMM and loss).
    return (fwd.scaled(forward_runs) + outside.scaled(1 / 3), bwd.scaled(grad_runs) + outside.scaled(2 / 3),
            recompute)


def _layer_comm(spec, layout, engine, hw, groups, e, tokens, layers, first, last) -> Dict[str, float]:
    """Seconds of TP, CP, EP and PP communication one micro-batch issues on this rank, forward + backward, and
    what they add once a step (`tp_step`: replicated gradients' all-reduce; `pp_step`: the loss's broadcast)."""
    h = spec.hidden_size
    activation = tokens * h * e
    tp, tp_step = tp_comm(spec, layout, engine, hw, groups.tp, activation, tokens, layers, first, last) \
        if layout.tp > 1 else (0.0, 0.0)
    heads, kv_heads, qk, v = spec.attention_dims()
    kv = tokens * kv_heads * (qk + v) / max(1.0, heads) / layout.tp * e  # a block of K and V
    # ring attention passes K and V cp-1 times forward, K, V and their gradients back (Liu et al. 2023); a
    # recomputed attention (full checkpointing, Megatron's selective) passes them again
    reruns = recomputed_collectives(layout, engine)
    cp = (layers * (3 + reruns["attention"]) * (layout.cp - 1) * collective_time("p2p", kv, groups.cp, hw)
          if layout.cp > 1 else 0.0)
    # dispatch and combine, forward and backward (and the forward's again when the layer is recomputed), on the
    # layers with routed experts
    routed = tokens * spec.experts_per_token * h * e
    ep = (layers * spec.moe_layer_share * (4 + 2 * reruns["layer"]) * collective_time("all_to_all", routed, groups.ep,
                                                                                         hw)
          if layout.ep > 1 and spec.is_moe else 0.0)
    pp = pipeline_p2p(layout, engine, hw, groups.pp, activation)
    return {"tp": tp, "cp": cp, "ep": ep, "pp": pp, "tp_step": tp_step,
            "pp_step": loss_broadcast_time(engine, layout, hw, groups.pp)}


def recomputed_collectives(layout: Any, engine: Any) -> Dict[str, int]:
    """Which forward collectives a checkpointed layer issues again in its recomputation: the whole layer's
    under full checkpointing ("layer": expert dispatch, context-parallel ring); the attention's alone under
    Megatron's selective recomputation of the attention core ("attention"); none under the torch engines'
    selective policy, which keeps the attention and router outputs (tensor-parallel collectives: tp_comm)."""
    full = layout.activation_checkpointing == "full"
    core = layout.activation_checkpointing == "selective" and ENGINE_SUPPORT[engine.name].activation_profile \
        == "megatron"
    return {"layer": int(full), "attention": int(full or core)}


def pipeline_p2p(layout: Any, engine: Any, hw: HardwareProfile, group: Group, activation: float) -> float:
    """Seconds of pipeline point-to-point traffic one micro-batch issues on a rank: each of its local stages
    receives its input and sends its output gradient (and the reverse), 2 transfers per chunk, of one
    micro-batch's hidden states. Megatron-LM under sequence parallelism sends the tensor-parallel shard of
    them (schedules.get_tensor_shapes: the sequence divided by cp, then by tp when sequence_parallel)."""
    if layout.pp <= 1:
        return 0.0
    if engine.name == "megatron_lm" and engine.sequence_parallel:
        activation /= layout.tp
    return 2 * layout.pp_virtual_stages * collective_time("p2p", activation, group, hw)


def p2p_overlapped(layout: Any, engine: Any) -> bool:
    """Whether the pipeline's transfers run beside compute: Megatron-LM's interleaved schedule overlaps each
    chunk's send / receive with the next chunk's forward or backward (overlap_p2p_comm, on unless
    --no-overlap-p2p-communication, which the export does not render); its 1F1B and torch's schedules wait for
    every transfer."""
    return engine.name == "megatron_lm" and layout.pp > 1 and layout.pp_virtual_stages > 1


class TensorParallelCounts(NamedTuple):
    """Split matrices of one decoder layer: column-parallel ones take the replicated input, row-parallel ones
    (attention output, MLP down) end a block; replicated tensors (norms) need their gradients summed."""

    column: int
    row: int
    replicated: int


def tp_counts(spec: ModelSpec) -> TensorParallelCounts:
    layer = [t for t in param_tensors(spec)[0] if not t.expert]
    split = sum(1 for t in layer if len(t.shape) >= 2 and t.tp_dim is not None)
    row = min(2, split)
    return TensorParallelCounts(split - row, row, sum(1 for t in layer if t.tp_dim is None))


def tp_comm(spec, layout, engine, hw, group, activation, tokens, layers, first, last) -> Tuple[float, float]:
    """Tensor-parallel collectives on this rank, as each engine issues them: (per micro-batch, per step).

    Megatron (Shoeybi et al. 2019, fig. 4): one all-reduce per block in forward (g) and one in backward (f);
    with sequence parallelism an all-gather + reduce-scatter instead (Korthikanti et al. 2022, sec. 4.2.2).
    DTensor (nd, Accelerate) and DeepSpeed AutoTP all-reduce the input gradient of every column-parallel
    matrix on its own in backward (no fused f): q, k, v, gate and up each, five for a Llama layer. DTensor
    also all-reduces each replicated (norm) weight's gradient once per step, the final norm's, and under loss
    parallelism three scalars per token (max, sum of exponentials, target logit: torch loss_parallel). Full
    checkpointing reruns the forward's collectives; so does the torch engines' selective policy, which keeps
    matmul and attention outputs only (nd_session._selective_policy: a collective's output is recomputed)."""
    counts = tp_counts(spec)
    ag = lambda b: collective_time("all_gather", b, group, hw)  # noqa: E731
    rs = lambda b: collective_time("reduce_scatter", b, group, hw)  # noqa: E731
    ar = lambda b: collective_time("all_reduce", b, group, hw)  # noqa: E731
    block = ag(activation) + rs(activation) if engine.sequence_parallel else ar(activation)
    rerun = layout.activation_checkpointing == "full" or (
        layout.activation_checkpointing == "selective" and ENGINE_SUPPORT[engine.name].activation_profile == "hf")
    forward = counts.row * block * (2 if rerun else 1)
    if engine.name == "megatron_lm":
        return layers * (forward + counts.row * block), 0.0
    backward = counts.column * ar(activation) + (counts.row * ag(activation) if engine.sequence_parallel else 0.0)
    if engine.name not in ("nd", "fsdp"):
        return layers * (forward + backward) + (ar(activation) if last else 0.0), 0.0  # AutoTP's lm_head output
    loss = 3 * ar(tokens * 4) if last and engine.loss_parallel else 0.0
    # the embedding's output and the head's input change layout once each way
    ends = (int(first) + int(last)) * block + loss
    replicated = (layers * counts.replicated + (1 if last else 0)) * ar(spec.hidden_size * 4)
    return layers * (forward + backward) + ends, replicated


class DataParallelComm(NamedTuple):
    """Data-parallel traffic of one rank: per micro-batch (hidden behind that micro-batch's compute), per step
    during the first forward (parameters gathered once for the whole step), per step during the last backward
    (gradient buckets), per step on the critical path (after the last backward or the optimizer), and per
    micro-batch on the critical path (issued when the compute that needs it is already waiting)."""

    per_microbatch: float
    with_last_backward: float
    after_step: float
    how: str
    with_first_forward: float = 0.0
    exposed_per_microbatch: float = 0.0


# DDP's gradient buckets are 25 MiB (torch.nn.parallel.DistributedDataParallel bucket_cap_mb); DeepSpeed's are
# conventions.DEEPSPEED_BUCKET_NUMEL.
DDP_BUCKET_BYTES = 25 * 2**20


class CallCounts(NamedTuple):
    """How many separate collectives one rank's data-parallel traffic takes: each pays the latency once."""

    units: int  # FSDP wrap units: each decoder layer, plus the root (embedding, final norm, head) where held
    layers: int  # decoder layers: the units FULL_SHARD gathers again for backward (the root stays gathered)
    modules: int  # parameter tensors DeepSpeed ZeRO-3 fetches one module at a time (a gather per module)
    params: float  # elements of this rank's (TP / PP / EP-local) parameters


def call_counts(params: Any) -> CallCounts:
    """Units and fetches of one pipeline rank: a unit per decoder layer plus the root unit where the rank
    holds the embedding or the head; a fetch per parameter tensor (biases counted as their own fetch)."""
    root = 1 if (params.first or params.last) else 0
    return CallCounts(params.layers + root, params.layers, _tensor_count(params),
                      params.dense_total + params.expert_total)


def _calls(kind: str, nbytes: float, calls: float, group: Group, hw: HardwareProfile) -> float:
    """`calls` collectives sharing `nbytes` evenly: the bandwidth term once, the latency per call."""
    calls = max(1, int(math.ceil(calls)))
    return calls * collective_time(kind, nbytes / calls, group, hw)


def data_parallel_comm(layout: Any, engine: Any, hw: HardwareProfile, groups: Groups, counts: CallCounts,
                       work_bytes: int, grad_bytes: int, param_shard_stage: int) -> DataParallelComm:
    """The collectives each engine issues on the data axis (Rajbhandari et al. 2020, sec. 5-7: ZeRO-1/2
    move 2P per step like an all-reduce, ZeRO-3 3P; FSDP is ZeRO-3 with per-unit gathers, Zhao et al. 2023).

    - parameters sharded (DeepSpeed stage 3, FSDP/nd stage >= 2): every micro-batch all-gathers the
      parameters for forward, again for backward when they are resharded after forward, and
      reduce-scatters the gradients; HSDP adds an all-reduce of the shard over the replicas. FSDP gathers
      and reduces one unit at a time and keeps the root unit gathered for backward (under pipelining once
      per step: `fsdp_comm`); DeepSpeed gathers module by module and keeps them for backward while the
      rank's parameters are within stage3_max_live_parameters, and reduces in buckets;
    - DeepSpeed stage 2 reduce-scatters gradients in buckets in every backward, stage 1 once per step, both
      all-gather the updated 16-bit parameters after the optimizer; Megatron's distributed optimizer alike;
    - stage 0 all-reduces the gradients once per step, overlapped with the last backward (DDP buckets); nd's
      `replicate` without pipelining in every micro-batch, unit by unit."""
    shard, rep, zero, name = groups.dp_shard, groups.dp_replicate, layout.zero_stage, engine.name
    everyone = axis_group(shard.size * rep.size, layout.tp, hw.gpus_per_node)
    grads, weights = counts.params * grad_bytes, counts.params * work_bytes
    buckets = counts.params / DEEPSPEED_BUCKET_NUMEL
    if shard.size * rep.size == 1:
        return DataParallelComm(0.0, 0.0, 0.0, "no data parallelism")
    if zero >= param_shard_stage and shard.size > 1:
        if name != "deepspeed":
            return fsdp_comm(layout, hw, groups, counts, weights, grads, engine.backward_prefetch)
        fetches = counts.modules * (2 if counts.params > DEEPSPEED_MAX_LIVE_PARAMETERS else 1)
        gather = _calls("all_gather", weights * fetches / counts.modules, fetches, shard, hw)
        reduce = _calls("reduce_scatter", grads, buckets, shard, hw)
        per_mb = gather + reduce + _calls("all_reduce", grads / shard.size, counts.units, rep, hw)
        return DataParallelComm(per_mb, 0.0, 0.0, "gathers prefetched behind the previous unit's compute; "
                                "reduce-scatters behind the next unit's backward")
    if name == "megatron_lm":
        return megatron_dp_comm(layout, hw, groups, everyone, counts, weights, grads)
    if zero >= 1 and shard.size > 1:
        reduce = (_calls("reduce_scatter", grads, buckets, shard, hw)
                  + _calls("all_reduce", grads / shard.size, buckets, rep, hw))
        gather = _calls("all_gather", weights, buckets, shard, hw)
        if name == "deepspeed" and zero == 2:
            return DataParallelComm(reduce, 0.0, gather, "bucketed reduce-scatter behind every backward; "
                                    "parameter all-gather after the step, exposed")
        return DataParallelComm(0.0, reduce, gather, "reduce-scatter behind the last backward; parameter "
                                "all-gather after the step, exposed")
    if name == "nd" and layout.pp == 1:
        # torch's `replicate` reduces in every backward (nd's loop sets no gradient-sync switch), each unit's
        # gradients once its backward is done (the same post-backward path as fully_shard)
        return DataParallelComm(_calls("all_reduce", grads, counts.units, everyone, hw), 0.0, 0.0,
                                "each unit's all-reduce behind the next unit's backward, in every micro-batch")
    calls = buckets if name == "deepspeed" else grads / DDP_BUCKET_BYTES
    return DataParallelComm(0.0, _calls("all_reduce", grads, calls, everyone, hw), 0.0,
                            "bucketed all-reduce behind the last backward")


# Megatron-LM's DDP bucket when it overlaps the reduction (megatron/core/distributed/distributed_data_parallel.py:
# bucket_size = max(40M, 1M x data-parallel size) elements; without --overlap-grad-reduce one bucket per buffer).
MEGATRON_BUCKET_NUMEL = 40e6


def megatron_dp_comm(layout: Any, hw: HardwareProfile, groups: Groups, everyone: Group, counts: CallCounts,
                     weights: float, grads: float) -> DataParallelComm:
    """Megatron-LM's data-parallel traffic as harness.engines.megatron_lm renders its flags.

    zero_stage 0 renders no --overlap-grad-reduce: finish_grad_sync then issues the gradient all-reduce
    synchronously after the last backward, one bucket per buffer (param_and_grad_buffer.py: "If
    overlap_grad_reduce is False, start (and finish) synchronous communication call here"), all of it on the
    critical path. zero_stage 1 renders --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather:
    the gradient reduce-scatter runs bucket by bucket behind the last backward, and the updated parameters'
    all-gather is dispatched with the next forward, each bucket waited for by its first layer's pre-hook
    (behind the first micro-batch's forward); with several optimizer instances the shard is all-reduced across
    them too."""
    shard, rep = groups.dp_shard, groups.dp_replicate
    if layout.zero_stage == 0 or shard.size == 1:
        return DataParallelComm(0.0, 0.0, collective_time("all_reduce", grads, everyone, hw),
                                "gradient all-reduce after the last backward, synchronous (no --overlap-grad-reduce)")
    buckets = max(MEGATRON_BUCKET_NUMEL, 1e6 * shard.size)
    calls = counts.params / buckets
    reduce = (_calls("reduce_scatter", grads, calls, shard, hw)
              + _calls("all_reduce", grads / shard.size, calls, rep, hw))
    gather = _calls("all_gather", weights, calls, shard, hw)
    return DataParallelComm(0.0, reduce, 0.0, "reduce-scatter behind the last backward (--overlap-grad-reduce); "
                            "parameter all-gather behind the next forward (--overlap-param-gather)",
                            with_first_forward=gather)


def fsdp_comm(layout: Any, hw: HardwareProfile, groups: Groups, counts: CallCounts, weights: float,
              grads: float, prefetch: str = "BACKWARD_PRE") -> DataParallelComm:
    """FSDP (fsdp, nd) with sharded parameters: one all-gather per unit for forward, one more per decoder layer
    for backward where parameters are resharded after forward (harness.plan.resharding; the root stays
    gathered), one reduce-scatter per unit, and with HSDP one all-reduce of each shard over the replicas. FSDP2
    and FSDP1's BACKWARD_PRE gather each unit before the backward that needs it; FSDP1's later prefetches:
    fsdp1_late_backward_gathers.

    Without pipelining all of it happens in every micro-batch. Under pipelining torch's stages skip the
    gradient reduction and the reshard in every backward but the last (PipelineStage.backward_maybe_with_nosync)
    and reduce once per step after the stage's last backward (perform_reduce_grad), and the parameters stay
    gathered from the step's first forward: one gather per unit and step, behind that forward, and one
    reduction per unit and step with nothing left to hide it."""
    shard, rep = groups.dp_shard, groups.dp_replicate
    gathers = counts.units + (counts.layers if reshard_after_forward(layout) else 0)
    gather = _calls("all_gather", weights * gathers / counts.units, gathers, shard, hw)
    reduce = (_calls("reduce_scatter", grads, counts.units, shard, hw)
              + _calls("all_reduce", grads / shard.size, counts.units, rep, hw))
    if layout.pp > 1:
        return DataParallelComm(0.0, 0.0, reduce, "parameters gathered once, behind the step's first forward; "
                                "gradients reduced after the last backward, exposed", with_first_forward=gather)
    if prefetch != "BACKWARD_PRE" and reshard_after_forward(layout):
        return fsdp1_late_backward_gathers(hw, shard, counts, weights, gather + reduce, reduce, prefetch)
    return DataParallelComm(gather + reduce, 0.0, 0.0, "gathers prefetched behind the previous unit's compute; "
                            "reduce-scatters behind the next unit's backward")


class Fsdp2Copies(NamedTuple):
    """Seconds FSDP2 spends copying on the compute stream: per micro-batch in its forward and its backward, and per
    step where pipelining gathers and reduces once a step."""

    forward: float = 0.0
    backward: float = 0.0
    per_step: float = 0.0


def fsdp2_copies(layout: Any, engine: Any, hw: HardwareProfile, data_ranks: int, counts: CallCounts,
                 work_bytes: int, grad_bytes: int, param_shard_stage: int) -> Fsdp2Copies:
    """FSDP2's copies around its collectives, which run on the compute stream between the layers' kernels
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, torch 2.13):
    - each unshard copies the all-gather's output into the unit's unsharded parameters (`foreach_all_gather_copy_out`:
      one `split_with_sizes_copy`, called by `wait_for_unshard` on the current stream; with nothing to gather, a
      `copy_` of the cast shard): the unit's working bytes read and written, in every forward, and in every
      backward where parameters are resharded after forward;
    - each reduction copies the unit's unsharded gradients into its input (`foreach_reduce_scatter_copy_in`: one
      `chunk_cat`, called by `post_backward` on the current stream before the reduce-scatter stream waits for it):
      the gradient read in the working dtype, written in the reduce dtype.
    FSDP2 wraps the fsdp engine's model at fsdp_version 2 (`fully_shard`) and nd's wherever it has data ranks
    (`fully_shard`, or `replicate` below the sharding stage, which runs the same parameter group unsharded).
    Neither torch's pipelining (one unshard and one reduction a step) nor accumulation changes what each copies.
    FSDP1's flat parameter gathers into the buffer its parameters view and reduces its flat gradient: no copy.
    CPU ranks: none here, the host's measured fsdp2 rows hold them (host_work.HOST_OPS)."""
    wrapped = (engine.name == "fsdp" and engine.fsdp_version == 2) or (engine.name == "nd" and data_ranks > 1)
    if not (wrapped and hw.overlaps_comm):
        return Fsdp2Copies()
    copy_out = streaming_time(2 * counts.params * work_bytes, counts.units, hw)
    copy_in = streaming_time(counts.params * (work_bytes + grad_bytes), counts.units, hw)
    if layout.pp > 1:  # gathered once for the step's first forward, reduced once after its last backward
        return Fsdp2Copies(per_step=copy_out + copy_in)
    regathered = counts.layers if layout.zero_stage >= param_shard_stage and reshard_after_forward(layout) else 0
    return Fsdp2Copies(copy_out, copy_out * regathered / counts.units + copy_in)


def fsdp1_late_backward_gathers(hw: HardwareProfile, shard: Group, counts: CallCounts, weights: float, issued: float,
                                reduce: float, prefetch: str) -> DataParallelComm:
    """FSDP1 with a later backward prefetch than BACKWARD_PRE (torch.distributed.fsdp.BackwardPrefetch). Every
    collective of one process group runs on its one NCCL stream in issue order (the enum's docstring), and a unit's
    backward needs its gathered parameters:
    - BACKWARD_POST issues the next unit's all-gather after the current unit's gradient computation, ahead of its
      reduce-scatter (_post_backward_reshard prefetches, then _post_backward_hook reduces): the reduce-scatter hides
      behind the next unit's backward, which waits for the whole all-gather ("overlaps the current reduce-scatter
      and the next gradient computation");
    - NO_PREFETCH issues it when the next unit's backward starts, behind the current reduce-scatter: that unit
      waits for both.
    The backward's all-gathers (one per decoder layer) then sit on the critical path, with the reduce-scatters too
    without prefetch; the forward's stay hidden (the CPU issues each ahead of the GPU)."""
    backward = _calls("all_gather", weights * counts.layers / counts.units, counts.layers, shard, hw)
    waited = backward + (reduce if prefetch == "NO_PREFETCH" else 0.0)
    how = ("backward all-gathers issued after each unit's gradients, waited for" if prefetch == "BACKWARD_POST"
           else "backward all-gathers issued when each unit's backward starts, behind the reduce-scatter, waited for")
    return DataParallelComm(issued - waited, 0.0, 0.0, f"forward gathers behind the previous unit's compute; {how}",
                            exposed_per_microbatch=waited)


def optimizer_time(layout: Any, engine: Any, hw: HardwareProfile, opt_params: float, tensors: int,
                   work_bytes: int, offload_grad_bytes: int) -> Dict[str, float]:
    """The optimizer step on this rank's partition: AdamW streams ~28 bytes per parameter on the device,
    with one kernel per op per tensor when torch loops over tensors (off CUDA) or a flat partition
    (DeepSpeed). Offloaded: CPU Adam at the host's rate, gradients down and 16-bit parameters up the host
    link (Ren et al. 2021, ZeRO-Offload, fig. 3), NVMe reads and writes master + moments (12 B/param,
    Rajbhandari et al. 2021, ZeRO-Infinity)."""
    if layout.offload_optimizer == "none":
        launches = tensors * ADAM_OPS_PER_TENSOR if not hw.overlaps_comm else ADAM_OPS_PER_TENSOR
        return {"optimizer": streaming_time(opt_params * adam_bytes_per_param(engine), launches, hw), "offload": 0.0}
    step = opt_params / hw.cpu_adam_params_per_s
    link = opt_params * (offload_grad_bytes + work_bytes) / hw.host_link_bandwidth
    nvme = 2 * opt_params * 12 / hw.nvme_bandwidth if layout.offload_optimizer == "nvme" else 0.0
    return {"optimizer": step, "offload": link + nvme}


def adam_bytes_per_param(engine: Any) -> int:
    """Device bytes the engine's AdamW moves per parameter (FUSED_ADAM_BYTES_PER_PARAM or TORCH_ADAMW_...)."""
    fused = engine.name == "megatron_lm" or (engine.name == "deepspeed" and engine.compiled_ops)
    return FUSED_ADAM_BYTES_PER_PARAM if fused else TORCH_ADAMW_BYTES_PER_PARAM


# Kernels per gradient tensor of the global-norm clip (harness.engines.grad_norm: to fp64, square, sum, weight,
# accumulate); DeepSpeed clips its flat partition, one tensor.
CLIP_OPS_PER_TENSOR = 5
# Bytes per gradient element the norm moves: the harness's clip casts each fp32 gradient to fp64 (read 4, write
# 8), squares it (read 8, write 8) and sums it (read 8): 36; DeepSpeed and Megatron-LM take a fused fp32 norm:
# read 4. (Scaling the gradients, when the norm exceeds the limit, adds 8 more; not counted.)
HARNESS_CLIP_BYTES_PER_ELEMENT = 36
FUSED_CLIP_BYTES_PER_ELEMENT = 4


def step_scalars(engine: Any, zero_stage: int, tp: int, pp: int = 1) -> int:
    """Scalar all-reduces before each optimizer step. The harness's clip (fsdp, nd): one, the squared norm.
    DeepSpeed 0.19.8: ZeRO-1/2 all-reduce the norm and an overflow flag (stage_1_and_2.py, has_overflow runs in
    every step, bf16 too), ZeRO-3 the norm, each once over the data group and again over the model-parallel
    group (_model_parallel_all_reduce), which AutoTP's and PipelineModule's ranks form; ZeRO-0's gradients are
    already all-reduced, so its norm is local, but under PipelineModule its clip_grad_norm_ sums the stages'
    squares over that group: one. Counted (gloo events of a step, two CPU ranks): pp2 ZeRO-1 two over the
    stages, ZeRO-0 one."""
    if engine.name != "deepspeed":
        return 1
    if zero_stage == 0:
        return 1 if pp > 1 else 0
    scalars = {1: 2, 2: 2, 3: 1}[zero_stage]
    return scalars * (2 if tp > 1 else 1)


def loss_broadcast_time(engine: Any, layout: Any, hw: HardwareProfile, group: Group) -> float:
    """Seconds per step of the loss's broadcast from the last pipeline stage to the others, before the
    optimizer step: DeepSpeed's PipelineEngine (_aggregate_total_loss) and the harness's nd step
    (nd_session._pipeline) give every stage the step's loss; Megatron-LM averages it on the last stage only.
    A broadcast passes the scalar down a chain of pp - 1 hops, as an all-gather's ring steps: timed as one."""
    if layout.pp <= 1 or engine.name not in ("deepspeed", "nd"):
        return 0.0
    return collective_time("all_gather", 8, group, hw)


def clip_time(engine: Any, layout: Any, hw: HardwareProfile, groups: Groups, tensors: int,
              elements: float) -> float:
    """Global-norm clipping before the step: a squared sum per gradient tensor over the rank's `elements`
    gradient elements, then step_scalars all-reduces of a scalar over every rank that holds a piece of the model:
    its data, tensor, context and pipeline ranks (the harness's clip all-reduces over the world; DeepSpeed over
    its data group, then its model-parallel one: timed as one all-reduce over both)."""
    everyone = axis_group(ParallelDims.of(layout).world_size, 1, hw.gpus_per_node)
    per_element = FUSED_CLIP_BYTES_PER_ELEMENT if engine.name in ("deepspeed", "megatron_lm") \
        else HARNESS_CLIP_BYTES_PER_ELEMENT
    squares = streaming_time(elements * per_element, tensors * CLIP_OPS_PER_TENSOR, hw)
    scalars = step_scalars(engine, layout.zero_stage, layout.tp, layout.pp)
    return squares + scalars * collective_time("all_reduce", 8, everyone, hw)


def param_offload_time(layout: Any, hw: HardwareProfile, opt_params: float, work_bytes: int) -> float:
    """Per micro-batch: an offloaded parameter partition comes up the host link (or from NVMe) for every
    gather, forward and backward (ZeRO-Infinity / FSDP CPUOffload)."""
    if layout.offload_params == "none":
        return 0.0
    rate = hw.nvme_bandwidth if layout.offload_params == "nvme" else hw.host_link_bandwidth
    return 2 * opt_params * work_bytes / rate


def _rank_step(spec, layout, engine, hw, peaks, groups, e, tokens, layers, first, last, chunks, layer_ids,
               clip) -> StepTime:
    """Step time of one pipeline rank holding `layers` layers in `chunks` local stages."""
    support = ENGINE_SUPPORT[engine.name]
    params = rank_params(spec, layout.tp, layout.ep, layer_ids, first, last, layout.pp, support.tp_shards_vocab)
    local = params.dense_total + params.expert_total
    conv = state_convention(engine.name, layout.precision, layout.zero_stage, engine.fsdp_version,
                            engine.grad_reduce_in_bf16)
    counts = call_counts(params)
    copies = fsdp2_copies(layout, engine, hw, groups.dp_shard.size * groups.dp_replicate.size, counts, conv.working,
                          conv.grad, conv.param_shard_stage)
    fwd, bwd, recompute = _microbatch_compute(spec, layout, engine, hw, peaks, e, tokens, layers, first, last)
    fwd, bwd = fwd + OpTime(elementwise=copies.forward), bwd + OpTime(elementwise=copies.backward)
    compute_mb = fwd.total + bwd.total + recompute.total
    layer_comm = _layer_comm(spec, layout, engine, hw, groups, e, tokens, layers, first, last)
    opt_params = local / groups.dp_shard.size if layout.zero_stage >= conv.optimizer_shard_stage else local
    dp = data_parallel_comm(layout, engine, hw, groups, counts, conv.working, conv.grad, conv.param_shard_stage)
    offload_mb = param_offload_time(layout, hw, opt_params, conv.working)
    m, unit = layout.grad_accum, max(1, layers)
    # TP, EP and pipeline transfers sit on the critical path (each layer waits for them; Megatron's interleaved
    # pipeline transfers excepted: p2p_overlapped); the ring of
    # context parallelism runs beside the attention blocks it feeds (its first step is not hidden);
    # data-parallel gathers / reductions and offloaded parameters beside the layers (the first gather
    # and the last reduction are not hidden).
    exposed_mb = {axis: layer_comm[axis] for axis in ("tp", "ep", "pp")}
    if p2p_overlapped(layout, engine):
        exposed_mb["pp"] = exposed(layer_comm["pp"], compute_mb, hw, ctas=NCCL_P2P_CTAS)
    exposed_mb["cp"] = exposed(layer_comm["cp"], fwd.attention + bwd.attention, hw,
                               tail=layer_comm["cp"] / max(1, layout.cp - 1) / unit)
    exposed_mb["dp"] = (exposed(dp.per_microbatch, compute_mb, hw, tail=dp.per_microbatch / unit)
                        + dp.exposed_per_microbatch)
    exposed_mb["offload"] = exposed(offload_mb, max(0.0, compute_mb - dp.per_microbatch), hw, tail=offload_mb / unit,
                                    ctas=0)
    per_mb = sum(exposed_mb.values())
    rank_tensors = _tensor_count(params)
    host_mb, host_step = host_work_s(engine, layout, hw, rank_tensors)
    dispatch = dispatch_s(engine, layout, hw, layers, last, rank_tensors)
    pipeline, forward, backward, host_mb = _pipeline_span(layout, chunks, fwd, bwd, recompute, per_mb, host_mb,
                                                          dispatch)
    step_comm = (exposed(dp.with_first_forward, fwd.total, hw, tail=dp.with_first_forward / unit)
                 + exposed(dp.with_last_backward, bwd.total, hw, tail=dp.with_last_backward / unit) + dp.after_step)
    tensors = 1 if engine.name == "deepspeed" and layout.zero_stage >= 1 else rank_tensors
    opt = optimizer_time(layout, engine, hw, opt_params, tensors, conv.working, conv.offload_grad)
    opt["optimizer"] += clip_time(engine, layout, hw, groups, tensors, opt_params) if clip else 0.0
    totals = dict(layer_comm, dp=dp.per_microbatch + dp.exposed_per_microbatch, offload=offload_mb)
    comm = {axis: {"total": m * totals[axis], "exposed": m * exposed_mb[axis]} for axis in exposed_mb}
    comm["dp"] = {"total": comm["dp"]["total"] + dp.with_first_forward + dp.with_last_backward + dp.after_step,
                  "exposed": comm["dp"]["exposed"] + step_comm}
    for axis in ("tp", "pp"):  # once a step: replicated gradients' reduction, the loss's broadcast
        comm[axis] = {k: v + layer_comm[f"{axis}_step"] for k, v in comm[axis].items()}
    compute = _compute_parts(m, fwd, bwd, recompute, m * host_mb + host_step, copies)
    total = (pipeline + step_comm + layer_comm["tp_step"] + layer_comm["pp_step"] + opt["optimizer"]
             + opt["offload"] + host_step + copies.per_step)
    return StepTime(total, compute, comm, pipeline - m * (forward + backward), opt["optimizer"], opt["offload"],
                    _overlap(dp, hw, p2p_overlapped(layout, engine)))


def _pipeline_span(layout, chunks: int, fwd: OpTime, bwd: OpTime, recompute: OpTime, per_mb: float, host_mb: float,
                   dispatch: float) -> Tuple[float, float, float, float]:
    """(pipeline time of the step's micro-batches, forward and backward of one, host time of one): the exposed
    communication a third in the forward, two thirds in the backward with the recomputation and host work.
    A GPU's host dispatches ahead of the device: a micro-batch whose kernels are shorter than their `dispatch`
    waits for the host (its forward and backward stretched alike); the wait shows as framework time."""
    forward, backward = fwd.total + per_mb / 3, bwd.total + recompute.total + 2 * per_mb / 3 + host_mb
    weight_grad = bwd.gemm / 2  # the weight-gradient GEMMs: the same FLOPs as the input gradient's
    if dispatch > forward + backward:
        host_mb += dispatch - (forward + backward)
        stretch = dispatch / (forward + backward)
        forward, backward, weight_grad = forward * stretch, backward * stretch, weight_grad * stretch
    pipeline = pipeline_time(layout.pp_schedule, layout.pp, chunks, layout.grad_accum, forward, backward, weight_grad)
    return pipeline, forward, backward, host_mb


def _compute_parts(m: int, fwd: OpTime, bwd: OpTime, recompute: OpTime, framework: float,
                   copies: Fsdp2Copies) -> Dict[str, float]:
    """The step's compute by part over its `m` micro-batches, FSDP2's copies apart from the layers' elementwise
    work (the forward and backward OpTimes carry them, for the timing they take part in)."""
    copied = m * (copies.forward + copies.backward)
    return {"gemm": m * (fwd.gemm + bwd.gemm), "attention": m * (fwd.attention + bwd.attention),
            "elementwise": m * (fwd.elementwise + bwd.elementwise) - copied, "recompute": m * recompute.total,
            "framework": framework, "fsdp_copies": copied + copies.per_step}


def _overlap(dp: DataParallelComm, hw: HardwareProfile, p2p_hidden: bool = False) -> Dict[str, str]:
    """What hides each axis's communication, in words for the breakdown."""
    return {"dp": dp.how if hw.overlaps_comm else "none: ranks share the cores that compute",
            "tp": "none (blocking, on the critical path)",
            "pp": "sends / receives behind the next chunk's compute (interleaved schedule)"
            if p2p_hidden and hw.overlaps_comm else "none (each stage waits for its input)",
            "cp": "ring steps behind the attention blocks" if hw.overlaps_comm else "none",
            "ep": "none (blocking all-to-all)",
            "offload": "parameter fetches behind compute" if hw.overlaps_comm else "none"}


def _tensor_count(params: Any) -> int:
    return sum(count for _, _, count in params.dense) + sum(count for _, _, count in params.expert)
