"""`harness plan`: a grid of layouts judged before launch, as a table that fits the terminal, or JSON / CSV."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence

import pandas as pd

from harness.plan.units import memory_unit
from harness.plan.uncertainty import describe
from harness.rundir.vocabulary import format_with_band
from harness.terminal import print_fitted

FIT_ORDER = {"fits": 0, "fit?": 1, "OOM": 2, "invalid": 3}


@dataclass(frozen=True)
class PlannedPoint:
    """One grid point: its label, its plan (None when the config itself was refused) and every message."""

    label: str
    plan: Any
    errors: List[str]
    warnings: List[str]
    row: Dict[str, Any]

    @property
    def fit(self) -> str:
        from harness.engines.admission import memory_problems

        if self.errors:
            # refused only for memory (admission.memory_problems: device or host) is an OOM, not invalid
            oom_only = self.plan is not None and set(self.errors) <= set(memory_problems(self.plan))
            return "OOM" if oom_only else "invalid"
        return {True: "fits", False: "OOM"}.get(self.plan.fits, "fit?")

    @property
    def throughput(self) -> Optional[float]:
        return getattr(self.plan, "tokens_per_s", None) if self.plan is not None else None


def sort_points(points: Sequence[PlannedPoint]) -> List[PlannedPoint]:
    """Fitting layouts first, then by predicted tokens/s (where the plan has one), then by memory margin."""
    def key(point: PlannedPoint):
        margin = point.plan.margin_bytes if point.plan is not None else None
        speed = point.throughput
        return (FIT_ORDER[point.fit], -(speed or 0.0), -(margin if margin is not None else float("-inf")))

    return sorted(points, key=key)


def point_labels(runs: Sequence[Any]) -> List[str]:
    """Each layout named by the values that differ across the grid (one layout: all of its values)."""
    from harness.config.naming import run_label
    from harness.report.table import LABEL_AXES, engine_columns, layout_labels

    if len(runs) == 1:
        return [run_label(runs[0])]
    frame = pd.DataFrame([{
        "engine": run.engine.name, "model": run.model.name, "cluster": run.cluster.name,
        **{column: getattr(run.layout, column) for column, _ in LABEL_AXES if hasattr(run.layout, column)},
        **engine_columns({"name": run.engine.name, "fsdp_version": run.engine.fsdp_version,
                          "compile": run.engine.compile}),
        "layout": run_label(run), "run": run_label(run),
    } for run in runs])
    return layout_labels(frame, engine_words=False).tolist()


def _fmt(value: Optional[float], pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _unit_of(values: List[Optional[int]]) -> tuple:
    return memory_unit(max((abs(value) for value in values if value is not None), default=0))


def table_columns(points: Sequence[PlannedPoint]) -> List[tuple]:
    """(header, priority, cell function): higher priority numbers are dropped first when the terminal is narrow;
    each memory column has the unit its largest value reads best in."""
    plans = [point.plan for point in points if point.plan is not None and not point.errors]
    mem_unit, mem_scale = _unit_of([plan.memory.total_bytes for plan in plans if plan.memory])
    dev_unit, dev_scale = _unit_of([plan.device_memory_bytes for plan in plans])
    margin_unit, margin_scale = _unit_of([plan.margin_bytes for plan in plans])

    def valid(cell: Callable[[Any], Optional[float]], pattern: str) -> Callable[[PlannedPoint], str]:
        return lambda point: "-" if point.plan is None or point.errors else _fmt(cell(point.plan), pattern)

    def scaled(value: Optional[int], scale: int) -> Optional[float]:
        return None if value is None else value / scale

    columns = [
        ("layout", 0, lambda p: p.label),
        ("fit", 0, lambda p: p.fit),
        (f"mem/rank ({mem_unit})", 1, valid(lambda plan: scaled(plan.memory.total_bytes, mem_scale), "{:,.2f}")),
        (f"device ({dev_unit})", 3, valid(lambda plan: scaled(plan.device_memory_bytes, dev_scale), "{:,.2f}")),
        (f"margin ({margin_unit})", 2, valid(lambda plan: scaled(plan.margin_bytes, margin_scale), "{:+,.2f}")),
        ("GFLOP/token", 4, valid(lambda plan: plan.flops_per_token / 1e9, "{:,.3g}")),
        ("tokens/step", 5, lambda p: _fmt(p.row.get("tokens_per_step"), "{:,}")),
    ]
    if len(_world_sizes(points)) > 1:  # one world size for all is said in the title instead
        columns.insert(2, ("ranks", 3, lambda p: _fmt(p.row.get("world"), "{}")))
    if any(getattr(plan, "tokens_per_s", None) for plan in plans):
        columns.insert(3, ("pred tokens/s (band)", 1, lambda p: "-" if p.plan is None or p.errors
                           else predicted_rate(p.plan)))
        columns.insert(4, ("pred MFU (%)", 2, valid(lambda plan: plan.predicted_mfu and 100 * plan.predicted_mfu,
                                                    "{:.1f}")))
    columns.append(("first problem (--why: all)", 0, _first_problem))
    return columns


def predicted_rate(plan: Any) -> str:
    """The predicted tokens/s with its band: `48,700 (±9%)`, `48,700 (±63%*)` where it is uncalibrated (a note
    under the table says so; harness.rundir.vocabulary.format_with_band)."""
    band = plan.prediction_band
    return format_with_band(plan.tokens_per_s, band.half_width if band else None, band.source if band else None,
                            marked=True)


def band_notes(points: Sequence[PlannedPoint]) -> List[str]:
    """One line per distinct band shown: what it is derived from, and where it is not the group's own."""
    bands = {point.plan.prediction_band for point in points
             if point.plan is not None and not point.errors and point.plan.prediction_band is not None}
    return [("* " if not band.calibrated else "") + describe(band)
            for band in sorted(bands, key=lambda b: (b.regime, b.half_width))]


