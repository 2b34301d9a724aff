"""Per-rank memory prediction: training states by ZeRO stage and parallel layout, activations, offload."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from harness.plan.activations import (
    V_SHAPED, inflight_microbatches, layer_activations, outside_layer_bytes, rank_stages,
)
from harness.plan.conventions import COMPUTE_BYTES, StateConvention, partition_numel, state_convention
from harness.plan.model_spec import ModelSpec, ParamTensor, param_tensors
from harness.plan.support import ENGINE_SUPPORT


@dataclass(frozen=True)
class Allowance:
    """Head-room on top of the predicted bytes: allocator fragmentation, communication buckets,
    workspace (a fraction of the prediction), plus a fixed amount per rank (CUDA context, NCCL)."""

    fraction: float = 0.10
    fixed_bytes: int = 0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted bytes of one rank (the pipeline rank that needs the most)."""

    pp_rank: int
    param_bytes: int  # parameter tensors kept on the device between steps
    grad_bytes: int
    master_bytes: int  # fp32 master copy held by the optimizer
    moment_bytes: int  # Adam exp_avg + exp_avg_sq
    optimizer_grad_bytes: int  # fp32 gradient copy held by the optimizer
    gathered_bytes: int  # unsharded compute copies of sharded parameters (ZeRO-3 / FSDP)
    activation_bytes: int  # saved for backward by the micro-batches in flight
    recompute_bytes: int  # one layer's activations rebuilt during backward (full checkpointing)
    allowance_bytes: int
    total_bytes: int  # device total
    host_bytes: int  # states offloaded to host memory by this rank
    nvme_bytes: int  # states offloaded to NVMe by this rank

    @property
    def state_bytes(self) -> int:
        return (self.param_bytes + self.grad_bytes + self.master_bytes + self.moment_bytes
                + self.optimizer_grad_bytes)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class RankParams(NamedTuple):
    """Parameter tensors one rank holds after TP / PP / EP division: (numel, dim0, count) groups."""

    dense: Tuple[Tuple[int, int, int], ...]
    dense_total: int
    expert: Tuple[Tuple[int, int, int], ...]
    expert_total: int
    largest_unit: int  # numel of the largest module gathered at once (a layer, the embedding, the head)
    layers: int
    first: bool  # holds the embedding
    last: bool  # holds the final norm and lm_head


_RANK_PARAMS: Dict[tuple, Tuple[ModelSpec, RankParams]] = {}


