"""One row per run directory, read only from its structured files (status, config, plan, metrics)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List

import pandas as pd

from harness.runtime.result import STATUS_FILE, read_metrics, read_status

SUMMARY_CSV = "summary.csv"
LAYOUT_COLUMNS = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch",
                  "grad_accum", "seq_len", "activation_checkpointing", "precision")


def run_dirs(root: Path) -> List[Path]:
    """Every run directory below `root` (a run directory is one holding a status file)."""
    return sorted(path.parent for path in Path(root).rglob(STATUS_FILE))


def _read_json(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def run_row(run_dir: Path) -> Dict[str, Any]:
    status = read_status(run_dir)
    config = _read_json(run_dir / "config.json")
    metrics = read_metrics(run_dir) or {}
    measured = metrics.get("measured", {})
    layout = config.get("layout", {})
    row: Dict[str, Any] = {
        "run": run_dir.name,
        "status": status["state"],
        "reason": status.get("reason", ""),
        "engine": config.get("engine", {}).get("name"),
        "model": config.get("model", {}).get("name"),
        "layout": layout.get("name"),
        **{column: layout.get(column) for column in LAYOUT_COLUMNS},
        "world_size": metrics.get("world_size"),
        "tokens_per_s": measured.get("tokens_per_s"),
        "tokens_per_s_per_device": measured.get("tokens_per_s_per_device"),
        "step_time_s": measured.get("step_time_s"),
        "tflops_per_device": measured.get("tflops_per_device"),
        "mfu": measured.get("mfu"),
        "hfu": measured.get("hfu"),
        "flop_convention": metrics.get("flop_convention"),
        "loss_final": measured.get("loss_final"),
        "run_dir": str(run_dir),
    }
    return row


def summary_frame(roots: Iterable[Path]) -> pd.DataFrame:
    rows = [run_row(run_dir) for root in roots for run_dir in run_dirs(root)]
    return pd.DataFrame(rows)


def write_summary(sweep_dir: Path) -> pd.DataFrame:
    """Rewrite `summary.csv` of a sweep from its run directories (atomic rename)."""
    frame = summary_frame([sweep_dir])
    target = Path(sweep_dir) / SUMMARY_CSV
    tmp = target.with_name(f".{SUMMARY_CSV}.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(target)
    return frame


def print_table(frame: pd.DataFrame, title: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    columns = ["run", "status", "engine", "layout", "world_size", "tokens_per_s", "tokens_per_s_per_device",
               "step_time_s", "tflops_per_device", "mfu", "loss_final"]
    table = Table(title=title or None)
    for column in columns:
        table.add_column(column)
    for _, row in frame.iterrows():
        table.add_row(*(_cell(row.get(column)) for column in columns))
    Console(width=200).print(table)


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_rows(rows: List[Dict[str, Any]], title: str = "") -> None:
    """Any list of uniform dicts as a terminal table (used by `harness plan`)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or None)
    columns = list(rows[0]) if rows else []
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    Console(width=240).print(table)
