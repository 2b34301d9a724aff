"""Training-state bytes per rank: TP / PP / EP division, ZeRO partitioning, offload placement."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

from harness.plan.conventions import (DEEPSPEED_MAX_REUSE_DISTANCE, StateConvention, flat_shard_numel, partition_numel,
                                      state_convention)
from harness.plan.model_spec import ModelSpec, ParamTensor, param_tensors
from harness.plan.parallel_dims import ParallelDims
from harness.plan.pipeline import V_SCHEDULES, rank_layers, rank_stages, stage_layer_counts, stage_layer_indices
from harness.plan.resharding import reshard_after_forward
from harness.plan.support import ENGINE_SUPPORT


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
    # FSDP1 wrap units as ((parameter numels in module order), count): the decoder layer, `layers`
    # times, and the root (embedding, final norm, lm_head).
    units: Tuple[Tuple[Tuple[int, ...], int], ...] = ()
    # The dense groups that run forward only and never get a gradient (ParamTensor.trained False).
    untrained: Tuple[Tuple[int, int, int], ...] = ()
    # In forward order, each module's parameter numels as one tuple: the first stage's embedding tables, every
    # decoder layer's tensors, the last stage's final norm and lm_head ("tied": the lm_head is the embedding
    # table, one parameter used twice). Read by deepspeed_kept_numel.
    first_modules: Tuple[int, ...] = ()
    layer_modules: Tuple[Tuple[int, ...], ...] = ()
    last_modules: Tuple[int, ...] = ()
    tied: bool = False


_RANK_PARAMS: Dict[tuple, Tuple[ModelSpec, RankParams]] = {}


def rank_shape(t: ParamTensor, tp: int, ep: int, split_tp: bool = True) -> Tuple[int, int]:
    """(elements, first dimension) of one rank's piece of `t`: its TP dimension split (the larger piece of an uneven
    split) and experts spread over ep."""
    shape = list(t.shape)
    if split_tp and t.tp_dim is not None and tp > 1:
        shape[t.tp_dim] = -(-shape[t.tp_dim] // tp)
    if t.expert and ep > 1:
        shape[0] //= ep
    numel = 1
    for size in shape:
        numel *= size
    return numel, shape[0]


def rank_params(spec: ModelSpec, tp: int, ep: int, layer_ids: Tuple[int, ...], first: bool, last: bool, pp: int,
                tp_shards_vocab: Tuple[bool, bool]) -> RankParams:
    """What one rank holds: the decoder layers `layer_ids` (each with its own kind's tensors), plus the
    embedding on the first stage and the final norm + lm_head on the last (Narayanan et al. 2021, sec. 2.2).
    A tied lm_head on a different stage than the embedding is a second copy there (Megatron keeps one and
    all-reduces its gradient)."""
    key = (id(spec), tp, ep, layer_ids, first, last, pp, tp_shards_vocab)
    hit = _RANK_PARAMS.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    dense: List[Tuple[int, int, int]] = []
    expert: List[Tuple[int, int, int]] = []
    untrained: List[Tuple[int, int, int]] = []
    units: List[Tuple[Tuple[int, ...], int]] = []
    layer_modules = tuple(tuple(rank_shape(t, tp, ep)[0]
                                for t in _execution_order(spec.layer_kinds[spec.layer_pattern[i]])) for i in layer_ids)
    for kind, count in sorted(Counter(spec.layer_pattern[i] for i in layer_ids).items()):
        layer_numels = []
        for t in spec.layer_kinds[kind]:
            numel, dim0 = rank_shape(t, tp, ep)
            (expert if t.expert else dense).append((numel, dim0, count))
            if not t.trained:
                untrained.append((numel, dim0, count))
            layer_numels.append(numel)
        units.append((tuple(layer_numels), count))
    largest = max((sum(unit) for unit, _ in units), default=0)
    root_numels = _root_tensors(spec, tp, ep, first, last, pp, tp_shards_vocab, dense)
    first_count = len(spec.first_tensors) if first else 0
    largest = max([largest, *root_numels])
    dense_total = sum(n * c for n, _, c in dense)
    expert_total = sum(n * c for n, _, c in expert)
    units = [unit for unit in (*units, (tuple(root_numels), 1)) if unit[0] and unit[1]]
    tied = spec.tied_embeddings and first and last
    result = RankParams(tuple(dense), dense_total, tuple(expert), expert_total, largest, len(layer_ids), first,
                        last, tuple(units), tuple(untrained), tuple(root_numels[:first_count]), layer_modules,
                        tuple(root_numels[first_count:]), tied)
    _RANK_PARAMS[key] = (spec, result)
    return result


def _execution_order(tensors: Sequence[ParamTensor]) -> List[ParamTensor]:
    """A layer's tensors in about the order its forward runs them: norms and biases (1-D) first, then the matrices
    in transformers' order, whose last (the MLP's output projection) is where the layer's backward begins."""
    return [t for t in tensors if len(t.shape) < 2] + [t for t in tensors if len(t.shape) >= 2]


