"""Statistics of measured step times: a median with its confidence interval, spread, outliers, steady warm-up,
and the interval of the ratio of two runs' throughputs. Pure (standard library and numpy), no normality assumed.

Anchors: hyperfine and Criterion.rs (warm up until steady, many samples, Tukey outlier classes, an interval per
figure); Conover, *Practical Nonparametric Statistics* §3.2 (the distribution-free interval of a median from
order statistics); Davison & Hinkley, *Bootstrap Methods* §3.8 (resampling hierarchical data: clusters first,
then the units inside them).
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
    cdf, best_j = 0.0, 1
    for j in range(1, n // 2 + 1):
        cdf += math.comb(n, j - 1) / 2.0**n  # P(B <= j - 1)
        if 1.0 - 2.0 * cdf < confidence:
            break
        best_j = j
    coverage = 1.0 - 2.0 * sum(math.comb(n, i) for i in range(best_j)) / 2.0**n
    return xs[best_j - 1], xs[n - best_j], coverage


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
    from a two-level bootstrap (repeats, then steps within each), so that run-to-run differences widen it as
    they should. One repeat: the order-statistic interval of `step_stats`."""
    groups = [[float(t) for t in group] for group in repeats if len(group)]
    if len(groups) == 1:
        return step_stats(groups[0], confidence=confidence)
    pooled = [t for group in groups for t in group]
    base = step_stats(pooled, confidence=confidence)
    medians = _bootstrap_medians(groups, _rng(0))
    low, high = _percentiles(medians, confidence)
    return StepStats(base.n, base.median_s, low, high, confidence, base.q1_s, base.q3_s, base.iqr_s, base.cv,
                     [], "bootstrap over repeats and steps")


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
    times) and tokens per step. The interval is a percentile bootstrap of the ratio of medians, resampled
    independently per run, repeats first and steps within them (Davison & Hinkley §3.8); seeded, so
    deterministic."""
    groups_a = [[float(t) for t in g] for g in a if len(g)]
    groups_b = [[float(t) for t in g] for g in b if len(g)]
    median_a = statistics.median([t for g in groups_a for t in g])
    median_b = statistics.median([t for g in groups_b for t in g])
    estimate = (tokens_a / median_a) / (tokens_b / median_b) - 1
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
    """Medians of `resamples` two-level resamples: repeats drawn with replacement, then steps within each."""
    import numpy as np

    arrays = [np.asarray(g, dtype=float) for g in groups]
    k = len(arrays)
    if len({len(a) for a in arrays}) == 1:  # repeats of equal length: all resamples at once
        table = np.stack(arrays)
        m = table.shape[1]
        chosen = rng.integers(0, k, (resamples, k)) if k > 1 else np.zeros((resamples, 1), dtype=int)
        steps = rng.integers(0, m, (resamples, k, m))
        return np.median(table[chosen[..., None], steps].reshape(resamples, k * m), axis=1).tolist()
    out = np.empty(resamples)
    for r in range(resamples):
        chosen = rng.integers(0, k, k)
        drawn = [arrays[i][rng.integers(0, len(arrays[i]), len(arrays[i]))] for i in chosen]
        out[r] = np.median(np.concatenate(drawn))
    return out.tolist()


def _percentiles(values: Sequence[float], confidence: float) -> Tuple[float, float]:
    import numpy as np

    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(np.asarray(values), [tail, 100 - tail])
    return float(low), float(high)
