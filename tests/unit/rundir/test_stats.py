"""Statistics with known answers: step times drawn from known distributions, intervals checked against them."""

from __future__ import annotations

import math
import random

import pytest

from harness.rundir.stats import (
    median_interval,
    outliers,
    pooled_stats,
    repeats_to_separate,
    steady,
    step_stats,
    throughput_difference,
)

DRAWS = 2000


def lognormal_steps(rng: random.Random, median_s: float, sigma: float, n: int):
    """Step times whose true median is `median_s` (a lognormal's median is exp(mu))."""
    return [median_s * math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]


def skewed_steps(rng: random.Random, n: int):
    """A floor plus an exponential tail (a busy host's occasional stalls): median = 0.1 + 0.02 ln 2."""
    return [0.1 + rng.expovariate(1 / 0.02) for _ in range(n)]


@pytest.mark.parametrize("n", [8, 15, 40])
@pytest.mark.parametrize("draw,true_median", [(lambda rng, n: lognormal_steps(rng, 0.05, 0.1, n), 0.05),
                                              (skewed_steps, 0.1 + 0.02 * math.log(2))])
def test_the_median_interval_covers_the_true_median_at_its_stated_rate(n, draw, true_median):
    rng = random.Random(n)
    level = median_interval(draw(rng, n))[2]
    hits = 0
    for _ in range(DRAWS):
        low, high, _ = median_interval(draw(rng, n))
        hits += low <= true_median <= high
    coverage = hits / DRAWS
    assert level >= 0.95
    # within three standard errors of the stated (exact, distribution-free) coverage
    assert abs(coverage - level) < 3 * math.sqrt(level * (1 - level) / DRAWS), (coverage, level)


def test_below_six_steps_the_interval_is_min_to_max_at_its_real_lower_coverage():
    low, high, level = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (low, high) == (1.0, 5.0) and level == pytest.approx(1 - 2 ** -4)


def test_outlying_steps_are_named_by_their_step_number():
    times = [0.100, 0.101, 0.099, 0.102, 0.100, 0.098, 0.101, 0.300, 0.100, 0.104]
    found = outliers(times, first_step=3)
    assert [(o.step, o.severity) for o in found] == [(10, "severe")]
    stats = step_stats(times, first_step=3)
    assert stats.outliers == [{"step": 10, "time_s": 0.3, "severity": "severe"}]
    assert stats.median_s == pytest.approx(0.1005) and stats.iqr_s < 0.003 and stats.cv > 0.3


def test_warm_up_is_steady_once_the_last_three_steps_agree_within_ten_percent():
    assert not steady([2.0, 1.0])
    assert not steady([2.0, 1.0, 1.3, 1.0])
    assert steady([2.0, 1.3, 1.0, 1.05, 0.98])


def test_repeats_that_differ_widen_the_pooled_interval():
    rng = random.Random(7)
    offsets = (0.9, 1.0, 1.1)  # each repeat a different host condition
    repeats = [lognormal_steps(rng, 0.05 * o, 0.02, 10) for o in offsets]
    pooled = pooled_stats(repeats)
    naive_low, naive_high, _ = median_interval([t for r in repeats for t in r])
    assert pooled.n == 30 and pooled.method == "t over 3 repeats"
    assert (pooled.ci_high_s - pooled.ci_low_s) > 1.1 * (naive_high - naive_low)


def test_layouts_ten_percent_apart_with_two_percent_noise_are_separated():
    rng = random.Random(1)
    covered = 0
    for _ in range(200):
        fast = [lognormal_steps(rng, 0.100, 0.02, 10)]
        slow = [lognormal_steps(rng, 0.110, 0.02, 10)]
        diff = throughput_difference(fast, 1000, slow, 1000)
        assert diff.significant and diff.low > 0
        covered += diff.low <= 0.10 <= diff.high
    assert covered >= 0.90 * 200, covered  # the interval holds the true 10% at about its 95%


def test_identical_layouts_are_not_called_different():
    rng = random.Random(2)
    called = 0
    for _ in range(100):
        a = [lognormal_steps(rng, 0.1, 0.02, 10)]
        b = [lognormal_steps(rng, 0.1, 0.02, 10)]
        called += throughput_difference(a, 1000, b, 1000).significant
    assert called <= 10  # a 95% interval: about 5 in 100 by chance


def test_the_repeats_needed_grow_as_the_difference_shrinks():
    rng = random.Random(3)
    a = [lognormal_steps(rng, 0.100, 0.05, 10)]
    b = [lognormal_steps(rng, 0.103, 0.05, 10)]
    diff = throughput_difference(a, 1000, b, 1000)
    needed = repeats_to_separate(diff, 1)
    assert not diff.significant
    assert needed is None or needed >= 2


def drifting_runs(rng: random.Random, median_s: float, repeats: int, run_sd: float = 0.10, steps: int = 10):
    """Repeats whose whole runs differ (a shared host's load), each with 2% step-to-step noise."""
    return [lognormal_steps(rng, median_s * math.exp(rng.gauss(0.0, run_sd)), 0.02, steps) for _ in range(repeats)]


def test_with_repeats_run_to_run_variation_is_in_the_interval():
    rng = random.Random(4)
    covered, called, draws = 0, 0, 400
    for _ in range(draws):
        fast, slow = drifting_runs(rng, 0.100, 3), drifting_runs(rng, 0.110, 3)
        diff = throughput_difference(fast, 1000, slow, 1000)
        covered += diff.low <= 0.10 <= diff.high
        same = throughput_difference(drifting_runs(rng, 0.1, 3), 1000, drifting_runs(rng, 0.1, 3), 1000)
        called += same.significant
    assert covered >= 0.90 * draws, covered  # about its 95%
    assert called <= 0.10 * draws, called  # identical layouts: about 5% by chance
    # one run each cannot see that variation: its interval misses the truth far more often
    singles = [throughput_difference(drifting_runs(rng, 0.1, 1), 1000, drifting_runs(rng, 0.11, 1), 1000)
               for _ in range(100)]
    assert sum(d.low <= 0.10 <= d.high for d in singles) < 0.8 * 100


def test_the_median_interval_holds_for_a_long_run():
    """A run cut after thousands of steps (a time limit's warning on a long job): 2.0**n overflows a float past
    n = 1023, so the binomial tail comes from log-gamma there, agreeing with the exact one at the seam."""
    from harness.rundir.stats import EXACT_BINOMIAL_N, _half_binomial_pmf, median_interval

    for n in (1100, 20_000):
        low, high, coverage = median_interval(list(range(n)))
        assert 0.95 <= coverage < 0.96 and low < n / 2 < high
        assert (high - low) / n < 4 / n ** 0.5  # about 1.96 sqrt(n) order statistics wide
    n, i = EXACT_BINOMIAL_N + 1, EXACT_BINOMIAL_N // 2 - 20
    assert _half_binomial_pmf(n, i) == pytest.approx(math.comb(n, i) / 2**n, rel=1e-9)
