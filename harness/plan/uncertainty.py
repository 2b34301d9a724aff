"""The uncertainty band of a predicted throughput: the calibration residuals of its engine and regime, one rule each
for the regime, the residual, the band's half-width, the fallback where rows are missing, and a tie."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness.rundir.vocabulary import format_band

# The committed residual table (`python tools/prediction_band.py` regenerates it; a test fails when it is stale).
BAND_FILE = Path(__file__).resolve().parent / "data" / "prediction_band.json"
# The share of new layouts a band should hold (its coverage, when the new layout's error is like the rows').
COVERAGE = 0.90
# A group stands on its own rows from 4 up: the largest of n residuals holds a new one with probability n/(n+1)
# (half_width), 80% at n = 4; fewer rows than that say too little, and the group takes the pooled band widened.
MIN_ROWS = 4


@dataclass(frozen=True)
class Band:
    """Where the measured tokens/s of a prediction should lie: measured / predicted - 1 within ±half_width.
    `rows` residuals of this engine and regime stand behind it; `source` is "calibrated" (the group's own rows)
    or "uncalibrated" (too few: the pooled rows of its device class, widened); `coverage` is the share of new
    layouts like the rows it holds (harness.plan.uncertainty.half_width)."""

    half_width: float
    rows: int
    source: str
    regime: str
    coverage: float

    @property
    def calibrated(self) -> bool:
        return self.source == "calibrated"

    def interval(self, value: float) -> Tuple[float, float]:
        """The band around a predicted `value`."""
        return interval(value, self.half_width)

    def to_dict(self) -> Dict[str, Any]:
        return {"half_width": self.half_width, "rows": self.rows, "source": self.source, "regime": self.regime,
                "coverage": self.coverage}


def interval(value: float, width: float) -> Tuple[float, float]:
    """The band of half-width `width` around a predicted `value`: where measured / predicted - 1 lies within
    ±width, the measurement lies within value x (1 ± width)."""
    return value * (1 - width), value * (1 + width)


# Accelerators whose predictions share one population of errors: a GPU generation runs the same kernels,
# libraries and interconnect (the H200 computes as the H100: harness.plan.hardware); any other stands alone.
ACCELERATOR_FAMILIES = {"a100_sxm": "ampere", "a100_sxm_40gb": "ampere", "h100_sxm": "hopper", "h200": "hopper"}


def accelerator_family(accelerator: str) -> str:
    """The family a layout's accelerator is calibrated with (ACCELERATOR_FAMILIES; cpu for CPU ranks, else the
    accelerator itself)."""
    return "cpu" if accelerator == "cpu" else ACCELERATOR_FAMILIES.get(accelerator, accelerator)


def device_class(regime_name: str) -> str:
    """cpu or gpu: the class whose pooled rows stand in for a regime with too few of its own."""
    return "cpu" if regime_name.split("/")[0] == "cpu" else "gpu"


def regime(accelerator: str, layout: Any, compiled: bool = False, nodes: int = 1) -> str:
    """The regime a layout's prediction is calibrated in: accelerator family (cpu, ampere, hopper, ...) / how it
    splits the model, `+multi-node` where it spans nodes, `+compile` and `+fp8` where it runs them. A GPU
    generation's GEMM, attention and memory rates are its own, so rows of one say little of another's errors.
    Offload (optimizer or parameters to cpu / nvme) moves the step's bottleneck to the host link, model
    parallelism (tp, pp, cp or ep > 1) adds the collectives and bubbles the pure data-parallel rows never exercise,
    and a run over several nodes moves its collectives onto the network (NIC rates, per-hop latency, the fabric's
    congestion) that one node's runs never cross: each is its own population of errors."""
    if _value(layout.offload_optimizer) != "none" or _value(layout.offload_params) != "none":
        split = "offload"
    elif max(layout.tp, layout.pp, layout.cp, layout.ep) > 1:
        split = "model-parallel"
    else:
        split = "data-parallel"
    extras = "".join(("+multi-node" if nodes > 1 else "", "+compile" if compiled else "",
                      "+fp8" if _value(layout.precision) == "fp8" else ""))
    return f"{accelerator_family(accelerator)}/{split}{extras}"


def regime_of(cfg: Any) -> str:
    """The regime of a run config: its accelerator, layout, compile setting and node count (regime)."""
    return regime(cfg.cluster.accelerator, cfg.layout, cfg.engine.compile, cfg.cluster.nodes)


def _value(field: Any) -> Any:
    return getattr(field, "value", field)


def residual(predicted: float, measured: float) -> float:
    """measured / predicted - 1 of a throughput: the error seen from the prediction, so that the band reads as
    "the measurement lies within ±w of the number shown". The usual error predicted / measured - 1 = e is the
    same figure as 1 / (1 + e) - 1; a step-time error predicted_s / measured_s - 1 is this one already."""
    return measured / predicted - 1


def versus_band(predicted: Any, measured: Any, width: Any) -> Optional[str]:
    """Where a measured throughput fell against the band of its prediction: "inside", "above" or "below"; None
    where one of the three is missing (None or NaN) or nothing was predicted."""
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (predicted, measured, width)) \
            or not predicted:
        return None
    error = residual(float(predicted), float(measured))
    return "inside" if abs(error) <= float(width) else "above" if error > 0 else "below"