def _root_tensors(spec: ModelSpec, tp: int, ep: int, first: bool, last: bool, pp: int,
                  tp_shards_vocab: Tuple[bool, bool], dense: List[Tuple[int, int, int]]) -> List[int]:
    """Appends the embedding (first stage) and final norm + lm_head (last stage) to `dense`; their numels."""
    _, first_t, last_t = param_tensors(spec)
    root_numels: List[int] = []
    if first:
        for i, t in enumerate(first_t):
            numel, dim0 = rank_shape(t, tp, ep, split_tp=tp_shards_vocab[0] or i > 0)
            dense.append((numel, dim0, 1))
            root_numels.append(numel)
    if last:
        head = list(last_t)
        if spec.tied_embeddings and (pp > 1 and not first):
            head.append(first_t[0])
        for t in head:
            numel, dim0 = rank_shape(t, tp, ep, split_tp=tp_shards_vocab[1])
            dense.append((numel, dim0, 1))
            root_numels.append(numel)
    return root_numels


def state_bytes(conv: StateConvention, params: RankParams, zero_stage: int, dense_shards: int,
                expert_shards: int) -> Dict[str, int]:
    """Bytes of each training state on one rank: each state is partitioned over the data-parallel
    shard group once zero_stage reaches its shard stage (Rajbhandari et al. 2020, sec. 5: P_os, P_os+g,
    P_os+g+p), experts over the group divided by ep."""
    rule = conv.partition
    numel: Dict[bool, int] = {}
    for sharded in {zero_stage >= conv.param_shard_stage, zero_stage >= conv.grad_shard_stage,
                    zero_stage >= conv.optimizer_shard_stage}:
        if rule == "flat":  # FSDP1: dense and expert tensors share each unit's flat parameter
            numel[sharded] = flat_numel(params, dense_shards if sharded else 1)
            continue
        numel[sharded] = (
            partition_numel(rule, params.dense, params.dense_total, dense_shards, sharded, zero_stage)
            + (partition_numel(rule, params.expert, params.expert_total, expert_shards, sharded, zero_stage)
               if params.expert else 0))
    p_numel = numel[zero_stage >= conv.param_shard_stage]
    g_sharded, o_sharded = zero_stage >= conv.grad_shard_stage, zero_stage >= conv.optimizer_shard_stage
    g_numel = numel[g_sharded] - _untrained_numel(conv, params, g_sharded, dense_shards, zero_stage)
    o_numel = numel[o_sharded] - _untrained_numel(conv, params, o_sharded, dense_shards, zero_stage)
    return {
        "param": p_numel * conv.param,
        "grad": g_numel * conv.grad,
        "master": o_numel * conv.master,
        "moments": o_numel * conv.moments,
        "optimizer_grad": o_numel * conv.optimizer_grad,
        "grad_numel": g_numel,
    }


def _untrained_numel(conv: StateConvention, params: RankParams, sharded: bool, shards: int, zero_stage: int) -> int:
    """Elements of the forward-only tensors' partition, which hold no gradient or optimizer state where the
    engine keeps those only for parameters the backward reaches (per-tensor partitions: a sum over tensors)."""
    if conv.states_for_untrained or not params.untrained:
        return 0
    total = sum(n * c for n, _, c in params.untrained)
    return partition_numel(conv.partition, params.untrained, total, shards, sharded, zero_stage)


def flat_numel(params: RankParams, group: int) -> int:
    """Elements one rank stores of its FSDP1 flat parameters (use_orig_params=False, as rendered)."""
    if group == 1:
        return params.dense_total + params.expert_total
    return sum(count * flat_shard_numel(unit, group) for unit, count in params.units)


