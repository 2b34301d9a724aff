"""Statistics of measured step times: a median with its confidence interval, spread, outliers, steady warm-up,
and the interval of the ratio of two runs' throughputs. Pure (standard library and numpy), no normality assumed.

Anchors: hyperfine and Criterion.rs (warm up until steady, many samples, Tukey outlier classes, an interval per
figure); Conover, *Practical Nonparametric Statistics* §3.2 (the distribution-free interval of a median from
order statistics); Davison & Hinkley, *Bootstrap Methods* (the percentile interval of a statistic of two
samples); Student's t over repeated runs where runs differ by more than their steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

CONFIDENCE = 0.95
# Tukey's fences as Criterion.rs classifies outliers: beyond 1.5 IQR of the quartiles mild, beyond 3 severe.
MILD_FENCE, SEVERE_FENCE = 1.5, 3.0
# Warm-up is steady when the last STEADY_WINDOW step times lie within STEADY_TOLERANCE of their median.
STEADY_WINDOW, STEADY_TOLERANCE = 3, 0.10
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20240601  # fixed: the same measurements always give the same interval and verdict


def median_interval(times: Sequence[float], confidence: float = CONFIDENCE) -> Tuple[float, float, float]:
    """(low, high, achieved coverage) of the median from order statistics, distribution-free.

    Each sample falls below the true median with probability 1/2, so the count below it is Binomial(n, 1/2)
    and [x_(j), x_(n+1-j)] (1-based, sorted) covers the median with probability 1 - 2 P(B <= j - 1). The
    narrowest such interval with coverage >= `confidence` is taken; below n = 6 even [min, max] covers less
    than 95% (1 - 2^(1-n)), and that lower coverage is returned with it rather than hidden.
    """
    xs = sorted(float(t) for t in times)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one time")
    cdf, best_j, best_cdf = 0.0, 1, _half_binomial_pmf(n, 0)
    for j in range(1, n // 2 + 1):
        cdf += _half_binomial_pmf(n, j - 1)  # P(B <= j - 1)
        if 1.0 - 2.0 * cdf < confidence:
            break
        best_j, best_cdf = j, cdf
    return xs[best_j - 1], xs[n - best_j], 1.0 - 2.0 * best_cdf


# Up to this many steps the binomial probabilities are exact (integer C(n, i) over the integer 2^n); beyond it
# they come from log-gamma (a float 2.0**n overflows past n = 1023: a run cut after ~1,000 steps).
EXACT_BINOMIAL_N = 1000


def _half_binomial_pmf(n: int, i: int) -> float:
    """P(B = i) for B ~ Binomial(n, 1/2)."""
    if n <= EXACT_BINOMIAL_N:
        return math.comb(n, i) / 2**n
    return math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2.0))


def quartiles(times: Sequence[float]) -> Tuple[float, float]:
    """First and third quartile (linear interpolation between order statistics: numpy's default, R type 7)."""
    xs = [float(t) for t in times]
    if len(xs) == 1:
        return xs[0], xs[0]
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q3


@dataclass(frozen=True)
class Outlier:
    step: int  # the step's number in the run (warm-up steps count)
    time_s: float
    severity: str  # "mild" (beyond 1.5 IQR) or "severe" (beyond 3 IQR)


def outliers(times: Sequence[float], first_step: int = 0) -> List[Outlier]:
    """Steps outside Tukey's fences, named by their step number (`first_step`: the number of the first time)."""
    q1, q3 = quartiles(times)
    iqr = q3 - q1
    found = []
    for offset, t in enumerate(times):
        distance = max(q1 - t, t - q3)
        if iqr > 0 and distance > MILD_FENCE * iqr:
            found.append(Outlier(first_step + offset, float(t), "severe" if distance > SEVERE_FENCE * iqr else "mild"))
    return found


@dataclass(frozen=True)
class StepStats:
    """The summary of one run's timed steps (seconds); `ci_level` is the interval's real coverage."""

    n: int
    median_s: float
    ci_low_s: float
    ci_high_s: float
    ci_level: float
    q1_s: float
    q3_s: float
    iqr_s: float
    cv: float  # sample standard deviation / mean
    outliers: List[Dict[str, Any]] = field(default_factory=list)
    method: str = "order statistics"

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> Optional["StepStats"]:
        if not data:
            return None
        names = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in names})


