"""One row per run directory, read only from its structured files (status, config, plan, metrics, errors)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import pandas as pd

from harness.config.naming import stage_layers_words
from harness.plan.peak import device_memory_gib
from harness.plan.uncertainty import versus_band
from harness.report.predicted import GIB, plan_messages, prediction
from harness.report.repeats import interval_columns
from harness.rundir import (
    CANCELLED,
    COMPLETED,
    CORRUPT,
    FAILED,
    OOM,
    PENDING,
    PRUNED,
    RUNNING,
    SUMMARY_CSV,
    SUMMARY_PARQUET,
    TIMEOUT,
    Measured,
    Predicted,
    RunFiles,
    read_run,
    run_dirs,
    write_with,
)
from harness.rundir.vocabulary import format_value, format_with_band, header, sharding_words
from harness.rundir.stats import RATE_FIGURES, StepStats, figure_intervals, step_stats

LAYOUT_COLUMNS = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch",
                  "grad_accum", "seq_len", "activation_checkpointing", "precision")
# Layout fields beyond the degrees that change what a run measures.
EXTRA_LAYOUT_COLUMNS = ("offload_optimizer", "offload_params", "pp_schedule", "pp_virtual_stages")
# Short names for the layout label, in label order; columns that are the same for every run are left out.
LABEL_AXES = (("engine", ""), ("model", ""), ("cluster", ""), ("dp_replicate", "dpr"), ("dp_shard", "dp"),
              ("tp", "tp"), ("pp", "pp"), ("pp_schedule", ""), ("pp_virtual_stages", "vpp"), ("cp", "cp"),
              ("ep", "ep"), ("zero_stage", "zero"), ("offload_optimizer", "offload_opt="),
              ("offload_params", "offload_param="), ("micro_batch", "mb"), ("grad_accum", "ga"),
              ("seq_len", "seq"), ("activation_checkpointing", "ac="), ("precision", ""),
              ("pp_stage_layers", "split="), ("fsdp_version", "FSDP"), ("compile", ""))
# Columns holding lists: kept in Parquet, left out of the CSV.
LIST_COLUMNS = ("step_times_s", "step_times_by_repeat")
# Order in which statuses are listed: what needs attention first.
STATUS_ORDER = {COMPLETED: 0, RUNNING: 1, PENDING: 2, OOM: 3, FAILED: 4, TIMEOUT: 5, CANCELLED: 6, CORRUPT: 7,
                PRUNED: 8}
# Measured scalars copied as they are.
MEASURED_COLUMNS = ("tokens_per_s", "tokens_per_s_per_device", "step_time_s", "tflop_per_s_per_device", "mfu", "hfu",
                    "peak_flop_per_s_per_device", "peak_flops_source", "param_bytes", "grad_bytes", "optimizer_bytes",
                    "activation_bytes", "loss_first", "loss_final")
PREDICTED_BYTES = ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes")


def _gib(value: Optional[float]) -> Optional[float]:
    return None if value is None else value / GIB


def _ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def status_reason(files: RunFiles) -> str:
    """The status file's reason (or the unreadable files); else the first failing rank's error; else the
    plan's errors."""
    if files.reason:
        return files.reason
    if files.state in (FAILED, OOM, TIMEOUT, CANCELLED) and files.errors:
        return files.errors[0].reason()
    if files.state == PRUNED:
        return "; ".join(plan_messages(files.plan))
    return ""


def measured_memory(measured: Optional[Measured]) -> Dict[str, Optional[float]]:
    """Per-rank memory: the largest rank's params + grads + optimizer + saved activations, and the allocator peak.

    The sum is taken rank by rank before the max, so one rank's activations are never added to another
    rank's parameters (pipeline stages differ); without per-rank records the maxima are summed.
    """
    if measured is None:
        return {"state_activation_bytes": None, "allocated_peak_bytes": None}
    per_rank = [r for r in measured.per_rank if all(r.get(p) is not None for p in PREDICTED_BYTES)]
    if per_rank:
        state_activation = max(sum(r[p] for p in PREDICTED_BYTES) for r in per_rank)
    else:
        state_activation = sum(getattr(measured, p) for p in PREDICTED_BYTES)
    return {"state_activation_bytes": state_activation, "allocated_peak_bytes": measured.peak_allocated_bytes}