def gathered_bytes(conv: StateConvention, params: RankParams, layout: Any) -> int:
    """Unsharded compute copies of sharded parameters: a few modules at a time (the largest one,
    `gathered_layers` deep) where they are freed after forward (stage 3 without pipelining); otherwise every
    module stays gathered from its forward until its backward (FSDP SHARD_GRAD_OP), and under pipelining until
    the step's last backward (harness.plan.resharding)."""
    if layout.zero_stage < conv.param_shard_stage:
        return 0
    if reshard_after_forward(layout):
        live = conv.gathered_layers * params.largest_unit
        if conv.kept_by_reuse:
            # what ZeRO-3 still holds when the backward starts, beside the gradient of the module it backwards
            recompute = layout.activation_checkpointing == "full"
            live = max(live, deepspeed_kept_numel(params, recompute, DEEPSPEED_MAX_REUSE_DISTANCE)
                       + params.largest_unit)
        return live * conv.working
    return (params.dense_total + params.expert_total) * conv.working


def deepspeed_kept_numel(params: RankParams, recompute: bool, reuse_distance: float) -> int:
    """Parameter elements DeepSpeed ZeRO-3 holds gathered when the backward starts (a rank without pipelining).

    After each module DeepSpeed releases its parameters unless one of them is used again before the trace has run
    through `reuse_distance` parameter elements (stage3_max_reuse_distance; partitioned_param_coordinator.py
    __params_to_release: the modules after it are walked, each adding its parameters' numel, until the distance
    is reached). The trace here: the first stage's tables, every layer's tensors (_execution_order), the final norm
    and the lm_head (the embedding table again when tied), then the backward in reverse, under full recompute each
    layer's forward run again once its last module's backward begins; a tensor stands for its module. A parameter
    counts when, after its last forward use, its next use lies within the distance. Under the default 1e9 a model
    smaller than that keeps every layer from its forward to its backward, a larger one its last layers and the
    lm_head, the tied table through the forward too (tests/integration/test_deepspeed_device_buffers.py reads the
    gathered set off DeepSpeed)."""
    first = [(("first", j), numel) for j, numel in enumerate(params.first_modules)]
    layers = [[(("layer", i, j), numel) for j, numel in enumerate(tensors)]
              for i, tensors in enumerate(params.layer_modules)]
    last = [(("last", j), numel) for j, numel in enumerate(params.last_modules)]
    if params.tied and params.first_modules:
        last.append((("first", 0), params.first_modules[0]))
    forward = [*first, *(module for layer in layers for module in layer), *last]
    backward = list(reversed(last))
    for layer in reversed(layers):
        # recomputed (torch's non-reentrant checkpoint) when the layer's last module, its backward hook run,
        # first unpacks a saved input
        backward += [layer[-1], *layer, *reversed(layer[:-1])] if recompute and layer else [*reversed(layer)]
    trace = forward + backward + list(reversed(first))
    walked = [0]
    for _, numel in trace:
        walked.append(walked[-1] + numel)
    last_forward_use = {param: step for step, (param, _) in enumerate(forward)}
    next_use: dict = {}
    kept = 0
    for step in range(len(trace) - 1, -1, -1):  # the next use after each step, walking back
        param, numel = trace[step]
        if step < len(forward) and last_forward_use[param] == step:
            after = next_use.get(param)
            if after is not None and walked[after] - walked[step + 1] < reuse_distance:
                kept += numel
        next_use[param] = step
    return kept


def accumulated_grad_bytes(conv: StateConvention, params: RankParams, layout: Any) -> int:
    """Unsharded gradients a pipeline rank accumulates across the step's micro-batches where gradients are
    sharded (nd with FSDP2, the only engine that pipelines at zero_stage >= 2: support.py pp_zero_stages).
    torch's pipelining runs every backward but the stage's last without FSDP2's reduce-scatter
    (PipelineStage.backward_maybe_with_nosync), so each unit's full gradient lives from its first backward to
    the step's reduction, in the reduce dtype (fp32 under bf16 mixed precision:
    FSDPParam.to_accumulated_grad_if_needed). Measured before the reduction on pipeline rank 0 of pp2 x
    dp_shard2 (53,376 parameters): 213,504 bytes, 4 a parameter, in bf16 and in fp32."""
    if layout.pp == 1 or layout.zero_stage < conv.grad_shard_stage:
        return 0
    return (params.dense_total + params.expert_total - sum(n * c for n, _, c in params.untrained)) * conv.grad


