"""reduce_ranks on fake ranks whose step times come from a known distribution: the run's figures carry intervals
that cover the true values at the stated rate."""

from __future__ import annotations

import math
import random

from harness.config.schema import RunConfig
from harness.runtime.bench import interval_summary, reduce_ranks

PLAN = {"tokens_per_step": 1024, "flops_per_token": 6e6, "recompute_flops_per_token": 0.0}
TRUE_MEDIAN_S = 0.05


def fake_rank(rank: int, rng: random.Random, steps: int = 12, warmup: int = 4):
    """A rank's record: lognormal step times around TRUE_MEDIAN_S (the slower rank sets each step)."""
    return {"rank": rank, "step_times_s": [TRUE_MEDIAN_S * math.exp(rng.gauss(0, 0.05)) for _ in range(steps)],
            "losses": [5.0] * (warmup + steps), "activation_bytes": 10, "peak_allocated_bytes": None,
            "peak_flops": 1e11, "param_bytes": 1, "grad_bytes": 1, "optimizer_bytes": 2}


def test_every_rate_figure_carries_the_step_time_interval():
    measured = reduce_ranks([fake_rank(r, random.Random(r)) for r in (0, 1)], RunConfig(), PLAN)
    low, high = measured.intervals["step_time_s"]
    assert low <= measured.step_time_s <= high and measured.warmup_steps == 4
    for name in ("tokens_per_s", "tokens_per_s_per_device", "tflop_per_s_per_device", "mfu", "hfu"):
        lo, hi = measured.intervals[name]
        value = getattr(measured, name)
        assert lo < value < hi and math.isclose(lo / value, measured.step_time_s / high)
    assert measured.step_stats["n"] == 12 and measured.step_stats["ci_level"] >= 0.95
    summary = interval_summary(measured.to_dict())
    assert summary["tokens_per_s_ci_low"] == measured.intervals["tokens_per_s"][0] and "step_time_cv" in summary


def test_the_interval_covers_the_slowest_ranks_true_median_at_its_rate():
    # the step time of a 2-rank run is the max of two draws: its true median is the sqrt(1/2) quantile of one
    # rank's lognormal, exp(sigma * z) with Phi(z) = sqrt(1/2)
    z = 0.5448  # Phi^-1(0.7071)
    true_step = TRUE_MEDIAN_S * math.exp(0.05 * z)
    rng, hits, draws = random.Random(11), 0, 600
    for _ in range(draws):
        measured = reduce_ranks([fake_rank(r, rng) for r in (0, 1)], RunConfig(), PLAN)
        low, high = measured.intervals["step_time_s"]
        hits += low <= true_step <= high
        tokens_low, tokens_high = measured.intervals["tokens_per_s"]
        assert tokens_low <= PLAN["tokens_per_step"] / measured.step_time_s <= tokens_high
    level = measured.step_stats["ci_level"]
    assert abs(hits / draws - level) < 3 * math.sqrt(level * (1 - level) / draws), (hits / draws, level)