def _world_sizes(points: Sequence[PlannedPoint]) -> set:
    return {point.row.get("world") for point in points if point.row}


def _first_problem(point: PlannedPoint) -> str:
    if not point.errors:
        return ""
    more = len(point.errors) - 1
    return point.errors[0] + (f" (+{more} more)" if more else "")


def print_plan_table(points: Sequence[PlannedPoint], wide: bool = False, width: Optional[int] = None) -> List[str]:
    """The table: the most useful columns that fit the terminal (harness.terminal), the first problem wrapped;
    returns the headers left out."""
    from harness.terminal import Column, print_table

    columns = table_columns(points)
    last = len(columns) - 1  # the first problem: free text, wrapped like the layout label
    shape = [Column(header, priority, "left" if index in (0, 1, last) else "right", wrap=index in (0, last))
             for index, (header, priority, _) in enumerate(columns)]
    cells = [[cell(point) for _, _, cell in columns] for point in points]
    if not any(row[last] for row in cells):  # no layout has a problem: no empty column
        shape, cells = shape[:last], [row[:last] for row in cells]
    counts = pd.Series([point.fit for point in points]).value_counts()
    worlds = _world_sizes(points)
    title = (f"{len(points)} layout(s)" + (f" on {worlds.pop()} ranks" if len(worlds) == 1 else "") + ": "
             + ", ".join(f"{counts[k]} {k}" for k in FIT_ORDER if k in counts))
    return print_table(shape, cells, title, wide=wide, width=width,
                       hint="--wide shows every column, --json every field")


def print_messages(points: Sequence[PlannedPoint], why: bool, out: Callable[[str], None] = print) -> None:
    """Warnings shared by every layout once; with --why every error and warning of every layout."""
    warnings = [set(point.warnings) for point in points if point.plan is not None]
    shared = set.intersection(*warnings) if warnings else set()
    for message in sorted(shared):
        out(f"note (all layouts): {message}")
    for line in band_notes(points):
        out(f"note: {line}")
    if why:
        for point in points:
            for kind, messages in (("error", point.errors), ("warning", [w for w in point.warnings
                                                                          if w not in shared])):
                for message in messages:
                    out(f"  {point.label}: {kind}: {message}")
        return
    hidden = sum(len(point.errors) + len(set(point.warnings) - shared) for point in points)
    if hidden:
        out(f"{hidden} more message(s): add --why to see every error and warning")


# What a refused layout has no value for in the export: it never runs, so a file sorted by throughput must not
# rank it (the table shows "-" there too); its memory stays, which says by how much an OOM misses.
PREDICTION_COLUMNS = ("mfu", "mfu(bf16 peak)", "step_time(s)", "tokens_per_s", "tokens_per_s_band", "band_regime",
                      "band_source", "band_rows", "job_time_min")


def export_rows(points: Sequence[PlannedPoint]) -> List[Dict[str, Any]]:
    """Every column of every point (for --json / --csv), in the table's order. `valid` is the admission's
    verdict (an engine's refusal included; a layout refused for memory alone is valid and OOM)."""
    rows = []
    for point in points:
        row = {"label": point.label, "fit": point.fit, **point.row}
        if point.errors:
            row.update({column: None for column in PREDICTION_COLUMNS if column in row})
            row["valid"] = point.fit == "OOM"
        rows.append({**row, "errors": "; ".join(point.errors), "warnings": "; ".join(point.warnings)})
    return rows


