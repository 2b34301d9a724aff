"""Enumerate the layouts of a model on a cluster, prune invalid and out-of-memory ones, rank by predicted
tokens/s (ties by memory margin), and say why the best beats the runner-up."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from harness.plan.parallel_dims import ParallelDims
from harness.plan.planner import Plan, make_plan, spec_for, with_time
from harness.plan.support import ENGINE_SUPPORT

CHECKPOINTING_BY_MEMORY = ("full", "selective", "none")  # least activation memory first
MICRO_BATCHES = (1, 2, 4, 8)
# Schedules the search tries, with their chunks per rank. GPipe has 1F1B's bubble with more memory,
# LoopedBFS Interleaved1F1B's, DualPipeV ZB-V's: each is dominated and left out.
SCHEDULES = (("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 4), ("ZBVZeroBubble", 2),
             ("InterleavedZeroBubble", 2))


def _powers_of_two(limit: int) -> List[int]:
    return [1 << i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


def stage_split(num_layers: int, stages: int) -> List[int]:
    """Layers per stage when `stages` does not divide the layers: as even as possible, the extra layers on
    the middle stages (the first and last also hold the embedding and the head)."""
    base, extra = divmod(num_layers, stages)
    start = (stages - extra) // 2
    return [base + (start <= i < start + extra) for i in range(stages)]


def structures(spec: Any, world: int, gpus_per_node: int, engine: str) -> Iterator[Dict[str, Any]]:
    """Degrees, schedule and sharding of every candidate (batch shape and checkpointing left open)."""
    support = ENGINE_SUPPORT[engine]
    tps = [t for t in _powers_of_two(gpus_per_node) if not any(heads % t for heads in spec.split_heads)
           and world % t == 0] if support.tp else [1]
    for tp in tps:
        for cp in (_powers_of_two(min(8, world // tp)) if support.cp else [1]):
            for pp in (_powers_of_two(min(64, world // (tp * cp), spec.num_layers)) if support.pp_schedules else [1]):
                dp = world // (tp * cp * pp)
                if dp * tp * cp * pp != world:
                    continue
                for schedule, chunks in (SCHEDULES if pp > 1 else (("1F1B", 1),)):
                    if pp > 1 and schedule not in support.pp_schedules:
                        continue
                    stages = pp * chunks
                    if stages > spec.num_layers:
                        continue
                    split = [] if spec.num_layers % stages == 0 else stage_split(spec.num_layers, stages)
                    for fields in _sharding(dict(tp=tp, cp=cp, pp=pp, pp_schedule=schedule,
                                                 pp_virtual_stages=chunks, pp_stage_layers=split), dp, support, pp):
                        for ep in expert_degrees(spec, support, fields["dp_shard"] * cp):
                            yield dict(fields, ep=ep)


def expert_degrees(spec: Any, support: Any, shard_group: int) -> List[int]:
    """Expert-parallel degrees to try: powers of two dividing the routed experts and the shard group
    dp_shard x cp the experts borrow their ranks from (torchtitan, Megatron); 1 for a dense model or an
    engine without expert parallelism."""
    if not (support.ep and spec.num_experts):
        return [1]
    return [e for e in _powers_of_two(shard_group) if spec.num_experts % e == 0 and shard_group % e == 0]


def _sharding(base: Dict[str, Any], dp: int, support: Any, pp: int) -> Iterator[Dict[str, Any]]:
    stages = support.pp_zero_stages if pp > 1 else support.zero_stages
    for zero in stages:
        shards = [dp] + [s for s in (8, 64, 512) if s < dp and dp % s == 0 and zero in support.hybrid_zero_stages]
        for shard in shards:
            for offload in ("none", "cpu"):
                if offload == "cpu" and zero not in support.offload_optimizer.get("cpu", ()):
                    continue
                params = "cpu" if offload == "cpu" and (support.offload_together or zero == 3) else "none"
                yield dict(base, dp_shard=shard, dp_replicate=dp // shard, zero_stage=zero,
                           offload_optimizer=offload, offload_params=params)


def candidates(cfg: Any, global_batch: int) -> Iterator[Plan]:
    """Plans of every structure x checkpointing x micro-batch whose accumulation makes `global_batch`
    sequences; a structure stops at the first micro-batch that does not fit (bigger ones need more), and
    checkpointing modes are tried from least to most activation memory."""
    spec = spec_for(cfg.model)
    cluster = cfg.cluster
    for fields in structures(spec, cluster.ranks, cluster.accelerators_per_node, cfg.engine.name):
        dp = ParallelDims(dp_replicate=fields["dp_replicate"], dp_shard=fields["dp_shard"]).dp
        tp = fields["tp"]
        engine = replace(cfg.engine, sequence_parallel=tp > 1, loss_parallel=tp > 1) \
            if cfg.engine.name == "nd" else cfg.engine
        fitted_any = False
        for checkpointing in CHECKPOINTING_BY_MEMORY:
            if checkpointing != "full" and not fitted_any:
                break  # more activation memory than a layout that already does not fit
            for micro in MICRO_BATCHES:
                accum, rest = divmod(global_batch, dp * micro)
                if rest or accum < 1:
                    continue
                layout = replace(cfg.layout, micro_batch=micro, grad_accum=accum,
                                 activation_checkpointing=checkpointing, **fields)
                plan = make_plan(replace(cfg, layout=layout, engine=engine), predict_time=False)
                if not plan.valid:
                    continue
                if not plan.fits:
                    break
                fitted_any = True
                yield with_time(plan, replace(cfg, layout=layout, engine=engine))


def rank(cfg: Any, global_batch: int, top_k: int = 5) -> Tuple[List[Plan], int]:
    """The `top_k` fitting plans by predicted tokens/s (ties: larger memory margin), and how many fit."""
    timed: List[Tuple[float, int, Plan]] = []
    count = 0
    for plan in candidates(cfg, global_batch):
        count += 1
        if plan.tokens_per_s:
            timed.append((plan.tokens_per_s, plan.margin_bytes or 0, plan))
    # six significant digits: layouts the model cannot tell apart are ties
    timed.sort(key=lambda row: (-float(f"{row[0]:.6g}"), -row[1], _axes(row[2].layout)))
    return [plan for _, _, plan in timed[:top_k]], count


def _axes(layout: Any) -> Tuple[int, int]:
    """Ties go to the simpler layout: fewer parallel axes in use, then smaller model-parallel degrees."""
    degrees = (layout.tp, layout.cp, layout.pp, layout.dp_replicate, layout.pp_virtual_stages)
    return sum(d > 1 for d in degrees), layout.tp * layout.cp * layout.pp


def _parts(plan: Plan) -> Dict[str, float]:
    t = plan.time
    parts = {f"compute {k}": v for k, v in t.compute_s.items()}
    parts.update({f"exposed {k} comm": v["exposed"] for k, v in t.comm_s.items()})
    parts.update({"pipeline bubble": t.bubble_s, "optimizer": t.optimizer_s, "offload": t.offload_s})
    return parts


def explain(best: Plan, runner_up: Plan) -> str:
    """Why `best` is faster: the breakdown items whose difference (per token) decides it, largest first."""
    a, b = _parts(best), _parts(runner_up)
    # per token, so layouts with different tokens per step compare fairly
    ta, tb = best.tokens_per_step, runner_up.tokens_per_step
    diffs = sorted(((b[k] / tb - a[k] / ta) * ta, k) for k in a)
    gains = [f"{k} {b[k] / tb * ta:.3g} s -> {a[k]:.3g} s" for d, k in reversed(diffs) if d > 0][:3]
    losses = [f"{k} {b[k] / tb * ta:.3g} s -> {a[k]:.3g} s" for d, k in diffs if d < 0][:2]
    ratio = best.tokens_per_s / runner_up.tokens_per_s
    text = f"{ratio:.3f}x the tokens/s; saves " + ("; ".join(gains) or "nothing measurable")
    if losses:
        text += "; pays " + "; ".join(losses)
    if abs(ratio - 1) < 1e-9:
        text += f" (a tie: the larger memory margin, then the simpler layout wins)"
    return text
