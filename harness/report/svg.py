"""Inline SVG charts with no dependencies: horizontal bar charts and per-row distributions."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from html import escape
from typing import Callable, Dict, List, Optional, Sequence, Tuple

WIDTH = 900
ROW_GAP = 6
BAR_HEIGHT = 14
FONT = 12
CHAR_WIDTH = 7.0  # average width of one 12 px sans-serif character (bold included), for the label column
LEGEND_HEIGHT = 22
AXIS_HEIGHT = 34

Formatter = Callable[[float], str]


class Scale:
    """Formats values in one unit (`size` of the base unit, `suffix`); ticks are placed in that unit."""

    def __init__(self, size: float = 1.0, suffix: str = "", digits: int = 3):
        self.size, self.suffix, self.digits = size, suffix, digits

    def __call__(self, value: float) -> str:
        return f"{value / self.size:.{self.digits}g}{self.suffix}"


def _ticks(maximum: float, fmt: Formatter) -> List[float]:
    size = getattr(fmt, "size", 1.0)
    return [tick * size for tick in nice_ticks(maximum / size)]


@dataclass(frozen=True)
class Series:
    """A named colour: a bar segment or a marker kind."""

    name: str
    color: str
    dashed: bool = False


@dataclass
class Row:
    """One category: side-by-side bars (each a stack of (series, value) segments), markers, a note."""

    label: str
    bars: List[List[Tuple[str, float]]] = field(default_factory=list)
    markers: List[Tuple[str, float]] = field(default_factory=list)
    note: str = ""  # written where the bar would start (e.g. "OOM", "PRUNED")
    highlight: bool = False


def nice_ticks(maximum: float, count: int = 5) -> List[float]:
    """Round tick values 0 .. >= maximum (steps of 1, 2, 2.5 or 5 times a power of ten)."""
    if maximum <= 0 or not math.isfinite(maximum):
        return [0.0, 1.0]
    raw = maximum / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < maximum * (1 - 1e-9):
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _text(x: float, y: float, content: str, anchor: str = "start", size: int = FONT, color: str = "#222",
          weight: str = "normal", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
            f'font-weight="{weight}"{klass}>{escape(content)}</text>')


def _label_width(labels: Sequence[str]) -> float:
    longest = max((len(label) for label in labels), default=4)
    return min(380.0, max(80.0, longest * CHAR_WIDTH + 12))


def _legend(series: Sequence[Series], x0: float) -> Tuple[str, float]:
    """Legend entries left to right, wrapping at the chart's width; returns (svg, height)."""
    parts, x, y = [], x0, 0.0
    for s in series:
        width = 28 + len(s.name) * 6.2
        if x + width > WIDTH and x > x0:
            x, y = x0, y + LEGEND_HEIGHT - 4
        if s.dashed:
            parts.append(f'<line x1="{x + 6:.1f}" y1="{y + 4:.1f}" x2="{x + 6:.1f}" y2="{y + 18:.1f}" '
                         f'stroke="{s.color}" stroke-width="2" stroke-dasharray="3,2"/>')
        else:
            parts.append(f'<rect x="{x:.1f}" y="{y + 5:.1f}" width="12" height="12" fill="{s.color}"/>')
        parts.append(_text(x + 16, y + 15, s.name, size=11))
        x += width
    return f'<g class="legend">{"".join(parts)}</g>', y + LEGEND_HEIGHT


def _axis(x0: float, plot_width: float, top: float, bottom: float, ticks: List[float], scale: float,
          fmt: Formatter, x_label: str) -> str:
    parts = []
    for tick in ticks:
        x = x0 + tick * scale
        parts.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" stroke="#e3e3e3"/>')
        parts.append(_text(x, bottom + 14, fmt(tick), anchor="middle", size=11, color="#555"))
    parts.append(f'<line x1="{x0:.1f}" y1="{top:.1f}" x2="{x0:.1f}" y2="{bottom:.1f}" stroke="#888"/>')
    parts.append(_text(x0 + plot_width / 2, bottom + 30, x_label, anchor="middle", size=11, color="#333"))
    return "".join(parts)


def _frame(title: str, width: float, height: float, body: str, chart_id: str) -> str:
    return (f'<svg class="plot" id="{escape(chart_id)}" role="img" aria-label="{escape(title)}" '
            f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
            f'font-family="system-ui, -apple-system, Segoe UI, sans-serif">'
            f'<title>{escape(title)}</title><rect width="100%" height="100%" fill="#fff"/>{body}</svg>')


def _empty(title: str, message: str, chart_id: str) -> str:
    return _frame(title, WIDTH, 60, _text(20, 35, message, color="#777"), chart_id)


