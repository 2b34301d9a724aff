"""Which pipeline ranks the memory prediction sizes: under an explicit split every rank may be the largest, and a
later rank with the same layers as an earlier one is left out only where its schedule never has it hold more
(harness.plan.states.LATER_RANKS_HOLD_NO_MORE)."""

from __future__ import annotations

import pytest

from harness.plan import states
from harness.plan.activations import distinct_moments, inflight_microbatches
from harness.plan.memory import memory_per_rank
from harness.plan.pipeline import num_stages, rank_stages
from harness.plan.planner import spec_for
from plan_helpers import REAL_SHAPES, run_config

GRID = [(pp, v, m) for pp in (2, 3, 4, 6, 8, 12, 16) for v in (1, 2, 3, 4) for m in (pp, 2 * pp + 3, 8, 64)]


@pytest.mark.parametrize("schedule", [s for s in states.LATER_RANKS_HOLD_NO_MORE if s not in ("1F1B", "GPipe")])
def test_each_peak_moment_of_a_later_rank_is_held_by_an_earlier_rank(schedule):
    for pp, v, m in GRID:
        if schedule == "InterleavedZeroBubble" and v == 1:
            continue
        try:
            moments = [distinct_moments(schedule, pp, v, m, rank) for rank in range(pp)]
        except ValueError:  # a micro-batch count the schedule refuses
            continue
        last = num_stages(pp, v) - 1
        middle = [r for r in range(pp) if not {0, last} & set(rank_stages(schedule, pp, v, r))]
        for early in middle:
            for late in (r for r in middle if r > early):
                assert all(any(a[1] >= b[1] and all(x >= y for x, y in zip(a[0], b[0])) for a in moments[early])
                           for b in moments[late]), (schedule, pp, v, m, early, late)


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_a_later_rank_holds_no_more_micro_batches_in_flight(schedule):
    for pp, _, m in GRID:
        inflight = [inflight_microbatches(schedule, pp, 1, m, rank) for rank in range(pp)]
        assert inflight == sorted(inflight, reverse=True)


@pytest.mark.parametrize("schedule, pp, virtual, split, accum", [
    ("1F1B", 8, 1, [8, 10, 10, 10, 10, 10, 10, 12], 16),
    ("1F1B", 8, 1, [12, 10, 10, 10, 10, 10, 10, 8], 3),
    ("GPipe", 4, 1, [19, 21, 21, 19], 8),
    ("Interleaved1F1B", 4, 2, [9, 10, 10, 10, 10, 10, 10, 11], 8),
    ("Interleaved1F1B", 8, 2, [4] + [5] * 14 + [6], 24),
    ("InterleavedZeroBubble", 4, 2, [9, 10, 10, 10, 10, 10, 10, 11], 12),
    ("ZBVZeroBubble", 4, 2, [9, 10, 10, 10, 10, 10, 10, 11], 8),
])
def test_sizing_fewer_ranks_finds_the_largest_rank_every_rank_would(schedule, pp, virtual, split, accum, monkeypatch):
    cfg = run_config("llama3_1_70b", REAL_SHAPES["llama3_1_70b"], engine=dict(name="nd"),
                     cluster=dict(name="h100", accelerator="h100_sxm", accelerators_per_node=8),
                     dp_shard=1, pp=pp, pp_virtual_stages=virtual, pp_schedule=schedule, pp_stage_layers=split,
                     zero_stage=1, micro_batch=1, grad_accum=accum, seq_len=4096)
    spec = spec_for(cfg.model)
    states._RANK_STATES.clear()
    kept = memory_per_rank(spec, cfg.layout, cfg.engine, "h100_sxm")
    sized = len(states.rank_states(spec, cfg.layout, "nd"))
    monkeypatch.setattr(states, "LATER_RANKS_HOLD_NO_MORE", ())
    states._RANK_STATES.clear()
    every = memory_per_rank(spec, cfg.layout, cfg.engine, "h100_sxm")
    states._RANK_STATES.clear()
    assert kept == every
    assert sized < pp if schedule != "ZBVZeroBubble" else sized == pp