def _device_memory_gib(cluster: Mapping[str, Any], predicted: Predicted) -> Optional[float]:
    """The plan's figure (config, datasheet or host share, as the planner resolved it), else the config's,
    else the datasheet's."""
    if predicted.device_memory_bytes:
        return predicted.device_memory_bytes / GIB
    if cluster.get("memory_per_accelerator_gib"):
        return float(cluster["memory_per_accelerator_gib"])
    return device_memory_gib(cluster.get("accelerator", "")) if cluster.get("accelerator") else None


def _identity_columns(files: RunFiles, layout: Mapping[str, Any], cluster: Mapping[str, Any]) -> Dict[str, Any]:
    """What the run is: sweep, names, cluster and layout (config.json first, metrics.json's copy second)."""
    config, metrics = files.config, files.metrics

    def named(section: str, fallback: Optional[str]) -> Optional[str]:
        return (config.get(section) or {}).get("name") or fallback

    world = metrics.world_size if metrics else (
        cluster.get("nodes", 1) * cluster.get("accelerators_per_node", 1) if cluster else None)
    return {
        "sweep": config.get("sweep_name") or (metrics.sweep if metrics else None),
        "run": files.run_dir.name,
        "status": files.state.value,
        "reason": status_reason(files),
        "status_time": files.status.time,
        "engine": named("engine", metrics.engine if metrics else None),
        "model": named("model", metrics.model if metrics else None),
        "cluster": cluster.get("name"),
        "accelerator": cluster.get("accelerator"),
        "nodes": cluster.get("nodes"),
        "world_size": world,
        "layout": layout.get("name"),
        **{column: layout.get(column) for column in (*LAYOUT_COLUMNS, *EXTRA_LAYOUT_COLUMNS)},
        # an uneven pipeline split in short (`2*8,3*16,2*8`), empty for the even one
        "pp_stage_layers": stage_layers_words(layout.get("pp_stage_layers") or []) or None,
        **engine_columns(config.get("engine") or {}),
    }


def engine_columns(engine: Mapping[str, Any]) -> Dict[str, Any]:
    """The engine options that change what a run measures: `fsdp_version` only where it is FSDP1 (FSDP2 is the
    default, and other engines have none: a label names the exception), `compile` as set."""
    return {"fsdp_version": 1 if engine.get("name") == "fsdp" and engine.get("fsdp_version") == 1 else None,
            "compile": engine.get("compile")}


def _measured_columns(files: RunFiles) -> Dict[str, Any]:
    """The measurement and the FLOP convention it was counted in (empty until metrics.json exists)."""
    metrics, plan = files.metrics, files.plan
    measured = metrics.measured if metrics else None
    step_times = list(measured.step_times_s) if measured else []
    return {
        "tokens_per_step": metrics.tokens_per_step if metrics else plan.get("tokens_per_step"),
        **{column: getattr(measured, column) if measured else None for column in MEASURED_COLUMNS},
        "step_time_min_s": min(step_times) if step_times else None,
        "step_time_max_s": max(step_times) if step_times else None,
        "flop_convention": metrics.flop_convention if metrics else plan.get("flop_convention"),
        "flops_per_token": metrics.flops_per_token if metrics else plan.get("flops_per_token"),
        "step_times_s": step_times or None,
        **_statistics_columns(measured),
    }


def _statistics_columns(measured: Optional[Measured]) -> Dict[str, Any]:
    """Each figure's interval and the step time's spread (from metrics.json; recomputed from the step times for
    runs measured before they were stored), warm-up, and whether the host disturbed the run."""
    if measured is None or not measured.step_times_s:
        return {**interval_columns(None, {}, {}), "warmup_steps_run": None, "host_disturbed": None,
                "host_disturbances": None}
    stats = StepStats.from_dict(measured.step_stats) or step_stats(measured.step_times_s)
    figures = {name: getattr(measured, name) for name in RATE_FIGURES}
    intervals = measured.intervals or figure_intervals(stats, figures)
    host = measured.host or {}
    return {**interval_columns(stats, {**figures, "step_time_s": measured.step_time_s}, intervals),
            "warmup_steps_run": measured.warmup_steps, "host_disturbed": host.get("disturbed"),
            "host_disturbances": "; ".join(host.get("disturbances") or []) or None}


