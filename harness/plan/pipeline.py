"""Pipeline stages: layers per stage, which rank runs which stage under each schedule, and the schedule rules.

One split rule for every engine and for the planner: a stage list given in `layout.pp_stage_layers` is used as
is (uneven splits are always explicit); otherwise pp x pp_virtual_stages must divide the decoder layers and
every stage gets the same count. No engine spreads a remainder on its own, so the layers the planner counts
for a stage are the layers that stage builds.
"""

from __future__ import annotations

from functools import lru_cache
from typing import List, Sequence, Tuple

from harness.config.schema import PipelineSchedule, allowed

SCHEDULES = allowed(PipelineSchedule)
# Schedules that hold one stage per rank, and those that take a list of (virtual) stages per rank.
SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
MULTI_STAGE_SCHEDULES = tuple(s for s in SCHEDULES if s not in SINGLE_STAGE_SCHEDULES)
# ZBV and DualPipeV place exactly two stages per rank in a "V": rank r holds stages r and 2*pp-1-r.
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
# Interleaved schedules run their micro-batches in rounds of n // pp (torch.distributed.pipelining).
ROUND_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble")
# Schedules that split backward into an input pass and a deferred weight pass (torch's I / W actions).
SPLIT_BACKWARD = ("InterleavedZeroBubble", *V_SCHEDULES)

Found = Tuple[Tuple[str, ...], Tuple[str, ...]]


def num_stages(pp: int, virtual_stages: int) -> int:
    return pp * virtual_stages if pp > 1 else 1


def stage_layer_counts(num_layers: int, pp: int, virtual_stages: int, explicit: Sequence[int] = ()) -> Tuple[int, ...]:
    """Decoder layers of each stage (the module docstring's rule); raises on a split validation refuses."""
    stages = num_stages(pp, virtual_stages)
    if explicit:
        if len(explicit) != stages or sum(explicit) != num_layers:
            raise ValueError(f"pp_stage_layers={list(explicit)} does not split {num_layers} layers into {stages} stages")
        return tuple(explicit)
    if num_layers % stages:
        raise ValueError(f"{stages} stages do not divide num_hidden_layers={num_layers} (give pp_stage_layers)")
    return (num_layers // stages,) * stages


def stage_layer_indices(counts: Sequence[int]) -> List[List[int]]:
    """Decoder-layer indices of each stage, in order."""
    starts = [sum(counts[:stage]) for stage in range(len(counts))]
    return [list(range(start, start + count)) for start, count in zip(starts, counts)]


@lru_cache(maxsize=4096)
def rank_layers(counts: Tuple[int, ...], stages: Tuple[int, ...]) -> Tuple[int, ...]:
    """Decoder-layer indices of the stages one rank runs, in stage order (memoised: the planner asks for
    the same split under every batch shape)."""
    indices = stage_layer_indices(counts)
    return tuple(i for stage in stages for i in indices[stage])


def stage_to_rank(stage: int, pp: int, schedule: str) -> int:
    """Loop placement (stage s on rank s % pp) for every schedule but the V ones (rank s, then back)."""
    if schedule in V_SCHEDULES:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


@lru_cache(maxsize=65536)  # asked for every rank of every layout the recommender plans
def rank_stages(schedule: str, pp: int, virtual_stages: int, rank: int) -> Tuple[int, ...]:
    """Stage indices pipeline rank `rank` runs, in order: looped (r, r+p, ...) or V-shaped (r, 2p-1-r)."""
    if pp == 1:
        return (0,)
    stages = num_stages(pp, virtual_stages)
    return tuple(s for s in range(stages) if stage_to_rank(s, pp, schedule) == rank)


def pipeline_problems(pp: int, virtual: int, microbatches: int, schedule: str, explicit: Sequence[int],
                      num_layers: int) -> Found:
    """(errors, warnings): stages vs layers and schedule; micro-batch counts torch.distributed.pipelining accepts."""
    explicit = list(explicit)
    if pp == 1:
        errors = [f"pp_stage_layers={explicit} given with pp=1"] if explicit and explicit != [num_layers] else []
        errors += [f"pp_virtual_stages={virtual} needs pp > 1"] if virtual > 1 else []
        return tuple(errors), ()
    errors, warnings = _split_problems(pp, virtual, explicit, num_layers)
    errors += _schedule_problems(pp, virtual, microbatches, schedule)
    if microbatches < pp and schedule not in ("1F1B", "DualPipeV"):
        warnings.append(f"grad_accum={microbatches} < pp={pp}: the pipeline never fills (bubble > 50%)")
    return tuple(errors), tuple(warnings)


def _split_problems(pp: int, virtual: int, explicit: List[int], num_layers: int) -> Tuple[List[str], List[str]]:
    stages = pp * virtual
    if not explicit:
        if num_layers % stages:
            return [f"pp={pp} x pp_virtual_stages={virtual} = {stages} must divide num_hidden_layers={num_layers} "
                    "(or give pp_stage_layers)"], []
        return [], []
    if len(explicit) != stages:
        return [f"pp_stage_layers has {len(explicit)} entries; pp={pp} x pp_virtual_stages={virtual} = {stages} "
                "stages need one each"], []
    if sum(explicit) != num_layers or min(explicit) < 0:
        return [f"pp_stage_layers={explicit} must be >= 0 and sum to num_hidden_layers={num_layers} "
                f"(sum {sum(explicit)})"], []
    if min(explicit[1:-1], default=1) < 1:
        return [f"pp_stage_layers={explicit}: the middle stages need >= 1 layer (the first and last may hold 0: "
                "the embedding, or the norm and LM head, alone)"], []
    if len(set(explicit)) > 1:
        return [], [f"pp_stage_layers={explicit}: uneven split, the largest stage sets the pace"]
    return [], []


def _schedule_problems(pp: int, virtual: int, m: int, schedule: str) -> List[str]:
    errors, stages = [], pp * virtual
    if schedule in SINGLE_STAGE_SCHEDULES and virtual != 1:
        errors.append(f"pp_schedule={schedule} runs one stage per rank: pp_virtual_stages={virtual} must be 1")
    if schedule in V_SCHEDULES and virtual != 2:
        errors.append(f"pp_schedule={schedule} runs exactly two stages per rank: pp_virtual_stages={virtual} "
                      "must be 2")
    # torch.distributed.pipelining: 1F1B and DualPipeV refuse fewer micro-batches than stages; the
    # interleaved schedules need whole rounds (n_microbatches % max(1, n // pp) == 0).
    if schedule == "1F1B" and m < pp:
        errors.append(f"pp_schedule=1F1B needs grad_accum (micro-batches) >= pp={pp}, got grad_accum={m}")
    if schedule == "DualPipeV" and m < stages:
        errors.append(f"pp_schedule=DualPipeV needs grad_accum (micro-batches) >= pp x 2 = {stages}, got "
                      f"grad_accum={m}")
    if schedule in ROUND_SCHEDULES and m % max(1, m // pp):
        errors.append(f"pp_schedule={schedule} needs grad_accum={m} to be a multiple of its "
                      f"{max(1, m // pp)} rounds (grad_accum // pp)")
    return errors