def _local(t: ParamTensor, tp: int, ep: int, split_tp: bool = True) -> Tuple[int, int]:
    shape = list(t.shape)
    if split_tp and t.tp_dim is not None and tp > 1:
        shape[t.tp_dim] = -(-shape[t.tp_dim] // tp)
    if t.expert and ep > 1:
        shape[0] //= ep
    numel = 1
    for size in shape:
        numel *= size
    return numel, shape[0]


def rank_params(spec: ModelSpec, tp: int, ep: int, layers: int, first: bool, last: bool, pp: int,
                tp_shards_vocab: Tuple[bool, bool]) -> RankParams:
    """What one rank holds: `layers` decoder layers, plus the embedding on the first stage and the final
    norm + lm_head on the last (Narayanan et al. 2021, sec. 2.2). A tied lm_head on a different stage
    than the embedding is a second copy there (Megatron keeps one and all-reduces its gradient)."""
    key = (id(spec), tp, ep, layers, first, last, pp, tp_shards_vocab)
    hit = _RANK_PARAMS.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    layer, first_t, last_t = param_tensors(spec)
    dense: List[Tuple[int, int, int]] = []
    expert: List[Tuple[int, int, int]] = []
    layer_numel = 0
    for t in layer:
        numel, dim0 = _local(t, tp, ep)
        (expert if t.expert else dense).append((numel, dim0, layers))
        layer_numel += numel
    largest = layer_numel if layers else 0
    if first:
        for i, t in enumerate(first_t):
            numel, dim0 = _local(t, tp, ep, split_tp=tp_shards_vocab[0] or i > 0)
            dense.append((numel, dim0, 1))
            largest = max(largest, numel)
    if last:
        head = list(last_t)
        if spec.tied_embeddings and (pp > 1 and not first):
            head.append(first_t[0])
        for t in head:
            numel, dim0 = _local(t, tp, ep, split_tp=tp_shards_vocab[1])
            dense.append((numel, dim0, 1))
            largest = max(largest, numel)
    dense_total = sum(n * c for n, _, c in dense)
    expert_total = sum(n * c for n, _, c in expert)
    result = RankParams(tuple(dense), dense_total, tuple(expert), expert_total, largest, layers, first, last)
    _RANK_PARAMS[key] = (spec, result)
    return result


def _partition(rule: str, groups: Sequence[Tuple[int, int, int]], total: int, shards: int, sharded: bool,
               zero_stage: int) -> int:
    # Expand (numel, dim0, count) groups lazily: the rules are sums over tensors, so count multiplies.
    if not groups:
        return 0
    if rule in ("dim0", "deepspeed") and sharded and shards > 1 and not (rule == "deepspeed" and zero_stage < 3):
        return sum(c * partition_numel(rule, ((n, d0),), n, shards, True, zero_stage) for n, d0, c in groups)
    return partition_numel(rule, (), total, shards, sharded, zero_stage)


def stage_layer_counts(num_layers: int, pp: int, virtual_stages: int, explicit: Sequence[int]) -> Tuple[int, ...]:
    """Layers of each pipeline stage: the explicit split, or an even one."""
    stages = pp * virtual_stages
    if explicit:
        return tuple(explicit)
    return (num_layers // stages,) * stages


def state_bytes(conv: StateConvention, params: RankParams, zero_stage: int, dense_shards: int,
                expert_shards: int) -> Dict[str, int]:
    """Bytes of each training state on one rank: each state is partitioned over the data-parallel
    shard group once zero_stage reaches its shard stage (Rajbhandari et al. 2020, sec. 5: P_os, P_os+g,
    P_os+g+p), experts over the group divided by ep."""
    rule = conv.partition

    def numel(sharded: bool) -> int:
        return (_partition(rule, params.dense, params.dense_total, dense_shards, sharded, zero_stage)
                + _partition(rule, params.expert, params.expert_total, expert_shards, sharded, zero_stage))

    p_numel = numel(zero_stage >= conv.param_shard_stage)
    g_numel = numel(zero_stage >= conv.grad_shard_stage)
    o_numel = numel(zero_stage >= conv.optimizer_shard_stage)
    return {
        "param": p_numel * conv.param,
        "grad": g_numel * conv.grad,
        "master": o_numel * conv.master,
        "moments": o_numel * conv.moments,
        "optimizer_grad": o_numel * conv.optimizer_grad,
        "grad_numel": g_numel,
    }


def gathered_bytes(conv: StateConvention, params: RankParams, zero_stage: int) -> int:
    """Unsharded compute copies of sharded parameters: at stage 3 a few modules at a time (the
    largest one, `gathered_layers` deep); when parameters are sharded at rest below stage 3 (FSDP
    SHARD_GRAD_OP) every module stays gathered from its forward until its backward."""
    if zero_stage < conv.param_shard_stage:
        return 0
    if zero_stage >= 3:
        return conv.gathered_layers * params.largest_unit * conv.working
    return (params.dense_total + params.expert_total) * conv.working


def memory_per_rank(spec: ModelSpec, layout: Any, engine: Any, accelerator: str,
                    allowance: Allowance = Allowance()) -> MemoryBreakdown:
    """The breakdown of the pipeline rank with the largest total (rank 0 and the last rank compared).

    `layout` is a harness.config.schema.LayoutConfig, `engine` an EngineConfig; the layout must have
    passed validation.
    """
    support = ENGINE_SUPPORT[engine.name]
    conv = state_convention(engine.name, layout.precision, layout.zero_stage)
    if conv is None:
        raise ValueError(f"no state convention for engine={engine.name!r} precision={layout.precision!r}")
    pp, v = layout.pp, layout.pp_virtual_stages if layout.pp > 1 else 1
    schedule = layout.pp_schedule
    counts = stage_layer_counts(spec.num_layers, pp, v, layout.pp_stage_layers)
    n_stages = len(counts)
    ranks = (0,) if pp == 1 or schedule in V_SHAPED else (0, pp - 1)
    best: Optional[MemoryBreakdown] = None
    for rank in ranks:
        stages = rank_stages(schedule, pp, v, rank) if pp > 1 else (0,)
        breakdown = _rank_breakdown(spec, layout, engine, accelerator, allowance, support, conv, rank,
                                    sum(counts[s] for s in stages), 0 in stages, n_stages - 1 in stages)
        if best is None or breakdown.total_bytes > best.total_bytes:
            best = breakdown
    return best


def _rank_breakdown(spec: ModelSpec, layout: Any, engine: Any, accelerator: str, allowance: Allowance,
                    support: Any, conv: StateConvention, rank: int, layers: int, first: bool,
                    last: bool) -> MemoryBreakdown:
    tp, ep, zero = layout.tp, layout.ep, layout.zero_stage
    params = rank_params(spec, tp, ep, layers, first, last, layout.pp, support.tp_shards_vocab)
    dense_shards = layout.dp_shard * layout.cp
    states = state_bytes(conv, params, zero, dense_shards, max(1, dense_shards // ep))
    device = dict(states)
    host = nvme = 0
    # Offload moves whole states off the device (Ren et al. 2021, ZeRO-Offload; Rajbhandari et al.
    # 2021, ZeRO-Infinity): the optimizer side (master, moments, fp32 grads, and the gradient partition
    # once gradients are sharded) and / or the parameter partition.
    if layout.offload_optimizer != "none":
        moved = states["master"] + states["moments"] + states["optimizer_grad"]
        device["master"] = device["moments"] = device["optimizer_grad"] = 0
        if zero >= conv.grad_shard_stage:
            moved += states["grad_numel"] * conv.offload_grad
            device["grad"] = 0
        if layout.offload_optimizer == "cpu":
            host += moved
        else:
            nvme += moved
    if layout.offload_params != "none":
        if layout.offload_params == "cpu":
            host += states["param"]
        else:
            nvme += states["param"]
        device["param"] = 0
    gathered = gathered_bytes(conv, params, zero)
    activations, recompute = activation_bytes(spec, layout, engine, accelerator, support.activation_profile,
                                              rank, layers, first, last)
    predicted = (device["param"] + device["grad"] + device["master"] + device["moments"]
                 + device["optimizer_grad"] + gathered + activations + recompute)
    extra = int(allowance.fraction * predicted) + allowance.fixed_bytes
    return MemoryBreakdown(
        pp_rank=rank, param_bytes=device["param"], grad_bytes=device["grad"], master_bytes=device["master"],
        moment_bytes=device["moments"], optimizer_grad_bytes=device["optimizer_grad"],
        gathered_bytes=gathered, activation_bytes=activations, recompute_bytes=recompute,
        allowance_bytes=extra, total_bytes=predicted + extra, host_bytes=host, nvme_bytes=nvme,
    )


def activation_bytes(spec: ModelSpec, layout: Any, engine: Any, accelerator: str, profile: str, rank: int,
                     layers: int, first: bool, last: bool) -> Tuple[int, int]:
    """(saved activations at the rank's peak, one layer rebuilt by full recomputation).

    Per layer and micro-batch: tokens x (boundary / (tp if sequence parallel) + (sharded + quadratic x
    seq) / tp) (Korthikanti et al. 2022, eq. for TP + SP); context parallelism divides the tokens;
    selective recomputation drops the quadratic term (sec. 4.2); full recomputation keeps only each
    layer's input (sec. 5). The pipeline schedule sets how many micro-batches are in flight (sec. 4.2.3).
    """
    e = COMPUTE_BYTES[layout.precision]
    mask = e if accelerator == "cpu" else 1  # CPU dropout saves its mask in the input dtype
    act = layer_activations(spec, profile, e, mask)
    tp = layout.tp
    sp = tp if engine.sequence_parallel else 1
    seq_local = layout.seq_len // layout.cp
    tokens = layout.micro_batch * seq_local
    full_layer = tokens * (act.boundary / sp + (act.sharded + act.quadratic * layout.seq_len) / tp)
    ckpt = layout.activation_checkpointing
    if ckpt == "full":
        per_layer, recompute = tokens * act.checkpoint / sp, full_layer
    elif ckpt == "selective":
        per_layer, recompute = tokens * (act.boundary / sp + act.sharded / tp), 0.0
    else:
        per_layer, recompute = full_layer, 0.0
    vocab_tp = ENGINE_SUPPORT[engine.name].tp_shards_vocab[1]
    loss_divisor = tp if (profile == "megatron" or (engine.loss_parallel and vocab_tp)) else 1
    outside = outside_layer_bytes(spec, profile, e, mask, seq_local, layout.micro_batch, sp, sp, loss_divisor,
                                  first, last, ckpt == "full")
    inflight = inflight_microbatches(layout.pp_schedule, layout.pp, layout.pp_virtual_stages if layout.pp > 1 else 1,
                                     layout.grad_accum, rank)
    return int(inflight * (layers * per_layer + outside)), int(recompute)
