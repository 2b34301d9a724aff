"""Repeats of one sweep point pooled into one row: every step of every repeat for the median, and an interval
that the spread between repeats widens (rundir.stats.pooled_stats). Each repeat keeps its own row elsewhere."""

from __future__ import annotations

from typing import Any, Dict, List

import pandas as pd

from harness.plan.uncertainty import versus_band
from harness.rundir import COMPLETED
from harness.rundir.stats import RATE_FIGURES, figure_intervals, pooled_stats
from harness.rundir.vocabulary import format_seconds

INTERVAL_FIGURES = ("step_time_s", *RATE_FIGURES)


def interval_columns(stats, figures: Dict[str, Any], intervals: Dict[str, List[float]]) -> Dict[str, Any]:
    """`<figure>_ci_low` / `_ci_high` of every figure with an interval, and the step time's spread."""
    out: Dict[str, Any] = {}
    for name in INTERVAL_FIGURES:
        low, high = intervals.get(name, (None, None)) if figures.get(name) is not None or name == "step_time_s" \
            else (None, None)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = low, high
    out.update(step_time_ci_level=stats.ci_level if stats else None, step_time_iqr_s=stats.iqr_s if stats else None,
               step_time_cv=stats.cv if stats else None,
               step_outliers=", ".join(f"step {o['step']} ({o['severity']}, {format_seconds(o['time_s'])})"
                                       for o in stats.outliers) if stats else None)
    return out


def pool_repeats(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per point: the completed repeats of a point (same `series` and `point`, `repeats` > 1) become one
    row named after the point, with the repeats' step times pooled; every other row is kept as it is."""
    if frame.empty or "point" not in frame or "repeats" not in frame:
        return frame
    many = (frame["repeats"].fillna(1) > 1) & (frame["status"] == COMPLETED)
    if "step_times_by_repeat" in frame:  # already pooled
        many &= frame["step_times_by_repeat"].isna()
    rows = [row for _, row in frame[~many].iterrows()]
    for _, group in frame[many].groupby(["series", "point"], sort=False):
        rows.append(pooled_row(group))
    return pd.DataFrame(rows).reset_index(drop=True) if rows else frame.iloc[0:0]


def pooled_row(group: pd.DataFrame) -> pd.Series:
    """The first repeat's row with the pooled step statistics, the rate figures rescaled to the pooled median."""
    group = group.sort_values("repeat")
    row = group.iloc[0].copy()
    by_repeat = [[float(t) for t in times] for times in group["step_times_s"]]
    stats = pooled_stats(by_repeat)
    scale = float(row["step_time_s"]) / stats.median_s
    figures = {name: (None if pd.isna(row.get(name)) else float(row[name]) * scale)
               for name in RATE_FIGURES if name in row}
    for name, value in figures.items():
        row[name] = value
    row["step_time_s"] = stats.median_s
    row["step_times_s"] = [t for times in by_repeat for t in times]
    row["step_times_by_repeat"] = by_repeat
    row["step_time_min_s"], row["step_time_max_s"] = min(row["step_times_s"]), max(row["step_times_s"])
    for name, value in interval_columns(stats, {**figures, "step_time_s": stats.median_s},
                                        figure_intervals(stats, figures)).items():
        row[name] = value
    row["run"] = f"{row['run']} (+{len(group) - 1} repeats)"
    row["repeat_runs"] = ", ".join(group["run"].astype(str))
    row["repeats"] = len(group)
    if "host_disturbed" in group:
        row["host_disturbed"] = bool(group["host_disturbed"].fillna(False).any())
    if "step_time_predicted_s" in row and not pd.isna(row.get("step_time_predicted_s")):
        row["step_time_ratio"] = stats.median_s / float(row["step_time_predicted_s"])
    if figures.get("mfu") is not None and not pd.isna(row.get("mfu_predicted")) and row.get("mfu_predicted"):
        row["mfu_ratio"] = figures["mfu"] / float(row["mfu_predicted"])
    if "tokens_per_s_band" in row:
        row["tokens_per_s_in_band"] = versus_band(row.get("tokens_per_s_predicted"), figures.get("tokens_per_s"),
                                                  row.get("tokens_per_s_band"))
    return row
