"""Enumerate the layouts of a model on a cluster, keep those the one validity decision admits, rank them by
predicted tokens/s into choices (layouts the model cannot separate are one), and compare two part by part."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from typing import Any, Callable, Dict, Iterator, List, Sequence, Set, Tuple

from harness.plan.parallel_dims import ParallelDims
from harness.plan.peak import peak_flops
from harness.plan.planner import Plan, make_plan, spec_for, with_time
from harness.plan.support import ENGINE_SUPPORT, compile_problem
from harness.plan.uncertainty import overlaps
from harness.plan.validate import check_fp8

CHECKPOINTING_BY_MEMORY = ("full", "selective", "none")  # least activation memory first
MICRO_BATCHES = (1, 2, 4, 8)
# Schedules the search tries, with their chunks per rank. GPipe has 1F1B's bubble with more memory,
# LoopedBFS Interleaved1F1B's, DualPipeV ZB-V's: each is dominated and left out.
SCHEDULES = (("1F1B", 1), ("Interleaved1F1B", 2), ("Interleaved1F1B", 4), ("ZBVZeroBubble", 2),
             ("InterleavedZeroBubble", 2))


# A refusal's numbers (degrees, sizes, counts) vary between candidates; the rule behind it does not.
_NUMBER = re.compile(r"\d[\d.,]*")


def rule(reason: str) -> str:
    """The rule behind one refusal: its wording with the numbers blanked."""
    return _NUMBER.sub("#", reason)


def _divisors(n: int, limit: int) -> List[int]:
    """The divisors of `n` up to `limit`: the degrees an axis can take when the others split `n` ranks (powers of
    two on the usual 2^k-GPU clusters; 3 and 6 on a node of 6 GPUs)."""
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def stage_split(num_layers: int, stages: int) -> List[int]:
    """Layers per stage when `stages` does not divide the layers: as even as possible, the extra layers on
    the middle stages (the first and last also hold the embedding and the head)."""
    base, extra = divmod(num_layers, stages)
    start = (stages - extra) // 2
    return [base + (start <= i < start + extra) for i in range(stages)]


def structures(spec: Any, world: int, gpus_per_node: int, engine: str) -> Iterator[Dict[str, Any]]:
    """Degrees, schedule and sharding of every candidate (batch shape and checkpointing left open)."""
    support = ENGINE_SUPPORT[engine]
    tps = [t for t in _divisors(gpus_per_node, gpus_per_node) if not any(heads % t for heads in spec.split_heads)
           and world % t == 0] if support.tp else [1]
    for tp in tps:
        for cp in (_divisors(world // tp, 8) if support.cp else [1]):
            for pp in (_divisors(world // (tp * cp), min(64, spec.num_layers)) if support.pp_schedules else [1]):
                dp = world // (tp * cp * pp)
                if dp * tp * cp * pp != world or (cp > 1 and pp > 1 and not support.cp_with_pp):
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
    """Expert-parallel degrees to try: the divisors of the routed experts and of the shard group dp_shard x cp
    the experts borrow their ranks from (torchtitan, Megatron); 1 for a dense model or an engine without
    expert parallelism."""
    if not (support.ep and spec.num_experts):
        return [1]
    return [e for e in _divisors(shard_group, shard_group) if spec.num_experts % e == 0]


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


# The one validity decision (harness.engines.admission.judge: layout, engine, memory, launcher rules) as the
# recommender asks it: every reason a config with its plan is refused; empty means it may run.
Admit = Callable[[Any, Plan], Sequence[str]]


# The regime fields the search varies unless the command line sets them (harness.launch.recommend).
REGIME_FIELDS = ("layout.precision", "engine.compile")
# Engine options the search sets per candidate (tensor_parallel_options) unless the command line sets them.
TENSOR_PARALLEL_FIELDS = ("engine.sequence_parallel", "engine.loss_parallel")
# The layout fields every candidate sets (structures, _sharding, _batch_shapes): a value given for one on the
# command line would be overwritten; `--constrain` keeps only the candidates that have it.
SEARCHED_LAYOUT_FIELDS = ("dp_replicate", "dp_shard", "tp", "cp", "pp", "ep", "pp_schedule", "pp_virtual_stages",
                          "pp_stage_layers", "zero_stage", "offload_optimizer", "offload_params", "micro_batch",
                          "grad_accum", "activation_checkpointing")


def regimes(cfg: Any, pinned: Sequence[str] = ()) -> List[Tuple[str, bool]]:
    """(precision, compile) pairs the search tries: the config's own, and, for each field not `pinned`:
    - fp8 beside bf16 where the engine and the device have FP8 (harness.plan.validate.check_fp8 without the
      dimension rule, which the layout's tp decides and validation applies per candidate): FP8 is bf16 with
      the decoder linears converted, so it is offered from bf16 only (fp32 and fp16 runs chose their numerics);
    - compile beside eager where the engine compiles (harness.plan.support.compile_problem) on a device with a
      datasheet: the time model's compile rule (harness.plan.regime) is GPU kernel fusion; on a CPU the
      compile time (15 s a run here) outweighs the short runs it would shorten, so it stays as configured."""
    engine, layout, accelerator = cfg.engine, cfg.layout, cfg.cluster.accelerator
    precisions = [layout.precision]
    if ("layout.precision" not in pinned and layout.precision == "bf16"
            and not check_fp8(engine.name, accelerator, ())[0]):
        precisions.append("fp8")
    compiles = [bool(engine.compile)]
    if ("engine.compile" not in pinned and not engine.compile and peak_flops(accelerator, "bf16").flops
            and not compile_problem(engine.name, True, getattr(engine, "fsdp_version", 2))):
        compiles.append(True)
    return [(precision, compiled) for precision in precisions for compiled in compiles]


def candidates(cfg: Any, global_batch: int, admit: Admit, pinned: Sequence[str] = ()) -> Iterator[Plan]:
    """Plans of every structure x regime (regimes) x checkpointing x micro-batch whose accumulation makes
    `global_batch` sequences and that `admit` accepts (`pinned`: REGIME_FIELDS and TENSOR_PARALLEL_FIELDS kept
    as configured). Checkpointing modes go from least to most activation memory; a mode stops at the first
    micro-batch that does not fit (bigger ones need more) or that is refused for the very reasons its smallest
    was, numbers and all (reasons the micro-batch does not enter), and a structure at a mode whose smallest does
    not fit, or breaks no rule the mode before did not (rules the checkpointing mode does not lift)."""
    spec = spec_for(cfg.model)
    cluster = cfg.cluster
    tried = regimes(cfg, pinned)
    for fields in structures(spec, cluster.ranks, cluster.accelerators_per_node, cfg.engine.name):
        dp = ParallelDims(dp_replicate=fields["dp_replicate"], dp_shard=fields["dp_shard"]).dp
        for precision, compiled in tried:
            engine = replace(tensor_parallel_options(cfg.engine, fields["tp"], pinned), compile=compiled)
            structure = replace(cfg, layout=replace(cfg.layout, precision=precision, **fields), engine=engine)
            yield from _batch_shapes(structure, dp, global_batch, admit,
                                     searched_compile=compiled and not cfg.engine.compile)


def _batch_shapes(cfg: Any, dp: int, global_batch: int, admit: Admit,
                  searched_compile: bool = False) -> Iterator[Plan]:
    """`searched_compile`: compile is a regime the search added (regimes), not the config's own. A checkpointing
    mode that cannot compile (harness.plan.support.compile_problem, the rule validation applies) is then not
    tried: the eager regime tries the same layouts, and a refusal for an option the user never set is noise."""
    before: Set[str] = set()  # the rules the previous mode's smallest micro-batch broke (before its time)
    first: Set[str] = set()  # the reasons this mode's smallest micro-batch was refused for, numbers and all
    layout, engine = cfg.layout, cfg.engine
    for checkpointing in CHECKPOINTING_BY_MEMORY:
        if searched_compile and compile_problem(engine.name, True, engine.fsdp_version, layout.pp,
                                                layout.pp_schedule, layout.tp, checkpointing):
            continue
        smallest = True  # the first micro-batch this mode tries
        for micro in MICRO_BATCHES:
            accum, rest = divmod(global_batch, dp * micro)
            if rest or accum < 1:
                continue
            point = replace(cfg, layout=replace(cfg.layout, micro_batch=micro, grad_accum=accum,
                                                activation_checkpointing=checkpointing))
            plan = make_plan(point, predict_time=False)
            if plan.valid and not plan.fits:
                admit(point, plan)  # refused for memory; asked anyway, so that a caller's admit sees why
                if smallest:
                    return  # the later modes hold more activations at this micro-batch
                break
            reasons = admit(point, plan)
            if smallest:
                rules = {rule(reason) for reason in reasons}
                if rules and rules <= before:
                    return  # no rule the previous mode did not break: the mode is not what refuses it
                before, first, smallest = rules, set(reasons), False
            elif reasons and set(reasons) == first:
                break  # refused word for word as its smallest micro-batch was: the micro-batch is not what refuses it
            if reasons:
                continue
            # judged again with its predicted time: the time limit needs the step time and start-up
            timed = with_time(plan, point)
            if admit(point, timed):
                continue
            yield timed


def tensor_parallel_options(engine: Any, tp: int, pinned: Sequence[str] = ()) -> Any:
    """Sequence and loss parallelism on the tensor-parallel axis wherever the engine has the option (nd,
    Megatron-LM), on exactly when tp > 1: the all-reduce of TP becomes a reduce-scatter + all-gather of the same
    bytes while norms, dropout and the loss run on 1/tp of the sequence (Korthikanti et al. 2022, sec. 4.2.2),
    and Megatron-LM requires it with expert parallelism. An option `pinned` (engine.<option>) keeps its value."""
    names = {f.name for f in dataclass_fields(engine)}
    return replace(engine, **{option: tp > 1 for option in ("sequence_parallel", "loss_parallel")
                              if option in names and f"engine.{option}" not in pinned})


def rank(cfg: Any, global_batch: int, admit: Admit, top_k: int = 5,
         pinned: Sequence[str] = ()) -> Tuple[List["Choice"], int]:
    """The `top_k` choices by predicted tokens/s (harness.plan.recommend.choices) among the layouts `admit`
    accepts, and how many it accepts (`pinned`: the REGIME_FIELDS the search keeps as configured)."""
    timed: List[Plan] = []
    count = 0
    for plan in candidates(cfg, global_batch, admit, pinned):
        count += 1
        if plan.tokens_per_s:
            timed.append(plan)
    timed.sort(key=lambda plan: (-plan.tokens_per_s, -(plan.margin_bytes or 0), _axes(plan.layout)))
    return choices(timed, top_k), count


# Layouts predicted within 1% of each other are one choice: the model's constants (NCCL's latencies, the
# achievable matmul rate, overlap fractions) are known to a few percent, and its median error against published
# throughput is far larger (tests/unit/plan/test_published_throughput.py), so a smaller gap ranks nothing.
RESOLUTION = 0.01


@dataclass(frozen=True)
class Choice:
    """Layouts the time model cannot separate: `plan` stands for them (the simplest, then the roomiest, then
    the fastest), `alike` are the others."""

    plan: Plan
    alike: Tuple[Plan, ...]


def choices(ranked: Sequence[Plan], top_k: int) -> List[Choice]:
    """Plans sorted by tokens/s (fastest first) grouped into the first `top_k` choices: each takes every plan
    within RESOLUTION of its fastest."""
    groups: List[List[Plan]] = []
    for plan in ranked:
        if groups and plan.tokens_per_s >= groups[-1][0].tokens_per_s * (1 - RESOLUTION):
            groups[-1].append(plan)
        elif len(groups) == top_k:
            break
        else:
            groups.append([plan])
    out = []
    for group in groups:
        lead = min(group, key=lambda p: (_axes(p.layout), -(p.margin_bytes or 0), -p.tokens_per_s))
        out.append(Choice(lead, tuple(p for p in group if p is not lead)))
    return out


def band_ties(top: Sequence[Choice]) -> List[int]:
    """The ranks (2, 3, ...) of the choices whose predicted tokens/s band overlaps the first's
    (harness.plan.uncertainty.overlaps): the model's calibration residuals cannot say which of them runs faster,
    so only a measurement ranks them. Choices within RESOLUTION are already one; this is the wider, honest tie."""
    if not top:
        return []
    best = top[0].plan
    return [rank for rank, choice in enumerate(top[1:], 2)
            if overlaps(best.tokens_per_s, best.prediction_band, choice.plan.tokens_per_s, choice.plan.prediction_band)]


def _axes(layout: Any) -> Tuple[int, int]:
    """The simpler layout: fewer parallel axes in use, then smaller model-parallel degrees."""
    degrees = (layout.tp, layout.cp, layout.pp, layout.dp_replicate, layout.pp_virtual_stages)
    return sum(d > 1 for d in degrees), layout.tp * layout.cp * layout.pp


def step_parts(plan: Plan) -> Dict[str, float]:
    """The predicted step in seconds by part: compute per operation class, exposed communication per axis,
    pipeline bubble, optimizer, the optimizer offload's traffic (harness.plan.time_model.StepTime)."""
    t = plan.time
    parts = {f"compute {k}": v for k, v in t.compute_s.items()}
    parts.update({f"exposed {k} communication": v["exposed"] for k, v in t.comm_s.items()})
    parts.update({"pipeline bubble": t.bubble_s, "optimizer": t.optimizer_s, "optimizer offload": t.offload_s})
    return parts


def compare(best: Plan, other: Plan, shown: int = 4) -> List[str]:
    """`other` against `best` part by part, the largest differences first ("exposed dp communication 0.42 s ->
    0.05 s"). When their tokens per step differ, `other`'s parts are scaled to `best`'s tokens, so the two read
    as the time for the same tokens."""
    a, b = step_parts(best), step_parts(other)
    scale = best.tokens_per_step / other.tokens_per_step
    keys = sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0.0) * scale - a.get(k, 0.0)))
    lines = [f"{k} {b.get(k, 0.0) * scale:.3g} s -> {a.get(k, 0.0):.3g} s" for k in keys
             if abs(b.get(k, 0.0) * scale - a.get(k, 0.0)) >= 0.0005 * best.step_time_s][:shown]
    ratio = best.tokens_per_s / other.tokens_per_s
    head = f"{ratio:.2f}x the tokens/s ({other.tokens_per_s:,.0f} -> {best.tokens_per_s:,.0f})"
    return [head, *(lines or ["no part differs by more than 0.05% of the step"])]
