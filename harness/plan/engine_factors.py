"""Per-engine efficiency factors of a hardware profile: how much slower (or faster) an engine's measured steps ran
than the time model predicts, fitted from measured runs by `harness tune` and applied to every prediction.

The model (one pair of numbers per engine, never one per layout):

    measured step time  =  f_engine x (predicted step time - predicted exposed communication)
                         + g_engine x  predicted exposed communication

f scales everything the model counts as compute-side (compute, recompute, framework work, bubble, optimizer,
offload), g the communication left on the critical path. Both are 1.0 for an engine the profile has no factors for.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

# A factor outside this range says the model misses something structural, not an efficiency: the fit is clamped
# to it (a tenth to ten times the predicted time).
FACTOR_RANGE = (0.1, 10.0)
UNIT = {"compute": 1.0, "comm": 1.0}


def parts(step: Any) -> tuple:
    """(compute-side seconds, exposed communication seconds) of a predicted step; they sum to its step time."""
    comm = sum(c["exposed"] for c in step.comm_s.values())
    return step.step_time_s - comm, comm


def scaled(step: Any, factors: Optional[Mapping[str, float]]) -> Any:
    """A predicted StepTime with its compute-side parts times f and its communication times g (see the module
    docstring); unchanged without factors."""
    if not factors:
        return step
    f, g = factors.get("compute", 1.0), factors.get("comm", 1.0)
    compute, comm = parts(step)
    return replace(step, step_time_s=f * compute + g * comm, compute_s={k: f * v for k, v in step.compute_s.items()},
                   comm_s={axis: {k: g * v for k, v in c.items()} for axis, c in step.comm_s.items()},
                   bubble_s=f * step.bubble_s, optimizer_s=f * step.optimizer_s, offload_s=f * step.offload_s)


class Sample(NamedTuple):
    """One measured run: its engine, the predicted (compute-side, exposed communication) seconds of its step under
    the profile's current factors, and the measured step time (seconds)."""

    engine: str
    compute_s: float
    comm_s: float
    measured_s: float


def _clamp(x: float) -> float:
    return min(FACTOR_RANGE[1], max(FACTOR_RANGE[0], x))


def fit(samples: Sequence[Sample]) -> Dict[str, float]:
    """Least squares of measured = a x compute + b x comm over one engine's samples (the 2x2 normal equations).
    Where the runs cannot separate a from b (one run, no communication, or compute and communication in the same
    proportion in every run) or the two-factor solution leaves FACTOR_RANGE, one factor for both:
    s = sum(y t) / sum(t^2) with t the predicted step time. Clamped to FACTOR_RANGE."""
    scc = sum(s.compute_s ** 2 for s in samples)
    sxx = sum(s.comm_s ** 2 for s in samples)
    scx = sum(s.compute_s * s.comm_s for s in samples)
    syc = sum(s.measured_s * s.compute_s for s in samples)
    syx = sum(s.measured_s * s.comm_s for s in samples)
    det = scc * sxx - scx ** 2
    if det > 1e-9 * max(scc * sxx, 1e-300):
        a, b = (syc * sxx - syx * scx) / det, (syx * scc - syc * scx) / det
        if all(FACTOR_RANGE[0] <= x <= FACTOR_RANGE[1] for x in (a, b)):
            return {"compute": a, "comm": b}
    tt = sum((s.compute_s + s.comm_s) ** 2 for s in samples)
    one = _clamp(sum(s.measured_s * (s.compute_s + s.comm_s) for s in samples) / tt) if tt > 0 else 1.0
    return {"compute": one, "comm": one}


def refit(samples: Sequence[Sample], current: Mapping[str, Mapping[str, float]]) -> Dict[str, Dict[str, float]]:
    """The profile's engine factors refitted: per engine with samples, its current factors times the fit of the
    samples (which were predicted under the current factors), clamped to FACTOR_RANGE; other engines keep theirs."""
    out = {engine: dict(f) for engine, f in current.items()}
    for engine in sorted({s.engine for s in samples}):
        rel = fit([s for s in samples if s.engine == engine])
        old = {**UNIT, **current.get(engine, {})}
        out[engine] = {k: _clamp(old[k] * rel[k]) for k in UNIT}
    return out


def relative(new: Mapping[str, float], old: Optional[Mapping[str, float]]) -> Dict[str, float]:
    """New factors over the current ones: what multiplies a prediction made under the current factors."""
    old = {**UNIT, **(old or {})}
    return {k: new.get(k, 1.0) / old[k] for k in UNIT}


def median_error(samples: Sequence[Sample], rel: Optional[Mapping[str, float]] = None) -> float:
    """Median of |predicted - measured| / measured over the samples, the predictions times `rel` (relative factors,
    see `relative`; none: as predicted)."""
    rel = {**UNIT, **(rel or {})}
    errors: List[float] = [abs(rel["compute"] * s.compute_s + rel["comm"] * s.comm_s - s.measured_s) / s.measured_s
                           for s in samples if s.measured_s > 0 and math.isfinite(s.measured_s)]
    return statistics.median(errors) if errors else math.nan