def half_width(residuals: Sequence[float], coverage: float = COVERAGE) -> Tuple[float, float]:
    """(half-width, coverage it holds) of the band from a group's residuals.

    Split conformal prediction (Vovk et al. 2005; Lei et al., "Distribution-free predictive inference for
    regression", JASA 2018): if a new layout's |residual| is exchangeable with the n rows', it is the k-th
    smallest of the n + 1 with probability at most 1/(n + 1) for each k, so it lies at or below the k-th smallest
    of the n rows with probability at least k / (n + 1). Take k = ceil(coverage * (n + 1)), the least that holds
    `coverage`; where that exceeds n (n < 9 at 90%), the largest row, which holds n / (n + 1). No normality
    is assumed, and a small sample says so in the coverage it reports instead of in a narrower band."""
    sizes = sorted(abs(r) for r in residuals)
    n = len(sizes)
    if not n:
        raise ValueError("half_width needs at least one residual")
    k = min(math.ceil(coverage * (n + 1) - 1e-9), n)
    return sizes[k - 1], k / (n + 1)


def uncalibrated_width(pooled: Sequence[float], group_medians: Sequence[float]) -> Tuple[float, float]:
    """(half-width, coverage) for an engine and regime with too few rows: the pooled band of every row of its
    device class (half_width), widened by the largest bias of any calibrated group (|median residual|): the
    pooled rows mix engines whose own biases differ, and a group never measured may carry one as large."""
    width, coverage = half_width(pooled)
    return width + max((abs(m) for m in group_medians), default=0.0), coverage


@lru_cache(maxsize=1)
def band_table() -> Dict[str, Any]:
    """The committed residual table (harness/plan/data/prediction_band.json)."""
    return json.loads(BAND_FILE.read_text())


@lru_cache(maxsize=None)
def band(engine: str, regime_name: str) -> Optional[Band]:
    """The band of a prediction by `engine` in `regime_name` (harness.plan.uncertainty.regime): its group's own
    rows where it has MIN_ROWS, else the pooled rows of its device class (cpu or gpu, every accelerator family)
    widened (uncalibrated_width), and never narrower than the band of the engine's own rows in the device class,
    any regime (engine_residuals): an engine whose few rows miss by more than the pooled band may miss so in its
    other regimes too. None where the device class has no rows at all."""
    groups = band_table()["groups"]
    own = ((groups.get(engine) or {}).get(regime_name) or {}).get("residuals") or []
    if len(own) >= MIN_ROWS:
        width, coverage = half_width(own)
        return Band(width, len(own), "calibrated", regime_name, coverage)
    device = device_class(regime_name)
    pooled = pooled_residuals(groups, device)
    if not pooled:
        return None
    width, coverage = uncalibrated_width(pooled, calibrated_medians(groups, device))
    engine_rows = engine_residuals(groups, engine, device)
    own_width = half_width(engine_rows) if engine_rows else (0.0, 0.0)
    if own_width[0] > width:  # the engine's own rows miss by more than the pooled band
        width, coverage = own_width
    return Band(width, len(own), "uncalibrated", regime_name, coverage)


def pooled_residuals(groups: Dict[str, Dict[str, Any]], device: str) -> List[float]:
    """Every residual of every engine's groups in the device class (cpu or gpu)."""
    return [r for regimes in groups.values() for name, group in regimes.items() if device_class(name) == device
            for r in group["residuals"]]


def engine_residuals(groups: Dict[str, Dict[str, Any]], engine: str, device: str) -> List[float]:
    """Every residual of one engine's groups in the device class (cpu or gpu)."""
    return [r for name, group in (groups.get(engine) or {}).items() if device_class(name) == device
            for r in group["residuals"]]


def calibrated_medians(groups: Dict[str, Dict[str, Any]], device: str) -> List[float]:
    """The median residual of each group of the device class that stands on its own rows."""
    return [statistics.median(group["residuals"]) for regimes in groups.values()
            for name, group in regimes.items()
            if device_class(name) == device and len(group["residuals"]) >= MIN_ROWS]


def describe(prediction_band: Band) -> str:
    """What a band means, in words: its source rows and coverage, or why it is uncalibrated."""
    width, name = format_band(prediction_band.half_width), prediction_band.regime
    if prediction_band.calibrated:
        return (f"band {width} ({name}): the measured tokens/s lies within it for {prediction_band.coverage:.0%} of "
                f"layouts like the {prediction_band.rows} calibration runs of this engine and regime")
    rows = (f"{prediction_band.rows} calibration run(s) of this engine and regime, fewer than {MIN_ROWS}"
            if prediction_band.rows else "no calibration run of this engine and regime")
    device = device_class(name)
    return (f"band {width} ({name}) is uncalibrated: {rows}; it is the pooled {device} band widened by the largest "
            f"engine bias, or this engine's own {device} band if wider (harness/plan/uncertainty.py)")


def overlaps(value: float, value_band: Optional[Band], other: float, other_band: Optional[Band]) -> bool:
    """Whether two predictions' bands overlap: the model cannot say which of them runs faster. A prediction
    without a band is its point."""
    low, high = value_band.interval(value) if value_band else (value, value)
    other_low, other_high = other_band.interval(other) if other_band else (other, other)
    return low <= other_high and other_low <= high


def clear() -> None:
    """Forget the loaded table and the bands (after regenerating the table at run time)."""
    band_table.cache_clear()
    band.cache_clear()