def write_export(rows: List[Dict[str, Any]], kind: str, stream: Any) -> None:
    if kind == "json":
        json.dump(rows, stream, indent=1, default=str)
        stream.write("\n")
        return
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else [])
    writer.writeheader()
    writer.writerows(rows)
    stream.write(buffer.getvalue())


def resolve_hub_model(run: Any) -> Any:
    """A `model.hub_id` replaces the preset's fields with the hub's config.json (or refuses clearly)."""
    from harness.config.hub import fetch_hub_config

    if not run.model.hub_id:
        return run
    fields = fetch_hub_config(run.model.hub_id)
    return replace(run, model=replace(run.model, name=run.model.hub_id,
                                      hf_config={**run.model.hf_config, **fields}))


def job_time_columns(run: Any, plan: Any) -> Dict[str, Optional[float]]:
    """A Slurm run's time against its limit (harness.plan.time_limit), minutes, in the exported rows."""
    from harness.plan.time_limit import plan_job_time

    need = plan_job_time(run, plan)
    return {"job_time_min": need.needed_s / 60 if need else None,
            "time_limit_min": need.limit_s / 60 if need and need.limit_s else None}


def plan_points(overrides: List[str], config_dirs: Sequence[str] = ()) -> List[PlannedPoint]:
    """Compose, resolve and plan every grid point; a point the config refuses becomes an invalid row."""
    from harness.config.compose import compose_run_config
    from harness.config.fill import DegreeFillError
    from harness.config.grid import expand_grid
    from harness.engines.admission import judge, launcher_to_add
    from harness.plan.planner import plan_rows

    composed, refused, added = [], [], {}
    grid = expand_grid(overrides)
    swept = {item for point in grid for item in point if sum(item in other for other in grid) < len(grid)}
    for point in grid:
        try:
            run = compose_run_config(point, config_dirs)
            # A multi-node cluster is planned as the Slurm job it needs when no launcher was named.
            launcher = launcher_to_add(point, run)
            if launcher:
                added[launcher] = run.cluster.nodes
                run = compose_run_config([*point, f"launcher={launcher}"], config_dirs)
            composed.append(resolve_hub_model(run))
        except DegreeFillError as error:
            label = " ".join(item.split(".")[-1] for item in point if item in swept) or "(defaults)"
            refused.append(PlannedPoint(label, None, [str(error)], [], {}))
    labels = point_labels(composed) if composed else []
    points = []
    for run, label in zip(composed, labels):
        verdict = judge(run)
        points.append(PlannedPoint(label, verdict.plan, list(verdict.errors), list(verdict.warnings),
                                   {**plan_rows([verdict.plan])[0], **job_time_columns(run, verdict.plan)}))
    for launcher, nodes in added.items():  # stderr: --json / --csv stay parseable
        print_fitted(f"[harness] launcher not given; planned with launcher={launcher}, which cluster.nodes={nodes} "
                     f"needs (a Slurm job across the nodes; name a launcher to override)", sys.stderr)
    return [*points, *refused]


PLAN_FLAGS = ("--why", "--json", "--csv", "--wide")


def parse_args(args: List[str]) -> tuple:
    from harness.config.arguments import OneLineParser, refuse_unknown

    parser = OneLineParser(prog="harness plan", add_help=True,
                           description="Predict memory / FLOPs / validity of layouts (no launch).")
    parser.add_argument("--why", action="store_true", help="every error and warning of every layout")
    parser.add_argument("--json", action="store_true", help="every column as JSON on stdout (no table)")
    parser.add_argument("--csv", action="store_true", help="every column as CSV on stdout (no table)")
    parser.add_argument("--wide", action="store_true", help="every column of the table, however wide")
    options, extra = parser.parse_known_args(args)
    return options, refuse_unknown(parser.prog, extra)


def plan_main(args: List[str], config_dirs: Sequence[str] = ()) -> int:
    """Exit 0 when every layout is valid, 1 when any is refused, 2 when the model cannot be resolved."""
    from harness.config.hub import HubUnreachable

    options, overrides = parse_args(args)
    try:
        points = sort_points(plan_points(overrides, config_dirs))
    except HubUnreachable as error:
        print(f"harness plan: {error}", file=sys.stderr)
        return 2
    if options.json or options.csv:
        write_export(export_rows(points), "json" if options.json else "csv", sys.stdout)
    else:
        from rich.console import Console

        from harness.terminal import terminal_width

        print_plan_table(points, wide=options.wide)
        # One layout: every message is worth its lines (wrapped to the terminal; a pipe gets them whole).
        console = Console(width=terminal_width() or 100_000)
        print_messages(points, options.why or len(points) == 1,
                       lambda line: console.print(line, markup=False, highlight=False))
    return 1 if any(point.errors for point in points) else 0