def bar_chart(title: str, rows: Sequence[Row], series: Sequence[Series], fmt: Formatter, x_label: str,
              chart_id: str, empty_message: str = "nothing to plot yet") -> str:
    """Horizontal bars, one row per category; bars of a row side by side, segments of a bar stacked."""
    if not rows:
        return _empty(title, empty_message, chart_id)
    colors: Dict[str, Series] = {s.name: s for s in series}
    used = {name for row in rows for bar in row.bars for name, _ in bar}
    used |= {name for row in rows for name, _ in row.markers}
    per_row = max(1, max(len(row.bars) for row in rows))
    row_height = per_row * BAR_HEIGHT + ROW_GAP * 2
    label_w = _label_width([row.label for row in rows])
    value_w = 90.0
    x0, plot_w = label_w, WIDTH - label_w - value_w
    legend, legend_h = _legend([s for s in series if s.name in used], x0)
    top = legend_h + 6
    bottom = top + row_height * len(rows)
    maximum = max([sum(v for _, v in bar) for row in rows for bar in row.bars]
                  + [v for row in rows for _, v in row.markers] + [0.0])
    ticks = _ticks(maximum, fmt)
    scale = plot_w / ticks[-1]
    parts = [legend, _axis(x0, plot_w, top, bottom, ticks, scale, fmt, x_label)]
    for i, row in enumerate(rows):
        y = top + i * row_height + ROW_GAP
        if row.highlight:
            parts.append(f'<rect x="0" y="{y - ROW_GAP / 2:.1f}" width="{WIDTH}" height="{row_height - ROW_GAP:.1f}" '
                         f'fill="#eef7ee"/>')
        weight = "bold" if row.highlight else "normal"
        parts.append(_text(x0 - 6, y + per_row * BAR_HEIGHT / 2 + 4, row.label, anchor="end", weight=weight))
        for j, bar in enumerate(row.bars):
            x, by = x0, y + j * BAR_HEIGHT
            for name, value in bar:
                w = max(0.0, value * scale)
                tip = escape(f"{row.label}: {name} {fmt(value)}")
                parts.append(f'<rect class="bar" x="{x:.1f}" y="{by + 1:.1f}" width="{w:.1f}" '
                             f'height="{BAR_HEIGHT - 2}" fill="{colors[name].color}"><title>{tip}</title></rect>')
                x += w
            if bar:
                parts.append(_text(x + 4, by + BAR_HEIGHT - 3, fmt(sum(v for _, v in bar)), size=11, color="#333"))
        for name, value in row.markers:
            mx = x0 + value * scale
            style = colors[name]
            dash = ' stroke-dasharray="3,2"' if style.dashed else ""
            parts.append(f'<line class="marker" x1="{mx:.1f}" y1="{y - 2:.1f}" x2="{mx:.1f}" '
                         f'y2="{y + per_row * BAR_HEIGHT + 2:.1f}" stroke="{style.color}" stroke-width="2"{dash}>'
                         f'<title>{escape(f"{row.label}: {name} {fmt(value)}")}</title></line>')
        if row.note:
            parts.append(_text(x0 + 4, y + per_row * BAR_HEIGHT / 2 + 4, row.note, size=11, color="#b03030"))
    return _frame(title, WIDTH, bottom + AXIS_HEIGHT, "".join(parts), chart_id)


def distribution_chart(title: str, rows: Sequence[Tuple[str, Sequence[float]]], fmt: Formatter, x_label: str,
                       chart_id: str, color: str = "#4e79a7") -> str:
    """Per row: every value as a dot, the range as a line, the interquartile box and the median tick."""
    rows = [(label, [v for v in values if v is not None]) for label, values in rows]
    rows = [(label, values) for label, values in rows if values]
    if not rows:
        return _empty(title, "no timed steps yet", chart_id)
    row_height = BAR_HEIGHT + ROW_GAP * 2
    label_w = _label_width([label for label, _ in rows])
    x0, plot_w = label_w, WIDTH - label_w - 90.0
    legend, legend_h = _legend([Series("each timed step", color), Series("median", "#222", dashed=True)], x0)
    top = legend_h + 6
    bottom = top + row_height * len(rows)
    ticks = _ticks(max(max(values) for _, values in rows), fmt)
    scale = plot_w / ticks[-1]
    parts = [legend, _axis(x0, plot_w, top, bottom, ticks, scale, fmt, x_label)]
    for i, (label, values) in enumerate(rows):
        y = top + i * row_height + ROW_GAP + BAR_HEIGHT / 2
        ordered = sorted(values)
        q1, median, q3 = _quartiles(ordered)
        parts.append(_text(x0 - 6, y + 4, label, anchor="end"))
        parts.append(f'<line x1="{x0 + ordered[0] * scale:.1f}" y1="{y:.1f}" x2="{x0 + ordered[-1] * scale:.1f}" '
                     f'y2="{y:.1f}" stroke="#999"/>')
        box_w = max(1.0, (q3 - q1) * scale)
        parts.append(f'<rect class="box" x="{x0 + q1 * scale:.1f}" y="{y - 6:.1f}" width="{box_w:.1f}" height="12" '
                     f'fill="{color}" fill-opacity="0.25" stroke="{color}"/>')
        for value in values:
            parts.append(f'<circle class="dot" cx="{x0 + value * scale:.1f}" cy="{y:.1f}" r="2.5" fill="{color}" '
                         f'fill-opacity="0.8"/>')
        parts.append(f'<line x1="{x0 + median * scale:.1f}" y1="{y - 8:.1f}" x2="{x0 + median * scale:.1f}" '
                     f'y2="{y + 8:.1f}" stroke="#222" stroke-width="2">'
                     f'<title>{escape(f"{label}: median {fmt(median)}")}</title></line>')
        parts.append(_text(x0 + ordered[-1] * scale + 6, y + 4, f"median {fmt(median)}", size=11, color="#333"))
    return _frame(title, WIDTH, bottom + AXIS_HEIGHT, "".join(parts), chart_id)


def _quartiles(ordered: List[float]) -> Tuple[float, float, float]:
    if len(ordered) < 2:
        return ordered[0], ordered[0], ordered[0]
    q1, median, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return q1, median, q3


def scaled_formatter(maximum: Optional[float], units: Sequence[Tuple[str, float]], digits: int = 3) -> Scale:
    """A formatter in the largest unit of `units` ((suffix, size), largest first) that `maximum` reaches."""
    suffix, size = units[-1]
    for candidate, candidate_size in units:
        if maximum is not None and maximum >= candidate_size:
            suffix, size = candidate, candidate_size
            break
    return Scale(size, suffix, digits)