# DeepSpeed 0.19.8 NVMe offload (deepspeed/runtime/swap_tensor/utils.py): a tensor is swapped only when it
# holds at least MIN_AIO_BYTES (max with aio.block_size, rendered at 1 MiB too); each swap file is padded to
# AIO_ALIGNED_BYTES (x aio.intra_op_parallelism, rendered 1).
NVME_MIN_SWAP_BYTES = 1 << 20
NVME_ALIGNED_BYTES = 1024


def nvme_split(tensors: Sequence[Tuple[int, int, int]], shards: int, element_bytes: int, files: int) -> Tuple[int, int]:
    """(bytes in NVMe swap files, bytes left in host memory) of `files` states of `element_bytes` per element,
    partitioned per tensor as ZeRO-3 does (ceil(numel / shards)): a partition of >= 1 MiB goes to NVMe, one
    I/O-aligned file per state; a smaller one stays in host memory."""
    nvme = host = 0
    for numel, _, count in tensors:
        part = -(-numel // shards) * element_bytes
        if part >= NVME_MIN_SWAP_BYTES:
            nvme += count * files * (-(-part // NVME_ALIGNED_BYTES) * NVME_ALIGNED_BYTES)
        else:
            host += count * files * part
    return nvme, host


class RankStates(NamedTuple):
    """Training-state bytes of one pipeline rank: what stays on the device, what moves off it."""

    rank: int
    layers: int
    first: bool
    last: bool
    param: int
    grad: int
    master: int
    moments: int
    optimizer_grad: int
    gathered: int
    accumulated_grad: int
    host: int
    nvme: int
    numel: int = 0  # the rank's parameter elements (after TP / PP / EP division), whose gradients backward writes


_RANK_STATES: Dict[tuple, Tuple[ModelSpec, Tuple[RankStates, ...]]] = {}


def rank_states(spec: ModelSpec, layout: Any, engine_name: str, fsdp_version: int = 2,
                grad_reduce_in_bf16: bool = False) -> Tuple[RankStates, ...]:
    """States of pipeline rank 0 and of the last rank (one rank without pipelining); memoised, since a
    sweep repeats the same sharding under many batch shapes. `fsdp_version` 1 selects FSDP1's flat
    parameters for engine=fsdp; `grad_reduce_in_bf16` Megatron's bf16 gradient buffer (state_convention)."""
    pp = layout.pp
    v = layout.pp_virtual_stages if pp > 1 else 1
    conv = state_convention(engine_name, layout.precision, layout.zero_stage, fsdp_version, grad_reduce_in_bf16)
    if conv is None:
        raise ValueError(f"no state convention for engine={engine_name!r} precision={layout.precision!r}")
    key = (id(spec), engine_name, layout.precision, layout.zero_stage, layout.tp, layout.ep, pp, v,
           layout.pp_schedule, tuple(layout.pp_stage_layers), layout.dp_shard, layout.cp,
           layout.offload_optimizer, layout.offload_params, fsdp_version, grad_reduce_in_bf16,
           # full recompute changes what DeepSpeed ZeRO-3 keeps gathered (gathered_bytes), and nothing else here
           conv.kept_by_reuse and layout.activation_checkpointing == "full")
    hit = _RANK_STATES.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    counts = stage_layer_counts(spec.num_layers, pp, v, layout.pp_stage_layers)
    result = []
    seen = set()  # the layers of each local stage, first, last: of the ranks kept (LATER_RANKS_HOLD_NO_MORE)
    for rank in candidate_ranks(pp, layout.pp_schedule, bool(layout.pp_stage_layers)):
        stages = rank_stages(layout.pp_schedule, pp, v, rank)
        layer_ids, first, last = rank_layers(counts, stages), 0 in stages, len(counts) - 1 in stages
        if layout.pp_schedule in LATER_RANKS_HOLD_NO_MORE:
            kinds = stage_kinds(spec.layer_pattern, tuple(counts))
            alike = (tuple(kinds[s] for s in stages), first, last)
            if alike in seen:
                continue  # an earlier rank with the same layers has the same states and holds as much in flight
            seen.add(alike)
        params = rank_params(spec, layout.tp, layout.ep, layer_ids, first, last, pp,
                             ENGINE_SUPPORT[engine_name].tp_shards_vocab)
        result.append(place_states(conv, params, layout, rank))
    if len(_RANK_STATES) > 1_000_000:
        _RANK_STATES.clear()
    _RANK_STATES[key] = (spec, tuple(result))
    return tuple(result)


@lru_cache(maxsize=4096)
def stage_kinds(layer_pattern: Tuple[int, ...], counts: Tuple[int, ...]) -> Tuple[Tuple[Tuple[int, int], ...], ...]:
    """Each stage's decoder layers as a multiset of layer kinds, (kind, how many) in kind order: two stages
    with the same one hold the same states (memoised: a search meets the same split under many shardings)."""
    return tuple(tuple(sorted(Counter(layer_pattern[i] for i in layers).items()))
                 for layers in stage_layer_indices(counts))


# Schedules under which a rank never holds more in flight than an earlier rank running the same layers: GPipe
# holds every micro-batch everywhere, 1F1B min(pp - rank, micro-batches) (harness.plan.activations.
# inflight_microbatches), and under the looped interleaved ones each peak moment of a later rank is held, stage by
# local stage, by one of an earlier rank (distinct_moments; tests/unit/plan/test_pipeline_memory.py checks it over
# pp 2-16, 1-4 stages a rank and 8-64 micro-batches). The V schedules place a rank's second stage by its
# distance from the end and do not: every rank of theirs is sized. Two ranks with the same layers have the same
# states, so only the earlier one's memory can be the larger.
LATER_RANKS_HOLD_NO_MORE = ("1F1B", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble")


def candidate_ranks(pp: int, schedule: str, explicit_split: bool) -> Tuple[int, ...]:
    """Pipeline ranks whose memory can be the largest. Under an even split, rank 0 (the embedding; the most
    micro-batches in flight) or the last rank (the norm and LM head; under a V schedule rank 0 holds both ends);
    an explicit split can make any rank the largest, so every rank is evaluated."""
    if pp == 1 or (schedule in V_SCHEDULES and not explicit_split):
        return (0,)
    return tuple(range(pp)) if explicit_split else (0, pp - 1)


def place_states(conv: StateConvention, params: RankParams, layout: Any, rank: int) -> RankStates:
    """Offload moves whole states off the device (Ren et al. 2021, ZeRO-Offload; Rajbhandari et al.
    2021, ZeRO-Infinity): the optimizer side (master, moments, fp32 grads, and the gradient partition
    once gradients are sharded) and / or the parameter partition."""
    zero = layout.zero_stage
    dense_shards = ParallelDims.of(layout).dp_shard_cp
    states = state_bytes(conv, params, zero, dense_shards, max(1, dense_shards // layout.ep))
    param, grad = states["param"], states["grad"]
    master, moments, optimizer_grad = states["master"], states["moments"], states["optimizer_grad"]
    host = nvme = 0
    if layout.offload_optimizer != "none":
        moved = master + moments + optimizer_grad
        master = moments = optimizer_grad = 0
        if zero >= conv.grad_shard_stage:
            moved += states["grad_numel"] * conv.offload_grad
            grad = 0
        if layout.offload_optimizer == "cpu":
            host += moved
        else:
            # DeepSpeed ZeRO-3 (the only NVMe engine), rendered with one optimizer sub-group per parameter: a
            # parameter's fp32 master, Adam moments and fp32 gradient copy go to NVMe iff its fp32 partition
            # reaches 1 MiB, otherwise they stay in host memory; the gradient partition buffer (accumulation
            # dtype, offload_grad bytes) stays in host memory for every parameter.
            fp32_states = conv.master // 4 + conv.moments // 4
            swapped, kept = nvme_split(params.dense, dense_shards, 4, fp32_states)
            swapped_grads, _ = nvme_split(params.dense, dense_shards, 4, 1)
            nvme += swapped + swapped_grads
            host += kept + states["grad_numel"] * conv.offload_grad
    if layout.offload_params != "none":
        if layout.offload_params == "cpu":
            host += param
        else:
            # max_in_cpu 0 (rendered): every partition of >= 1 MiB lives on NVMe, smaller ones in host memory.
            swapped, kept = nvme_split(params.dense, dense_shards, conv.param, 1)
            nvme += swapped
            host += kept
        param = 0
    return RankStates(rank, params.layers, params.first, params.last, param, grad, master, moments, optimizer_grad,
                      gathered_bytes(conv, params, layout), accumulated_grad_bytes(conv, params, layout), host, nvme,
                      params.dense_total + params.expert_total)