def step_stats(times: Sequence[float], first_step: int = 0, confidence: float = CONFIDENCE) -> StepStats:
    """Median, its interval, quartiles, coefficient of variation and the outlying steps of one run."""
    xs = [float(t) for t in times]
    low, high, level = median_interval(xs, confidence)
    q1, q3 = quartiles(xs)
    mean = statistics.fmean(xs)
    cv = statistics.stdev(xs) / mean if len(xs) > 1 and mean > 0 else 0.0
    return StepStats(len(xs), statistics.median(xs), low, high, level, q1, q3, q3 - q1, cv,
                     [asdict(o) for o in outliers(xs, first_step)])


def pooled_stats(repeats: Sequence[Sequence[float]], confidence: float = CONFIDENCE) -> StepStats:
    """The statistics of several repeats of one point: every step pooled for the median and spread; the interval
    from the spread between the repeats (between_runs), since on a shared host the runs differ by more than
    their steps do. One repeat: the order-statistic interval of `step_stats`."""
    groups = [[float(t) for t in group] for group in repeats if len(group)]
    if len(groups) == 1:
        return step_stats(groups[0], confidence=confidence)
    base = step_stats([t for group in groups for t in group], confidence=confidence)
    spread, df = between_runs([groups])
    half = t_quantile(df, confidence) * spread / math.sqrt(len(groups))
    return StepStats(base.n, base.median_s, base.median_s * math.exp(-half), base.median_s * math.exp(half),
                     confidence, base.q1_s, base.q3_s, base.iqr_s, base.cv, [], f"t over {len(groups)} repeats")


# Student's t 97.5% quantiles, df 1-30 (any statistics table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student t quantile for 95% intervals: the table to df 30, then the first Cornish-Fisher term
    z + (z^3 + z) / (4 df), within 0.1% there (Abramowitz & Stegun 26.7.5)."""
    if abs(confidence - 0.95) > 1e-9:
        raise ValueError(f"confidence={confidence}: between-run intervals are tabulated for 0.95 only")
    if df <= len(T_975):
        return T_975[max(df, 1) - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


def between_runs(sides: Sequence[Sequence[Sequence[float]]]) -> Tuple[float, int]:
    """(standard deviation, degrees of freedom) of the log of each repeat's median step time, pooled over the
    sides that have two or more repeats: how much whole runs differ. Logs, because a loaded host scales a run's
    steps; a run's median of many steps is close to normal (the t interval's one assumption, at run level)."""
    squares, df = 0.0, 0
    for groups in sides:
        logs = [math.log(statistics.median(g)) for g in groups if len(g)]
        if len(logs) > 1:
            mean = statistics.fmean(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
    if df == 0:
        raise ValueError("between_runs needs a side with two or more repeats")
    return math.sqrt(squares / df), df


def inverse_interval(value: float, median_s: float, low_s: float, high_s: float) -> Tuple[float, float]:
    """The interval of a figure proportional to 1 / step time (tokens/s, TFLOP/s, MFU), from the step time's:
    a monotone map carries an interval's end points over (the slowest step bound gives the lowest rate)."""
    if median_s <= 0 or low_s <= 0:
        return value, value
    return value * median_s / high_s, value * median_s / low_s


# Figures proportional to 1 / step time (tokens per step and FLOPs per token are fixed for a run).
RATE_FIGURES = ("tokens_per_s", "tokens_per_s_per_device", "tflop_per_s_per_device", "mfu", "hfu")


def figure_intervals(stats: StepStats, figures: Mapping[str, Optional[float]]) -> Dict[str, List[float]]:
    """[low, high] of the step time and of every rate figure given (name -> value at the median step time)."""
    out = {"step_time_s": [stats.ci_low_s, stats.ci_high_s]}
    for name, value in figures.items():
        if value is not None:
            out[name] = list(inverse_interval(float(value), stats.median_s, stats.ci_low_s, stats.ci_high_s))
    return out


