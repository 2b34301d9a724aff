"""The report's interactive plots (plotly): every bar's hover shows its run's layout and numbers."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pandas as pd

from harness.report.headline import layout_summary
from harness.rundir import COMPLETED, PLOTLY_JS, TIME_PARTS, write_bytes
from harness.rundir.vocabulary import (ci_words, format_band, format_bytes, format_gib, format_seconds, memory_unit,
                                      time_unit)

MEASURED, RECOMMENDED, PREDICTED = "#4e79a7", "#59a14f", "#e15759"
MEMORY_PARTS = (("param_bytes", "parameters", "#4e79a7"), ("grad_bytes", "gradients", "#f28e2b"),
                ("optimizer_bytes", "optimizer states", "#e15759"), ("activation_bytes", "activations", "#76b7b2"))
PREDICTED_SHADES = ("#8f8f8f", "#a8a8a8", "#c0c0c0", "#d6d6d6")
OTHER_SHADE = "#e9e9e9"
# Fewer timed steps than this, or a spread (max - min) wider than this share of the median, earns a warning.
FEW_STEPS = 5
WIDE_SPREAD = 0.25
CONFIG = {"displaylogo": False, "responsive": True, "displayModeBar": False}


def write_plotly_js(out_dir: Path) -> Path:
    """plotly.js beside the report, written once per folder (and again only if plotly's version changed)."""
    from plotly.offline import get_plotlyjs

    path = Path(out_dir) / PLOTLY_JS
    script = get_plotlyjs().encode("utf-8")
    if not path.exists() or path.stat().st_size != len(script):
        write_bytes(path, script)
    return path


def num(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if pd.isna(number) else number


def noise_warning(step_times: Sequence[float]) -> Optional[str]:
    """Why a run's median step time should not be trusted to a few percent, or None."""
    times = [float(t) for t in step_times]
    if not times:
        return None
    if len(times) < FEW_STEPS:
        return f"only {len(times)} timed step{'s' if len(times) != 1 else ''} (bench.steps): raise it for a steadier median"
    median = float(pd.Series(times).median())
    spread = (max(times) - min(times)) / median if median > 0 else 0.0
    if spread > WIDE_SPREAD:
        return (f"step times spread {spread:.0%} of the median ({format_seconds(min(times))}–{format_seconds(max(times))}): "
                "a loaded machine; compare layouts with care")
    return None


def hover_text(row: pd.Series) -> str:
    """What a bar's hover shows: the run, its whole layout and its measured and predicted numbers."""
    lines = [f"<b>{escape(str(row['label']))}</b> ({escape(str(row['run']))}, {row['status']})",
             escape(layout_summary(row.to_dict()))]
    pairs = (("tokens/s", num(row.get("tokens_per_s")), "{:,.0f}"),
             ("tokens/s/device", num(row.get("tokens_per_s_per_device")), "{:,.0f}"),
             ("predicted tokens/s", num(row.get("tokens_per_s_predicted")), "{:,.0f}"),
             ("band", num(row.get("tokens_per_s_band")), format_band),
             ("measured vs band", _text(row.get("tokens_per_s_in_band")), "{}"),
             ("tokens/s 95% CI", None, ""),
             ("step median", num(row.get("step_time_s")), format_seconds),
             ("step min / max", None, ""),
             ("MFU", num(row.get("mfu")), "{:.2%}"), ("MFU predicted", num(row.get("mfu_predicted")), "{:.2%}"))
    for name, value, pattern in pairs:
        if name == "tokens/s 95% CI" and num(row.get("tokens_per_s_ci_low")) is not None:
            low, high = row["tokens_per_s_ci_low"], row["tokens_per_s_ci_high"]
            lines.append(f"tokens/s {ci_words(row)}: {low:,.0f}–{high:,.0f}"
                         + (f" ({row['repeats']:.0f} repeats pooled)" if (num(row.get("repeats")) or 1) > 1 else ""))
        elif name == "step min / max" and num(row.get("step_time_min_s")) is not None:
            lines.append(f"step min / max: {format_seconds(row['step_time_min_s'])} / "
                         f"{format_seconds(row['step_time_max_s'])}")
        elif value is not None:
            lines.append(f"{name}: {pattern(value) if callable(pattern) else pattern.format(value)}")
    lines += memory_hover_lines(row)
    if row.get("reason"):
        lines.append(f"reason: {escape(str(row['reason'])[:120])}")
    if row.get("host_disturbed") is True:
        lines.append(f"DISTURBED: {escape(str(row.get('host_disturbances') or '')[:200])}")
    return "<br>".join(lines)


def error_bars(frame: pd.DataFrame, column: str, scale: float = 1.0) -> Optional[Dict[str, Any]]:
    """plotly's asymmetric error bar from `<column>_ci_low` / `_ci_high` (the 95% interval), None without any."""
    low, high = frame.get(f"{column}_ci_low"), frame.get(f"{column}_ci_high")
    if low is None or high is None:
        return None
    values = [num(v) for v in frame[column]]
    plus = [None if v is None or num(h) is None else (num(h) - v) * scale for v, h in zip(values, high)]
    minus = [None if v is None or num(lo) is None else (v - num(lo)) * scale for v, lo in zip(values, low)]
    if all(p is None for p in plus):
        return None
    return dict(type="data", symmetric=False, array=plus, arrayminus=minus, color="#333", thickness=1.5, width=4)


def _layout(fig, title: str, x_title: str, rows: int, x_format: str = "") -> None:
    fig.update_layout(title=None, height=max(220, 70 + 34 * rows), margin=dict(l=10, r=20, t=10, b=40),
                      barmode="group", legend=dict(orientation="h", y=-0.18), hoverlabel=dict(align="left"),
                      plot_bgcolor="#fff", xaxis=dict(title=x_title, gridcolor="#eee", zeroline=True,
                                                      tickformat=x_format, rangemode="tozero"),
                      yaxis=dict(automargin=True, autorange="reversed", type="category"))
    fig.update_layout(meta={"title": title})


def _div(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG)


def throughput_figure(frame: pd.DataFrame, labels: Dict[int, str], best_runs: set):
    """Measured tokens/s per device per layout (the recommended one green), the prediction as a diamond."""
    import plotly.graph_objects as go

    names = [labels[i] for i in frame.index]
    hover = [hover_text(row) for _, row in frame.iterrows()]
    values = [num(v) for v in frame["tokens_per_s_per_device"]]
    colours = [RECOMMENDED if run in best_runs else MEASURED for run in frame["run_dir"]]
    notes = ["" if v is not None else _note(row) for v, (_, row) in zip(values, frame.iterrows())]
    fig = go.Figure(go.Bar(y=names, x=[v or 0 for v in values], orientation="h", name="measured (95% CI)",
                           marker_color=colours, text=notes, textposition="outside", hovertext=hover,
                           hoverinfo="text", error_x=error_bars(frame, "tokens_per_s_per_device")))
    predicted = [_per_device(row) for _, row in frame.iterrows()]
    _add_predicted(fig, names, predicted, hover, "predicted (band)", band_bars(frame, predicted))
    _layout(fig, "throughput", "tokens/s per device (higher is better)", len(names), ",.0f")
    return fig


def _add_predicted(fig: "go.Figure", names: Sequence[str], predicted: Sequence[Optional[float]],
                   hover: Sequence[str], name: str, error_x: Optional[Dict[str, Any]] = None) -> None:
    """Predicted values as diamonds beside the measured bars, with their band where given (nothing when no run
    has a prediction)."""
    import plotly.graph_objects as go

    if any(p is not None for p in predicted):
        fig.add_trace(go.Scatter(y=names, x=predicted, mode="markers", name=name,
                                 marker=dict(symbol="diamond", size=11, color=PREDICTED), hovertext=hover,
                                 hoverinfo="text", error_x=error_x))


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def band_bars(frame: pd.DataFrame, predicted: Sequence[Optional[float]]) -> Optional[Dict[str, Any]]:
    """plotly's error bar of each prediction's band (harness.plan.uncertainty: ±tokens_per_s_band of the
    prediction), None where no run has one."""
    widths = [num(v) for v in frame.get("tokens_per_s_band", pd.Series([None] * len(frame), index=frame.index))]
    bars = [None if p is None or w is None else p * w for p, w in zip(predicted, widths)]
    if all(b is None for b in bars):
        return None
    return dict(type="data", array=bars, color=PREDICTED, thickness=1.5, width=6)


def _per_device(row: pd.Series) -> Optional[float]:
    predicted, world = num(row.get("tokens_per_s_predicted")), num(row.get("world_size"))
    return predicted / world if predicted is not None and world else None


def _note(row: pd.Series) -> str:
    if row["status"] == COMPLETED:
        return "no measurement"
    return str(row["status"]) + (" (predicted OOM)" if row.get("fits_predicted") is False else "")


def mfu_figure(frame: pd.DataFrame, labels: Dict[int, str]):
    """Measured MFU (and HFU where recomputation makes it differ) beside the predicted MFU."""
    import plotly.graph_objects as go

    names = [labels[i] for i in frame.index]
    hover = [hover_text(row) for _, row in frame.iterrows()]
    mfu = [num(v) for v in frame["mfu"]]
    fig = go.Figure(go.Bar(y=names, x=[v or 0 for v in mfu], orientation="h", name="MFU measured (95% CI)",
                           marker_color=MEASURED, hovertext=hover, hoverinfo="text", error_x=error_bars(frame, "mfu"),
                           text=["" if v is not None else _note(row) or "MFU unknown"
                                 for v, (_, row) in zip(mfu, frame.iterrows())], textposition="outside"))
    hfu = [num(v) for v in frame["hfu"]]
    if any((h or 0) != (m or 0) for h, m in zip(hfu, mfu)):
        fig.add_trace(go.Bar(y=names, x=[v or 0 for v in hfu], orientation="h", name="HFU measured",
                             marker_color="#a0cbe8", hovertext=hover, hoverinfo="text",
                             error_x=error_bars(frame, "hfu")))
    predicted = [num(v) for v in frame.get("mfu_predicted", pd.Series([None] * len(frame), index=frame.index))]
    _add_predicted(fig, names, predicted, hover, "MFU predicted")
    _layout(fig, "mfu", "model FLOPs utilization (higher is better)", len(names), ".1%")
    return fig


def memory_hover_lines(row: Any) -> List[str]:
    """Measured memory beside the prediction of the same thing (table._memory_columns): the allocator's peak
    (GPU) beside the predicted total, or the states and activations (CPU) beside their prediction, the total
    with its allowance named apart (a CPU run's 1.7 MiB measured sat beside the 2.1 MiB total)."""
    peak, states = num(row.get("mem_allocated_peak_gib")), num(row.get("mem_state_activation_gib"))
    total, parts = num(row.get("mem_predicted_gib")), num(row.get("mem_predicted_state_activation_gib"))
    if peak is not None:
        return [f"memory measured (allocator peak): {format_gib(peak)}"] + (
            [f"memory predicted (total): {format_gib(total)}"] if total is not None else [])
    lines = [f"memory measured (states + activations): {format_gib(states)}"] if states is not None else []
    if parts is not None:
        lines.append(f"memory predicted (states + activations): {format_gib(parts)}"
                     + (f"; total with allowance {format_gib(total)}" if total is not None else ""))
    elif total is not None:
        lines.append(f"memory predicted (total): {format_gib(total)}")
    return lines


def _memory_parts(row: pd.Series) -> Tuple[List[Tuple[str, Optional[float]]], List[Tuple[str, Optional[float]]]]:
    measured = [(name, num(row.get(col))) for col, name, _ in MEMORY_PARTS]
    predicted = [(name, num(row.get(f"pred_{col}"))) for col, name, _ in MEMORY_PARTS]
    total = num(row.get("mem_predicted_gib"))
    if all(v is not None for _, v in predicted) and total is not None:
        predicted.append(("other (gathered, recompute, allowance)", max(total * 2**30 - sum(v for _, v in predicted), 0)))
    return measured, predicted


def memory_figure(frame: pd.DataFrame, labels: Dict[int, str]) -> Tuple[Any, str]:
    """Per layout two stacked bars, measured (colours) and predicted (greys), and device memory where it is
    on the scale; the caption says where it is when it is not."""
    import plotly.graph_objects as go

    names = [labels[i] for i in frame.index]
    hover = [hover_text(row) for _, row in frame.iterrows()]
    parts = [_memory_parts(row) for _, row in frame.iterrows()]
    fig = go.Figure()
    for group, side, shades in (("measured", 0, [c for _, _, c in MEMORY_PARTS]),
                                ("predicted", 1, [*PREDICTED_SHADES, OTHER_SHADE])):
        base = [0.0] * len(names)
        count = max(len(p[side]) for p in parts) if parts else 0
        for k in range(count):
            values = [(p[side][k][1] or 0.0) if k < len(p[side]) else 0.0 for p in parts]
            label = next((p[side][k][0] for p in parts if k < len(p[side])), "")
            fig.add_trace(go.Bar(y=names, x=values, base=list(base), orientation="h", offsetgroup=group,
                                 name=f"{group} {label}", marker_color=shades[k % len(shades)],
                                 hovertext=[f"{group} {label}: {format_bytes(v)}<br>{h}" for v, h in zip(values, hover)],
                                 hoverinfo="text", legendgroup=group))
            base = [b + v for b, v in zip(base, values)]
    biggest = max([sum(v or 0 for _, v in p[s]) for p in parts for s in (0, 1)] + [1.0])
    peaks = [num(v) for v in frame.get("mem_allocated_peak_gib", pd.Series([None] * len(frame), index=frame.index))]
    if any(p is not None for p in peaks):
        fig.add_trace(go.Scatter(y=names, x=[p * 2**30 if p is not None else None for p in peaks], mode="markers",
                                 name="allocator peak (measured)", marker=dict(symbol="line-ns-open", size=18,
                                                                               color="#222", line_width=3)))
    device = [(num(v) or 0.0) * 2**30 for v in frame["device_memory_gib"]]
    caption = ""
    if device and 0 < max(device) <= 3 * biggest:
        fig.add_trace(go.Scatter(y=names, x=device, mode="markers", name="device memory",
                                 marker=dict(symbol="line-ns-open", size=22, color="#d62728", line_width=3)))
    elif any(device):
        caption = (f"Device memory ({format_bytes(max(device))} per device) is off this scale: the largest bar is "
                   f"{format_bytes(biggest)} ({biggest / max(device):.2%} of it).")
    _layout(fig, "memory", "bytes per device (upper bar measured, lower bar predicted)", 2 * len(names))
    binary_axis(fig, biggest)
    return fig, caption


TIME_PART_NAMES = {"compute": "compute", "exposed_comm": "exposed communication", "bubble": "pipeline bubble",
                   "optimizer": "optimizer step", "offload": "offload traffic"}
TIME_SHADES = ("#8f8f8f", "#a8a8a8", "#c0c0c0", "#d6d6d6", "#e9e9e9")


def step_time_parts_figure(frame: pd.DataFrame, labels: Dict[int, str]):
    """Per layout the measured median step time (upper bar) and the predicted one (lower bar, greys) stacked
    by where the time model says it goes, as the memory chart stacks bytes."""
    import plotly.graph_objects as go

    names = [labels[i] for i in frame.index]
    hover = [hover_text(row) for _, row in frame.iterrows()]
    fig = go.Figure()
    measured = [num(v) for v in frame.get("step_time_s", pd.Series([None] * len(frame), index=frame.index))]
    fig.add_trace(go.Bar(y=names, x=[v or 0.0 for v in measured], orientation="h", offsetgroup="measured",
                         name="measured (median step, 95% CI)", marker_color=MEASURED, hoverinfo="text",
                         error_x=error_bars(frame, "step_time_s"),
                         hovertext=[f"measured: {_seconds(v)}<br>{h}" for v, h in zip(measured, hover)]))
    base = [0.0] * len(names)
    for part, shade in zip(TIME_PARTS, TIME_SHADES):
        column = frame.get(f"pred_time_{part}_s", pd.Series([None] * len(frame), index=frame.index))
        values = [num(v) or 0.0 for v in column]
        if not any(values):
            continue
        label = TIME_PART_NAMES[part]
        fig.add_trace(go.Bar(y=names, x=values, base=list(base), orientation="h", offsetgroup="predicted",
                             name=f"predicted {label}", marker_color=shade, legendgroup="predicted",
                             hovertext=[f"predicted {label}: {_seconds(v)}<br>{h}" for v, h in zip(values, hover)],
                             hoverinfo="text"))
        base = [b + v for b, v in zip(base, values)]
    _layout(fig, "step_time_parts", "time per optimizer step (upper bar measured, lower bar predicted)",
            2 * len(names))
    seconds_axis(fig, max([v for v in measured if v is not None] + [max(base, default=0.0), 0.0]))
    return fig


def _seconds(value: Optional[float]) -> str:
    return format_seconds(value)


def binary_axis(fig, largest_bytes: float) -> None:
    """Scale a bytes axis to MiB or GiB (the vocabulary's rule) and say so in its ticks: plotly's own `.3s`
    ticks are decimal SI (kB, MB), which reads wrong beside the MiB of every table. Only x values and bases
    of bar and scatter traces are bytes on the memory chart."""
    unit, scale = memory_unit(largest_bytes)
    for trace in fig.data:
        trace.x = [None if v is None else v / scale for v in trace.x]
        if getattr(trace, "base", None) is not None:
            trace.base = [b / scale for b in trace.base]
    fig.update_xaxes(tickformat=",.3~g", ticksuffix=f" {unit}")


def seconds_axis(fig, largest_s: float) -> None:
    """Scale a seconds axis to ms or s (the vocabulary's rule)."""
    unit, scale = time_unit(largest_s)
    for trace in fig.data:
        trace.x = [None if v is None else v / scale for v in trace.x]
        if getattr(trace, "base", None) is not None:
            trace.base = [b / scale for b in trace.base]
        error = getattr(trace, "error_x", None)
        if error is not None and error.array is not None:
            trace.error_x.array = [None if v is None else v / scale for v in error.array]
            if error.arrayminus is not None:
                trace.error_x.arrayminus = [None if v is None else v / scale for v in error.arrayminus]
    fig.update_xaxes(tickformat=",.3~g", ticksuffix=f" {unit}")


def step_time_figure(frame: pd.DataFrame, labels: Dict[int, str]):
    """Every timed step of every completed run: a box (min, quartiles, median, max) with the steps as dots."""
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = 0
    for i, row in frame.iterrows():
        times = row.get("step_times_s")
        if not _is_sequence(times):
            continue
        rows += 1
        fig.add_trace(go.Box(x=[float(t) for t in times], name=labels[i], boxpoints="all", jitter=0.3,
                             pointpos=0, marker_color=MEASURED, orientation="h", showlegend=False,
                             hoverinfo="x+name"))
    _layout(fig, "step_times", "time of one optimizer step (lower is better)", rows)
    fig.update_layout(barmode=None)
    seconds_axis(fig, max((max(trace.x) for trace in fig.data), default=0.0))
    return fig


def _is_sequence(value: Any) -> bool:
    """A list of step times (a list, or the numpy array Parquet gives back), not a missing value."""
    return hasattr(value, "__len__") and not isinstance(value, str) and len(value) > 0


def chart(fig, div_id: str) -> str:
    """A plot's <div> and its script (plotly.js itself is loaded once per page)."""
    return f'<div class="plot" id="{div_id}-box">{_div(fig, div_id)}</div>'
