"""The local HTML report: one page with interactive plotly plots; plotly.js sits beside it (no network)."""

from __future__ import annotations

import datetime as _dt
from html import escape
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import pandas as pd

from harness.report import plots
from harness.report.headline import Headline, headlines, sentence
from harness.report.repeats import pool_repeats
from harness.report.verdict import comparable, verdict
from harness.report.table import STATUS_ORDER
from harness.rundir import COMPLETED, write_text
from harness.rundir.vocabulary import BY_KEY, format_gib, format_seconds, format_value, ordered_keys, sharding_column

TEXT_UNITS = ("text", "host")

TITLES = {
    "throughput": "Tokens/s per device by layout",
    "mfu": "MFU by layout",
    "memory": "Memory per device: measured vs predicted vs device memory",
    "step_time_parts": "Step time: measured vs predicted, and where the prediction goes",
    "step_times": "Step-time distribution per run",
    "compare": "Sweeps compared",
    "repeats": "Repeats of each point",
    "status": "Run status and failure reasons",
    "results": "Results table",
}
STATUS_COLORS = {"COMPLETED": "#2e7d32", "RUNNING": "#1565c0", "PENDING": "#6d6d6d", "OOM": "#c62828",
                 "FAILED": "#c62828", "TIMEOUT": "#ef6c00", "CANCELLED": "#6d6d6d", "PRUNED": "#8e6d00"}
MAX_LABEL = 72
# Results table: every figure of the vocabulary the runs have, layout first, then measured, predicted and the
# rest (harness.rundir.vocabulary.ordered_keys); the figures not `shown` sit behind the column picker. Lists,
# folders and the reason (the status table shows it) stay in summary.csv / summary.parquet.
RESULT_LEFT_OUT = ("step_times_s", "run_dir", "source", "status_time", "reason", "host_disturbances", "sweep",
                   "not_executed")


def result_columns(view: pd.DataFrame, several: bool) -> List[Tuple[str, str, str]]:
    """(key, header, kind) of the results table, in table order; `series` only when several sweeps."""
    keys = [key for key in view.columns if key in BY_KEY and key not in RESULT_LEFT_OUT
            and (key != "series" or several)]
    return [(key, BY_KEY[key].header, "status" if key == "status" else "figure") for key in ordered_keys(keys)]


def hidden_columns(columns: Sequence[Tuple[str, str, str]]) -> List[str]:
    """The keys the results table hides until picked: the figures not `shown` by default."""
    return [key for key, _, _ in columns if not BY_KEY[key].shown]


def _fmt(value: Any, kind: str, column: str = "") -> str:
    if kind == "figure":
        text = format_value(column, value)
        return "–" if text == "-" else text
    number = plots.num(value)
    if kind in ("text", "status"):
        return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
    if number is None:
        return "–"
    return {
        "int": lambda n: f"{n:.0f}",
        "rate": lambda n: f"{n:,.0f}",
        "time": format_seconds,
        "float": lambda n: f"{n:.4g}",
        "pct": lambda n: f"{n:.2%}",
        "ratio": lambda n: f"{n:.2f}×",
        "gib": format_gib,
    }[kind](number)


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


def chart_labels(frame: pd.DataFrame) -> Dict[int, str]:
    """Row index -> the name a chart shows: layout label, with the sweep when several, and the run if repeated."""
    several = frame["series"].nunique(dropna=False) > 1
    names = {i: (f"{row.series} · {row.label}" if several else str(row.label)) for i, row in frame.iterrows()}
    counts = pd.Series(list(names.values())).value_counts()
    return {i: _short(f"{name} ({frame.at[i, 'run']})" if counts[name] > 1 else name) for i, name in names.items()}


def ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Completed runs fastest first, then the others by status (running, pending, failed, pruned)."""
    key = frame["status"].map(lambda s: STATUS_ORDER.get(s, 9))
    speed = frame["tokens_per_s_per_device"].astype(float).fillna(-1.0)
    return frame.assign(_key=key, _speed=-speed).sort_values(["_key", "_speed", "run"]).drop(columns=["_key", "_speed"])


def host_marks(frame: pd.DataFrame) -> pd.Series:
    """`DISTURBED` where the host disturbed a run (runtime.host_state's rule), `quiet` where it did not."""
    column = frame["host_disturbed"] if "host_disturbed" in frame else pd.Series([None] * len(frame), index=frame.index)
    return column.map(lambda d: "DISTURBED" if d is True else "quiet" if d is False else "")


def disturbed_caption(frame: pd.DataFrame) -> str:
    """The runs the host disturbed, and why (busy processes, load, GPU slowdown or sharing)."""
    if "host_disturbed" not in frame:
        return ""
    hit = frame[frame["host_disturbed"] == True]  # noqa: E712 (None: not recorded)
    if hit.empty:
        return ""
    items = [f"{row['label']}: {str(row.get('host_disturbances') or 'repeats disturbed')[:160]}"
             for _, row in hit.head(3).iterrows()]
    more = f" (and {len(hit) - 3} more)" if len(hit) > 3 else ""
    return (f"Host disturbed {len(hit)} of {len(frame)} runs (marked DISTURBED in the tables): "
            + "; ".join(items) + more + ".")


def noise_caption(frame: pd.DataFrame, best_runs: set) -> str:
    """The step-time warnings of the completed runs, the recommended one first (few steps, wide spread)."""
    done = frame[frame["status"] == COMPLETED]
    notes = []
    for _, row in sorted(done.iterrows(), key=lambda item: item[1]["run_dir"] not in best_runs):
        times = row.get("step_times_s")
        warning = plots.noise_warning([float(t) for t in times]) if plots._is_sequence(times) else None
        if warning:
            notes.append(f"{row['label']}: {warning}")
    if not notes:
        return ""
    more = f" (and {len(notes) - 3} more runs)" if len(notes) > 3 else ""
    return "Noise: " + "; ".join(notes[:3]) + more + "."


def _table(frame: pd.DataFrame, columns: Sequence[Tuple[str, str, str]], table_id: str,
           best_runs: Iterable[str] = (), hidden: Iterable[str] = ()) -> str:
    """A sortable table; the columns named in `hidden` carry class `off` (shown by the column picker)."""
    best, off = set(best_runs), set(hidden)

    def attrs(column: str, index: int) -> str:
        return f' data-col="{index}" data-key="{escape(column)}"' + (' class="off"' if column in off else "")

    head = "".join(f'<th data-kind="{kind}"{attrs(column, i)}>{escape(header)}</th>'
                   for i, (column, header, kind) in enumerate(columns))
    body = []
    for _, row in frame.iterrows():
        cells = []
        for index, (column, _, kind) in enumerate(columns):
            value = row.get(column)
            text = escape(_fmt(value, kind, column))
            sort = plots.num(value)
            numeric = kind not in ("text", "status") and not (kind == "figure" and BY_KEY[column].unit in TEXT_UNITS)
            attr = f' data-sort="{sort!r}"' if sort is not None and numeric else ""
            if kind == "status":
                color = STATUS_COLORS.get(str(value), "#444")
                text = f'<span class="badge" style="background:{color}">{text}</span>'
            cells.append(f"<td{attr}{attrs(column, index)}>{text}</td>")
        klass = ' class="best"' if row.get("run_dir") in best else ""
        body.append(f"<tr{klass}>{''.join(cells)}</tr>")
    return (f'<table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def status_table(frame: pd.DataFrame) -> str:
    def when(value: Any) -> str:
        number = plots.num(value)
        if number is None:
            return ""
        return _dt.datetime.fromtimestamp(number, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

    view = frame.assign(updated=frame["status_time"].map(when))
    columns = [("series", "sweep", "text"), ("run", "run", "text"), ("label", "layout", "text"),
               ("status", "status", "status"), ("reason", "reason", "text"), ("updated", "status updated", "text")]
    if frame["series"].nunique(dropna=False) <= 1:
        columns = columns[1:]
    if "standin_of" in frame and frame["standin_of"].notna().any():
        view = view.assign(standin=frame.apply(standin_note, axis=1))
        columns.append(("standin", "CPU stand-in: not executed", "text"))
    return _table(view, columns, "status-table")


def standin_note(row: pd.Series) -> str:
    """`of <recipe>: A; B` with each not-executed item's head (its reason stays in summary.csv)."""
    if not isinstance(row.get("standin_of"), str):
        return ""
    items = [item.split(" (")[0] for item in str(row.get("not_executed") or "").split(" | ") if item]
    return f"of {row['standin_of']}: {'; '.join(items)}"


def compare_verdicts(frame: pd.DataFrame) -> List[str]:
    """For every layout run in several sweeps: each pair of its sweeps' runs, through report.verdict."""
    done = frame[frame["status"] == COMPLETED]
    lines = []
    for label, group in done.groupby("label", sort=True):
        rows = [row.to_dict() for _, row in group.iterrows() if comparable(row)]
        for i in range(len(rows)):
            for j in range(i + 1, len(rows)):
                judged = verdict(rows[i], rows[j], f"{label} in {rows[i]['series']}", f"{label} in {rows[j]['series']}")
                lines.append(sentence(judged.text))
    return lines


def verdict_list(lines: Sequence[str]) -> str:
    return "<ul class=\"verdicts\">" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>" if lines else ""


def repeats_table(frame: pd.DataFrame) -> str:
    """Each repeat of a repeated point on its own row (the charts pool them)."""
    if "repeats" not in frame or not (frame["repeats"].fillna(1) > 1).any():
        return ""
    view = frame[frame["repeats"].fillna(1) > 1].sort_values(["series", "point", "repeat"])
    view = view.assign(host_mark=host_marks(view))
    columns = [("label", "layout", "text"), ("run", "run", "text"), ("repeat", "repeat", "int"),
               ("status", "status", "status"), ("tokens_per_s", "tokens/s", "rate"),
               ("tokens_per_s_ci_low", "95% CI low", "rate"), ("tokens_per_s_ci_high", "95% CI high", "rate"),
               ("step_time_s", "step (median)", "time"), ("step_time_cv", "step CV", "pct"),
               ("host_mark", "host", "text")]
    return (f"<h2>{TITLES['repeats']}</h2>" + _caption("Repeats ran interleaved (A B C, C B A, ...) so that slow "
                                                        "drift of the host falls on every layout alike.")
            + f'<div class="scroll">{_table(view, columns, "repeats-table")}</div>')


def compare_table(frame: pd.DataFrame) -> str:
    """Layouts down, sweeps across: tokens/s per device and MFU of each sweep's run of that layout."""
    done = frame[frame["status"] == COMPLETED]
    if done.empty:
        return "<p>No completed runs to compare.</p>"
    pivot = done.pivot_table(index="label", columns="series", values=["tokens_per_s_per_device", "mfu"],
                             aggfunc="max")
    sweeps = sorted(done["series"].astype(str).unique())
    head = "<th>layout</th>" + "".join(f"<th>{escape(s)} tokens/s/device</th><th>{escape(s)} MFU</th>" for s in sweeps)
    rows = []
    for label in pivot.index:
        cells = [f"<td>{escape(str(label))}</td>"]
        for s in sweeps:
            for metric, kind in (("tokens_per_s_per_device", "rate"), ("mfu", "pct")):
                value = pivot[(metric, s)][label] if (metric, s) in pivot.columns else None
                cells.append(f'<td data-sort="{plots.num(value)!r}">{escape(_fmt(value, kind))}</td>')
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<table id="compare-table" class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _caption(text: str) -> str:
    return f'<p class="caption">{escape(text)}</p>' if text else ""


def peak_caption(frame: pd.DataFrame) -> str:
    """Warn when MFU divides by peaks measured run by run (CPU), which makes runs' MFU hard to compare."""
    done = frame[frame["status"] == COMPLETED]
    measured = done[done["peak_flops_source"].astype(str).str.startswith("measured")]
    peaks = [p for p in (plots.num(v) for v in measured["peak_flop_per_s_per_device"]) if p]
    if len(peaks) < 2 or max(peaks) < 1.1 * min(peaks):
        return ""
    return (f"MFU here divides by a peak FLOP/s measured in each run (a matmul micro-benchmark run beside that "
            f"run's ranks): {min(peaks) / 1e9:.3g} to {max(peaks) / 1e9:.3g} GFLOP/s per device across these runs, "
            f"so compare layouts by tokens/s; MFU ranks them only within one measured peak.")


def column_picker(columns: Sequence[Tuple[str, str, str]], hidden: Sequence[str], table_id: str) -> str:
    """A checkbox per column of the table (ticked: shown); plain HTML, the page's script does the rest."""
    off = set(hidden)
    boxes = "".join(f'<label><input type="checkbox" data-col="{i}"{"" if key in off else " checked"}> '
                    f"{escape(header)}</label>" for i, (key, header, _) in enumerate(columns))
    return (f'<details class="picker" data-table="{table_id}"><summary>Columns: {len(columns) - len(off)} shown, '
            f"{len(off)} more to pick</summary><div class=\"boxes\">{boxes}</div></details>")


def headline_block(item: Headline, several: bool) -> str:
    sweep = f'<span class="sweep">{escape(item.sweep)}</span> ' if several else ""
    klass = "headline" if item.best is not None else "headline none"
    return (f'<div class="{klass}"><p class="answer">{sweep}{escape(item.text)}</p>'
            f'<p class="detail">{escape(item.detail)}</p></div>')


def _footer(frame: pd.DataFrame, roots: Sequence[Path]) -> str:
    conventions = sorted({str(c) for c in frame.get("flop_convention", pd.Series(dtype=object)).dropna()})
    sources = sorted({str(c) for c in frame.get("peak_flops_source", pd.Series(dtype=object)).dropna()})
    items = [f"FLOP convention: {', '.join(conventions) or 'n/a'}.",
             f"Peak FLOP/s: {', '.join(sources) or 'n/a'}.",
             "Memory measured: per rank, parameters + gradients + optimizer states + saved activations (the "
             "largest rank), and the device allocator's peak where there is one (CUDA).",
             "Read from each run directory's status.json, config.json, plan.json, metrics.json and "
             "errors/rank*.json / rank*.fatal only.",
             "Sweep directories: " + ", ".join(str(r) for r in roots) + "."]
    return "<footer>" + "".join(f"<p>{escape(item)}</p>" for item in items) + "</footer>"


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666;font-size:13px;margin:0 0 16px}
.headline{background:#eef7ee;border-left:5px solid #59a14f;padding:10px 16px;margin:10px 0}
.headline.none{background:#fdf3e7;border-left-color:#ef6c00}
.headline .answer{font-size:19px;font-weight:600;margin:4px 0}.headline .detail{margin:4px 0;color:#444}
.sweep{background:#555;color:#fff;border-radius:3px;padding:1px 6px;font-size:13px;margin-right:6px}
.caption{color:#666;font-size:13px;margin:4px 0}
.caption.noise{color:#222;background:#fdf3e7;border-left:5px solid #ef6c00;padding:10px 16px;margin:10px 0;
font-size:17px;font-weight:600}
.off{display:none}.picker{font-size:13px;margin:6px 0}.picker summary{cursor:pointer;color:#1565c0}
.picker .boxes{columns:4 220px;padding:6px 0}.picker label{display:block;white-space:nowrap}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f4f4f4;cursor:pointer;position:sticky;top:0}td:nth-child(-n+3){text-align:left}
#status-table td{white-space:normal;text-align:left;max-width:640px}
tr.best td{background:#eef7ee;font-weight:600}
.badge{color:#fff;border-radius:3px;padding:1px 5px;font-size:11px}
.scroll{overflow-x:auto}
.scroll.full{width:calc(100vw - 32px);margin-left:calc(50% - 50vw + 16px)}div.plot{margin:4px 0 12px}
footer{color:#666;font-size:12px;margin-top:30px;border-top:1px solid #ddd}
"""

# Click a header to sort by it (numbers by their data-sort value); no libraries.
SCRIPT = """
document.querySelectorAll('details.picker').forEach(function (picker) {
  var table = document.getElementById(picker.dataset.table);
  picker.querySelectorAll('input[data-col]').forEach(function (box) {
    box.addEventListener('change', function () {
      table.querySelectorAll('[data-col="' + box.dataset.col + '"]').forEach(function (cell) {
        cell.classList.toggle('off', !box.checked); });
    });
  });
});
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var up = th.dataset.dir !== 'asc'; th.dataset.dir = up ? 'asc' : 'desc';
      function key(row) { var td = row.cells[col]; var s = td.dataset.sort;
        return s !== undefined && s !== 'None' ? parseFloat(s) : td.textContent; }
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
        return up ? c : -c; });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def render_html(frame: pd.DataFrame, roots: Sequence[Path], generated: Optional[_dt.datetime] = None) -> str:
    """The whole report as one HTML string."""
    generated = generated or _dt.datetime.now(tz=_dt.timezone.utc)
    sweeps = sorted(frame["series"].astype(str).unique()) if not frame.empty else []
    several = len(sweeps) > 1
    title = "Benchmark report: " + (", ".join(sweeps) if sweeps else "no runs")
    items = headlines(frame)
    parts = [f"<h1>{escape(title)}</h1>",
             f'<p class="meta">{len(frame)} runs · generated {generated:%Y-%m-%d %H:%M UTC} · '
             f'{escape(", ".join(str(r) for r in roots))}</p>',
             "<h2>Which layout should I use?</h2>",
             *(headline_block(item, several) for item in items)]
    if not frame.empty:
        view = ordered(pool_repeats(frame))
        view = view.assign(host_mark=host_marks(view))
        labels = chart_labels(view)
        best_runs = {item.best["run_dir"] for item in items if item.best is not None}
        memory, caption = plots.memory_figure(view, labels)
        noise = noise_caption(view, best_runs)
        parts += [f'<p class="caption noise">{escape(noise)}</p>' if noise else "", _caption(disturbed_caption(view)),
                  f"<h2>{TITLES['throughput']}</h2>",
                  plots.chart(plots.throughput_figure(view, labels, best_runs), "chart-throughput"),
                  f"<h2>{TITLES['mfu']}</h2>", _caption(peak_caption(view)),
                  plots.chart(plots.mfu_figure(view, labels), "chart-mfu"),
                  f"<h2>{TITLES['memory']}</h2>", _caption(caption), plots.chart(memory, "chart-memory"),
                  f"<h2>{TITLES['step_time_parts']}</h2>",
                  plots.chart(plots.step_time_parts_figure(view, labels), "chart-step-time-parts"),
                  f"<h2>{TITLES['step_times']}</h2>",
                  plots.chart(plots.step_time_figure(view[view["status"] == COMPLETED], labels), "chart-step-times")]
        if several:
            parts += [f"<h2>{TITLES['compare']}</h2>", verdict_list(compare_verdicts(view)),
                      f'<div class="scroll">{compare_table(view)}</div>']
        parts.append(repeats_table(frame))
        view = view.assign(sharding=sharding_column(row for _, row in view.iterrows()))
        columns = result_columns(view, several)
        hidden = hidden_columns(columns)
        parts += [f"<h2>{TITLES['status']}</h2>", f'<div class="scroll">{status_table(view)}</div>',
                  f"<h2>{TITLES['results']}</h2>",
                  '<p class="caption">Click a column header to sort; pick more columns below. Every field: '
                  'summary.csv / summary.parquet.</p>', column_picker(columns, hidden, "results-table"),
                  f'<div class="scroll full">{_table(view, columns, "results-table", best_runs, hidden)}</div>']
    parts.append(_footer(frame, roots))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{STYLE}</style><script src=\"{plots.PLOTLY_JS}\"></script></head><body>{''.join(parts)}<script>{SCRIPT}</script></body></html>\n")


def write_html(frame: pd.DataFrame, roots: Sequence[Path], path: Path) -> Path:
    path = Path(path)
    plots.write_plotly_js(path.parent)
    return write_text(path, render_html(frame, roots))