def steady(times: Sequence[float], window: int = STEADY_WINDOW, tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether warm-up has reached steady state: the last `window` step times lie within `tolerance` of their
    median (hyperfine and Criterion warm up for a time; a training step's first ones allocate, build caches and
    optimizer state, so the rule watches for those times to settle)."""
    if len(times) < window:
        return False
    last = [float(t) for t in times[-window:]]
    centre = statistics.median(last)
    return centre > 0 and (max(last) - min(last)) <= tolerance * centre


@dataclass(frozen=True)
class Difference:
    """How much faster A is than B in tokens/s: ratio - 1, with its interval (e.g. 0.10 = A 10% faster)."""

    estimate: float
    low: float
    high: float
    confidence: float

    @property
    def significant(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def throughput_difference(a: Sequence[Sequence[float]], tokens_a: float, b: Sequence[Sequence[float]],
                          tokens_b: float, confidence: float = CONFIDENCE) -> Difference:
    """A's tokens/s over B's, minus one, from their step times (each: a list of repeats, each a list of step
    times) and tokens per step; the estimate from the medians of all their steps.

    With two or more repeats on either side, the interval is Student's t on the log ratio with the spread
    between repeats (between_runs, pooled over both sides: the host drifts under both), so that run-to-run
    variation is in it. With one run each, a seeded percentile bootstrap of the ratio of medians over the
    steps (Davison & Hinkley §5.2): it holds step-to-step noise only.
    """
    groups_a = [[float(t) for t in g] for g in a if len(g)]
    groups_b = [[float(t) for t in g] for g in b if len(g)]
    median_a = statistics.median([t for g in groups_a for t in g])
    median_b = statistics.median([t for g in groups_b for t in g])
    estimate = (tokens_a / median_a) / (tokens_b / median_b) - 1
    if len(groups_a) > 1 or len(groups_b) > 1:
        spread, df = between_runs([groups_a, groups_b])
        half = t_quantile(df, confidence) * spread * math.sqrt(1 / len(groups_a) + 1 / len(groups_b))
        log_ratio = math.log1p(estimate)
        return Difference(estimate, math.expm1(log_ratio - half), math.expm1(log_ratio + half), confidence)
    rng = _rng(1)
    ratios = [(tokens_a / ma) / (tokens_b / mb) - 1
              for ma, mb in zip(_bootstrap_medians(groups_a, rng), _bootstrap_medians(groups_b, rng))]
    low, high = _percentiles(ratios, confidence)
    return Difference(estimate, low, high, confidence)


def repeats_to_separate(difference: Difference, repeats: int, most: int = 50) -> Optional[int]:
    """Repeats that would shrink the interval below the observed difference, or None when more than `most`.

    An interval's half-width falls as 1 / sqrt(samples) (central limit), so k times the samples shrinks it by
    sqrt(k): N = repeats * (half-width / |difference|)^2, one more for margin, at least repeats + 1.
    """
    gap = abs(difference.estimate)
    if gap <= 0:
        return None
    needed = math.ceil(max(repeats, 1) * (difference.half_width / gap) ** 2) + 1
    needed = max(needed, repeats + 1)
    return needed if needed <= most else None


def _rng(stream: int):
    import numpy as np

    return np.random.default_rng([BOOTSTRAP_SEED, stream])


def _bootstrap_medians(groups: Sequence[Sequence[float]], rng, resamples: int = BOOTSTRAP_RESAMPLES) -> List[float]:
    """Medians of `resamples` resamples, with replacement, of one run's steps (`groups`: that one run)."""
    import numpy as np

    (steps,) = groups
    values = np.asarray(steps, dtype=float)
    return np.median(values[rng.integers(0, len(values), (resamples, len(values)))], axis=1).tolist()


def _percentiles(values: Sequence[float], confidence: float) -> Tuple[float, float]:
    import numpy as np

    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(np.asarray(values), [tail, 100 - tail])
    return float(low), float(high)