def point_key(config: Mapping[str, Any]) -> Optional[str]:
    """What repeats of one sweep point share: their resolved config but for `bench.repeat`."""
    if not config:
        return None
    bench = {key: value for key, value in (config.get("bench") or {}).items() if key != "repeat"}
    text = json.dumps({**config, "bench": bench}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _repeat_columns(files: RunFiles) -> Dict[str, Any]:
    bench = files.config.get("bench") or {}
    return {"point": point_key(files.config), "repeat": bench.get("repeat", 0), "repeats": bench.get("repeats", 1)}


def _memory_columns(measured: Optional[Measured], predicted: Predicted, device_gib: Optional[float]) -> Dict[str, Any]:
    """Measured memory beside the prediction. Like with like: the measured sum against the predicted sum of
    the same four terms, and the allocator's peak (GPU) against the predicted device total (which includes
    the allowance)."""
    memory = measured_memory(measured)
    mem_measured = memory["allocated_peak_bytes"] or memory["state_activation_bytes"]
    return {
        "mem_state_activation_gib": _gib(memory["state_activation_bytes"]),
        "mem_allocated_peak_gib": _gib(memory["allocated_peak_bytes"]),
        "mem_measured_gib": _gib(mem_measured),
        **{f"pred_{name}": getattr(predicted, name) for name in PREDICTED_BYTES},
        "mem_predicted_state_activation_gib": _gib(predicted.state_activation_bytes),
        "mem_predicted_gib": _gib(predicted.total_bytes),
        "mem_ratio": _ratio(memory["state_activation_bytes"], predicted.state_activation_bytes),
        "mem_peak_ratio": _ratio(memory["allocated_peak_bytes"], predicted.total_bytes),
        "device_memory_gib": device_gib,
    }


def _prediction_columns(measured: Optional[Measured], predicted: Predicted) -> Dict[str, Any]:
    return {
        "fits_predicted": predicted.fits,
        "mfu_predicted": predicted.mfu,
        "mfu_ratio": _ratio(measured.mfu if measured else None, predicted.mfu),
        "step_time_predicted_s": predicted.step_time_s,
        "step_time_ratio": _ratio(measured.step_time_s if measured else None, predicted.step_time_s),
        **{f"pred_time_{part}_s": seconds for part, seconds in predicted.time_parts().items()},
        "tokens_per_s_predicted": predicted.tokens_per_s,
        "tflop_per_s_per_device_predicted": predicted.tflop_per_s_per_device,
        **_band_columns(measured, predicted),
    }


def _band_columns(measured: Optional[Measured], predicted: Predicted) -> Dict[str, Any]:
    """The band of the predicted tokens/s and where the measured tokens/s fell against it (inside, above,
    below; harness.plan.uncertainty.versus_band)."""
    band, rate = predicted.tokens_per_s_band, measured.tokens_per_s if measured else None
    return {"tokens_per_s_band": band, "band_regime": predicted.band_regime, "band_source": predicted.band_source,
            "band_rows": predicted.band_rows,
            "tokens_per_s_in_band": versus_band(predicted.tokens_per_s, rate, band)}


def _tracking_columns(files: RunFiles) -> Dict[str, Any]:
    tracking = files.config.get("tracking") or {}
    recorded = (files.metrics.tracking if files.metrics else None) or {}
    return {
        "wandb_project": tracking.get("project"),
        "wandb_entity": tracking.get("entity"),
        "wandb_mode": tracking.get("mode") if tracking.get("backend", "wandb") == "wandb" else "disabled",
        "wandb_run_id": recorded.get("wandb_run_id"),
        "wandb_group": recorded.get("wandb_group"),
    }


def _standin_columns(files: RunFiles) -> Dict[str, Any]:
    """A CPU stand-in's recipe and what it did not execute (config.json first: known before it runs)."""
    standin = files.config.get("standin") or (files.metrics.standin if files.metrics else None) or {}
    not_executed = standin.get("not_executed") or []
    return {"standin_of": standin.get("of"), "not_executed": " | ".join(not_executed) if not_executed else None}


def run_row(run_dir: Path) -> Dict[str, Any]:
    """One run as a flat record; a missing file leaves its columns empty (a partial sweep still reads) and an
    unreadable one makes the run CORRUPT, naming the file."""
    files = read_run(run_dir)
    metrics = files.metrics
    layout = {**(metrics.layout if metrics else {}), **(files.config.get("layout") or {})}
    cluster = {**(metrics.cluster if metrics else {}), **(files.config.get("cluster") or {})}
    measured = metrics.measured if metrics else None
    predicted = prediction(files.plan, metrics)
    row: Dict[str, Any] = {
        **_identity_columns(files, layout, cluster),
        **_measured_columns(files),
        **_memory_columns(measured, predicted, _device_memory_gib(cluster, predicted)),
        **_prediction_columns(measured, predicted),
        **_tracking_columns(files),
        **_standin_columns(files),
        **_repeat_columns(files),
        "run_dir": str(files.run_dir),
    }
    row["fits"] = _fits(row)
    return row


def _fits(row: Mapping[str, Any]) -> Optional[bool]:
    """Measured fit where there is a measurement; else the plan's verdict (pruned runs); else unknown."""
    if row["status"] == OOM:
        return False
    if row["status"] == COMPLETED:
        if row["mem_measured_gib"] is None or not row["device_memory_gib"]:
            return True
        return bool(row["mem_measured_gib"] <= row["device_memory_gib"])
    return row["fits_predicted"]


def layout_labels(frame: pd.DataFrame, engine_words: bool = True) -> pd.Series:
    """A short name per run from the axes that differ between the runs shown (never from folder names).
    `engine_words`: the ZeRO stage in the engine's own words (measured runs); `harness plan` keeps `zero<N>`,
    the values of the `layout.zero_stage` sweep the user typed."""
    varying = [(col, short) for col, short in LABEL_AXES
               if col in frame and frame[col].astype(str).nunique(dropna=False) > 1]
    if not varying:
        return frame["layout"].fillna(frame["run"]).astype(str) if "layout" in frame else frame["run"].astype(str)

    def label(row) -> str:
        parts = []
        for col, short in varying:
            value = row[col]
            if value is None or (isinstance(value, float) and pd.isna(value)):
                continue
            if isinstance(value, (list, tuple)):  # plan grids: the layout's list, in short
                value = stage_layers_words(value)
            if isinstance(value, float) and value.is_integer():  # an int column with gaps reads back as float
                value = int(value)
            if col == "pp_stage_layers" and not value:  # the even split
                continue
            if col == "compile":  # where it varies: compiled or eager
                parts.append("compile" if value is True or str(value) == "True" else "eager")
                continue
            words = col == "zero_stage" and engine_words
            parts.append(_sharding_label(row, value) if words else f"{short}{value}")
        return " ".join(parts)

    return frame.apply(label, axis=1)


def _sharding_label(row: Mapping[str, Any], zero_stage: Any) -> str:
    """`zero2` for DeepSpeed (its own word); the engine's own words for the others (`SHARD_GRAD_OP`,
    `FSDP2-keep`), so an FSDP or nd run is never labelled by a ZeRO stage it does not run."""
    engine = row.get("engine")
    if not isinstance(engine, str) or engine == "deepspeed":
        return f"zero{zero_stage}"
    return sharding_words(engine, zero_stage, row.get("dp_replicate")).replace(" ", "-")


def series_names(frame: pd.DataFrame) -> pd.Series:
    """What runs are compared by: the sweep name, plus the folder given when one sweep name comes from
    several of them (two invocations of one sweep; W&B groups them together)."""
    sweep = frame["sweep"].fillna("(no sweep)").astype(str)
    names = sweep.copy()
    for _, group in frame.groupby(sweep):
        sources = group["source"].unique()
        if len(sources) > 1:
            common = os.path.commonpath([str(Path(source).resolve()) for source in sources])
            for index, source in group["source"].items():
                names[index] = f"{sweep[index]} ({Path(source).resolve().relative_to(common)})"
    return names


def summary_frame(roots: Iterable[Path]) -> pd.DataFrame:
    """Every run below every root, one row each, with `label` naming its layout and `series` its sweep."""
    rows = [{**run_row(run_dir), "source": str(root)} for root in roots for run_dir in run_dirs(root)]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame.insert(1, "series", series_names(frame))
    frame.insert(3, "label", layout_labels(frame))
    return frame


def write_frame(frame: pd.DataFrame, out_dir: Path) -> Dict[str, Path]:
    """summary.csv (scalar columns) and summary.parquet (all columns), each replaced atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, parquet = out_dir / SUMMARY_CSV, out_dir / SUMMARY_PARQUET
    scalar = frame.drop(columns=[c for c in LIST_COLUMNS if c in frame])
    write_with(csv, lambda path: scalar.to_csv(path, index=False))
    write_with(parquet, lambda path: frame.to_parquet(path, index=False))
    return {"csv": csv, "parquet": parquet}


def write_summary(sweep_dir: Path) -> pd.DataFrame:
    """Rewrite `summary.csv` and `summary.parquet` of a sweep from its run directories (atomic rename)."""
    frame = summary_frame([sweep_dir])
    write_frame(frame, Path(sweep_dir))
    return frame


# Terminal columns: (key, priority): priority 0 is always shown, higher numbers are left out first on a narrow
# terminal (harness.terminal); the reason is free text, wrapped. Each column's header and format are its
# figure's (harness.rundir.vocabulary). Memory is like with like: the measured state + activation bytes of the
# largest rank, the same four terms predicted, and their ratio.
TERMINAL_COLUMNS: Sequence[tuple] = (
    ("series", 3), ("run", 0), ("label", 1), ("status", 0), ("world_size", 4), ("tokens_per_s", 1),
    ("tokens_per_s_ci_low", 2), ("tokens_per_s_ci_high", 2), ("host_disturbed", 2), ("tokens_per_s_per_device", 5),
    ("tokens_per_s_predicted", 3), ("tokens_per_s_in_band", 3),
    ("step_time_s", 2), ("step_time_predicted_s", 5), ("tflop_per_s_per_device", 5), ("mfu", 2),
    ("mfu_predicted", 4), ("mem_state_activation_gib", 2), ("mem_predicted_state_activation_gib", 4),
    ("mem_ratio", 3), ("loss_final", 3), ("reason", 0),
)
TEXT_COLUMNS = ("run", "label", "status", "series", "reason")
# How to see what a narrow terminal leaves out of the run table.
HIDDEN_HINT = "--wide shows every column; summary.csv holds every field"


# The measured cells of a sweep's final status table, in launch.status.MEASURED_KEYS' order.
MEASURED_CELLS = ("tokens_per_s", "mfu", "mem_state_activation_gib")


def measured_cells(frame: pd.DataFrame) -> Dict[str, tuple]:
    """{run name: (tokens/s, MFU, memory)} for every run of the frame; `-` where a run measured nothing."""
    return {row["run"]: tuple(format_value(column, row.get(column)) for column in MEASURED_CELLS)
            for _, row in frame.iterrows()}


def print_table(frame: pd.DataFrame, title: str = "", wide: bool = False, width: Optional[int] = None) -> List[str]:
    """The runs as a terminal table that fits (harness.terminal); returns the headers left out."""
    from harness.terminal import Column, print_table as print_fitted

    columns = [c for c in TERMINAL_COLUMNS if c[0] in frame and (c[0] != "series" or frame["series"].nunique() > 1)]
    shape = [Column(header(column), priority, "left" if column in TEXT_COLUMNS else "right", wrap=column == "reason")
             for column, priority in columns]
    rows = [[_shown(column, row) for column, _ in columns] for _, row in frame.iterrows()]
    return print_fitted(shape, rows, title, wide=wide, width=width, hint=HIDDEN_HINT)


def _shown(column: str, row: Mapping[str, Any]) -> str:
    """A cell of the run table: the predicted tokens/s with its band (`48,700 (±9%)`), every other figure by
    its format."""
    if column == "tokens_per_s_predicted" and _value(column, row.get(column)) != "-":
        band = row.get("tokens_per_s_band")
        return format_with_band(row[column], None if band is None or pd.isna(band) else band, row.get("band_source"))
    return _value(column, row.get(column))


def _value(column: str, value: Any) -> str:
    """A cell of a figure, by the vocabulary's format (text as it is: a reason is never `-`-ed)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    return format_value(column, value)


def _cell(value: Any, fmt: str = "") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if callable(fmt):
        return fmt(value)
    if fmt and fmt != "{}":
        try:
            return fmt.format(value)
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_rows(rows: List[Dict[str, Any]], title: str = "", wide: bool = False) -> List[str]:
    """Any list of uniform dicts as a terminal table, every column equally important (left out from the right)."""
    from harness.terminal import Column, print_table as print_fitted

    columns = list(rows[0]) if rows else []
    shape = [Column(column, priority=index) for index, column in enumerate(columns)]
    return print_fitted(shape, [[_cell(row.get(column)) for column in columns] for row in rows], title, wide=wide)
