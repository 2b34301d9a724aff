"""One vocabulary of figures: each key (summary.csv, metrics.json, W&B) with its header, unit, group and format.

The console tables, the step line, the report's headline, table and plot axes, and the W&B summary all name
and format a figure through this table, so one figure reads the same everywhere. Units by one rule each:
time in ms below 1 s and in s above; memory in binary units, MiB below 1 GiB and GiB above (never decimal
kB/MB); throughput in tokens/s with thousands separators; utilisations (MFU, HFU) as fractions shown in %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

MIB = 1024**2
GIB = 1024**3

# Groups, in the order a table shows them: what ran, its layout, what was measured, what the plan predicted,
# and the rest (provenance, tracking, statistics' details).
RUN, LAYOUT, MEASURED, PREDICTED, OTHER = "run", "layout", "measured", "predicted", "other"
GROUPS = (RUN, LAYOUT, MEASURED, PREDICTED, OTHER)


def _number(value: Any) -> Optional[float]:
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def memory_unit(largest_bytes: float) -> Tuple[str, int]:
    """(unit, bytes per unit) for values whose largest is `largest_bytes`: GiB from 1 GiB up, else MiB.
    Binary units (IEC 80000-13), as the CUDA allocator and `nvidia-smi` count device memory."""
    return ("GiB", GIB) if abs(largest_bytes) >= GIB else ("MiB", MIB)


def format_bytes(value: Any) -> str:
    """One value with its own unit, e.g. `1.50 GiB`, `812.3 MiB`; `-` when unknown."""
    number = _number(value)
    if number is None:
        return "-"
    unit, scale = memory_unit(number)
    return f"{number / scale:,.2f} {unit}" if unit == "GiB" else f"{number / scale:,.1f} {unit}"


def format_gib(value: Any) -> str:
    """A figure stored in GiB (the `*_gib` columns), shown by the bytes rule."""
    number = _number(value)
    return "-" if number is None else format_bytes(number * GIB)


def time_unit(largest_s: float) -> Tuple[str, float]:
    """(unit, seconds per unit): ms below 1 s, s from 1 s up: a step of 31.4 ms, a step of 4.02 s."""
    return ("s", 1.0) if abs(largest_s) >= 1 else ("ms", 1e-3)


def format_seconds(value: Any) -> str:
    """`31.4 ms`, `4.02 s`, `1,234 s`; `-` when unknown."""
    number = _number(value)
    if number is None:
        return "-"
    unit, scale = time_unit(number)
    scaled = number / scale
    return f"{scaled:,.0f} {unit}" if abs(scaled) >= 1000 else f"{scaled:.3g} {unit}"


def _numeric(spec: str) -> Callable[[Any], str]:
    """A formatter of numbers by a format spec; `-` for a missing or non-numeric value."""

    def formatted(value: Any) -> str:
        number = _number(value)
        return "-" if number is None else spec.format(number)

    return formatted


format_rate = _numeric("{:,.0f}")  # tokens/s with thousands separators
format_count = _numeric("{:,.0f}")
format_percent = _numeric("{:.1%}")  # a fraction (0.284) as a percentage (28.4%)
format_ratio = _numeric("{:.2f}×")
format_float = _numeric("{:.4g}")


def ci_words(row: Mapping[str, Any]) -> str:
    """"95% CI", or the coverage a run's interval really has (step_time_ci_level: two timed steps give 50%)."""
    level = row.get("step_time_ci_level")
    try:
        level = float(level)
    except (TypeError, ValueError):
        return "95% CI"
    return "95% CI" if math.isnan(level) else f"{level:.0%} CI"


def format_band(value: Any) -> str:
    """A prediction band's half-width (a fraction, 0.09) as `±9%`; `-` when there is none."""
    number = _number(value)
    return "-" if number is None else f"±{number:.0%}"


def format_with_band(value: Any, half_width: Any, source: Any = "calibrated", unit: str = "",
                     marked: bool = False) -> str:
    """A predicted throughput with its band: `48,700 (±9%)`, with `unit` `48,700 tokens/s (±9%)`; `(±63%,
    uncalibrated)` where the band is not its engine and regime's own (harness.plan.uncertainty.band), `(±63%*)`
    when `marked` (a narrow table whose note says what the star means); the bare figure where it has no band."""
    shown = format_rate(value)
    if shown == "-":
        return shown
    shown += f" {unit}" if unit else ""
    if _number(half_width) is None:
        return shown
    if source == "calibrated":
        return f"{shown} ({format_band(half_width)})"
    return f"{shown} ({format_band(half_width)}*)" if marked else f"{shown} ({format_band(half_width)}, {source})"


def format_text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return str(value)


def format_host(value: Any) -> str:
    """runtime.host_state's verdict: DISTURBED or quiet."""
    return "DISTURBED" if value is True else "quiet" if value is False else "-"


# unit -> formatter; the unit is what the header's figure is counted in.
FORMATS: Dict[str, Callable[[Any], str]] = {
    "s": format_seconds, "bytes": format_bytes, "GiB": format_gib, "tokens/s": format_rate, "%": format_percent,
    "ratio": format_ratio, "count": format_count, "number": format_float, "TFLOP/s": format_float,
    "FLOP/s": format_float, "text": format_text, "host": format_host, "band": format_band,
}


@dataclass(frozen=True)
class Figure:
    key: str  # summary.csv column, metrics.json field and W&B key
    header: str  # what every table calls it
    unit: str  # a key of FORMATS
    group: str  # one of GROUPS
    shown: bool = False  # in the report's table before any column is picked

    def format(self, value: Any) -> str:
        return FORMATS[self.unit](value)


def _figures(group: str, rows: Sequence[tuple]) -> List[Figure]:
    return [Figure(key, header, unit, group, *rest) for key, header, unit, *rest in rows]


FIGURES: Tuple[Figure, ...] = tuple([
    *_figures(RUN, (
        ("label", "layout", "text", True), ("status", "status", "text", True), ("series", "sweep", "text"),
        ("run", "run", "text"), ("sweep", "sweep name", "text"), ("reason", "reason", "text"),
        ("status_time", "status updated", "number"), ("engine", "engine", "text"), ("model", "model", "text"),
        ("cluster", "cluster", "text"), ("accelerator", "accelerator", "text"), ("nodes", "nodes", "count"),
        ("world_size", "devices", "count", True), ("layout", "layout preset", "text"),
        ("sharding", "sharding", "text", True),
    )),
    *_figures(LAYOUT, (
        ("dp_replicate", "dp replicate", "count"), ("dp_shard", "dp shard", "count", True),
        ("tp", "tp", "count", True), ("pp", "pp", "count", True), ("cp", "cp", "count"), ("ep", "ep", "count"),
        ("zero_stage", "zero", "count", True), ("micro_batch", "micro-batch", "count", True),
        ("grad_accum", "accumulation", "count", True), ("seq_len", "sequence", "count", True),
        ("activation_checkpointing", "checkpointing", "text"), ("precision", "precision", "text"),
        ("offload_optimizer", "optimizer offload", "text"), ("offload_params", "param offload", "text"),
        ("pp_schedule", "pp schedule", "text"), ("pp_virtual_stages", "pp virtual stages", "count"),
        ("pp_stage_layers", "pp split (layers*stages)", "text"), ("fsdp_version", "FSDP version", "count"),
        ("compile", "compiled", "text"),
    )),
    *_figures(MEASURED, (
        ("tokens_per_s", "tokens/s", "tokens/s", True), ("tokens_per_s_ci_low", "tokens/s CI low", "tokens/s"),
        ("tokens_per_s_ci_high", "tokens/s CI high", "tokens/s"),
        ("tokens_per_s_per_device", "tokens/s/device", "tokens/s", True),
        ("tokens_per_s_per_device_ci_low", "tokens/s/device CI low", "tokens/s"),
        ("tokens_per_s_per_device_ci_high", "tokens/s/device CI high", "tokens/s"),
        ("step_time_s", "step time", "s", True), ("step_time_s_ci_low", "step time CI low", "s"),
        ("step_time_s_ci_high", "step time CI high", "s"), ("step_time_min_s", "step time min", "s"),
        ("step_time_max_s", "step time max", "s"), ("step_time_iqr_s", "step time IQR", "s"),
        ("step_time_cv", "step time CV", "%"), ("step_time_ci_level", "CI coverage", "%"),
        ("step_outliers", "outlying steps", "count"), ("timed_steps", "timed steps", "count"),
        ("warmup_steps_run", "warm-up steps", "count"), ("host_disturbed", "host", "host", True),
        ("mfu", "MFU", "%", True), ("mfu_ci_low", "MFU CI low", "%"), ("mfu_ci_high", "MFU CI high", "%"),
        ("hfu", "HFU", "%"), ("hfu_ci_low", "HFU CI low", "%"), ("hfu_ci_high", "HFU CI high", "%"),
        ("tflop_per_s_per_device", "TFLOP/s/device", "TFLOP/s"),
        ("tflop_per_s_per_device_ci_low", "TFLOP/s/device CI low", "TFLOP/s"),
        ("tflop_per_s_per_device_ci_high", "TFLOP/s/device CI high", "TFLOP/s"),
        # Like with like: the largest rank's params + grads + optimizer states + saved activations.
        ("mem_state_activation_gib", "memory", "GiB", True),
        ("mem_allocated_peak_gib", "allocator peak", "GiB"), ("mem_measured_gib", "memory measured", "GiB"),
        ("param_bytes", "params", "bytes"), ("grad_bytes", "grads", "bytes"),
        ("optimizer_bytes", "optimizer states", "bytes"), ("activation_bytes", "activations", "bytes"),
        ("host_bytes", "host memory", "bytes"), ("nvme_bytes", "NVMe swap", "bytes"),
        ("peak_allocated_bytes", "allocator peak bytes", "bytes"),
        ("memory_per_rank_bytes", "memory per rank", "bytes"), ("loss_first", "loss first", "number"),
        ("loss_final", "loss", "number", True), ("first_step_s", "first step", "s"),
        ("compile_s", "compile time", "s"), ("loss", "loss (step)", "number"),
        ("step_times_s", "step times", "text"),
        # W&B live-chart keys: the step's own figures while running, the run's medians in its summary.
        ("memory_gib", "memory (chart)", "GiB"), ("step", "step", "count"),
    )),
    *_figures(PREDICTED, (
        ("tokens_per_s_predicted", "tokens/s pred", "tokens/s"), ("step_time_predicted_s", "step time pred", "s"),
        ("step_time_ratio", "step time meas/pred", "ratio"), ("mfu_predicted", "MFU pred", "%"),
        ("mfu_ratio", "MFU meas/pred", "ratio"),
        ("mem_predicted_state_activation_gib", "memory pred", "GiB"),
        ("mem_ratio", "memory meas/pred", "ratio"), ("mem_predicted_gib", "memory pred total", "GiB"),
        ("mem_peak_ratio", "allocator peak/pred total", "ratio"), ("device_memory_gib", "device memory", "GiB"),
        ("fits_predicted", "fits pred", "text"), ("fits", "fits", "text"),
        ("tflop_per_s_per_device_predicted", "TFLOP/s/device pred", "TFLOP/s"),
        ("pred_param_bytes", "params pred", "bytes"), ("pred_grad_bytes", "grads pred", "bytes"),
        ("pred_optimizer_bytes", "optimizer states pred", "bytes"),
        ("pred_activation_bytes", "activations pred", "bytes"),
        ("pred_time_compute_s", "compute pred", "s"), ("pred_time_exposed_comm_s", "exposed comm pred", "s"),
        ("pred_time_bubble_s", "bubble pred", "s"), ("pred_time_optimizer_s", "optimizer step pred", "s"),
        ("pred_time_offload_s", "offload pred", "s"),
        ("pred_total_bytes", "memory pred total bytes", "bytes"), ("hfu_predicted", "HFU pred", "%"),
        # the band of the predicted tokens/s (harness.plan.uncertainty) and whether the measurement fell in it
        ("tokens_per_s_band", "tokens/s pred band", "band"),
        ("tokens_per_s_predicted_low", "tokens/s pred band low", "tokens/s"),
        ("tokens_per_s_predicted_high", "tokens/s pred band high", "tokens/s"), ("band_regime", "band regime", "text"),
        ("band_source", "band source", "text"), ("band_rows", "band rows", "count"),
        ("tokens_per_s_in_band", "measured vs band", "text"),
    )),
    *_figures(OTHER, (
        ("repeats", "repeats", "count"), ("repeat", "repeat", "count"), ("point", "point", "text"),
        ("host_disturbances", "host disturbances", "text"), ("tokens_per_step", "tokens/step", "count"),
        ("flops_per_token", "FLOPs/token", "number"), ("flop_convention", "FLOP convention", "text"),
        ("peak_flop_per_s_per_device", "peak FLOP/s/device", "FLOP/s"),
        ("peak_flops_source", "peak FLOP/s source", "text"), ("wandb_project", "W&B project", "text"),
        ("wandb_entity", "W&B entity", "text"), ("wandb_mode", "W&B mode", "text"),
        ("wandb_run_id", "W&B run", "text"), ("wandb_group", "W&B group", "text"),
        ("standin_of", "stand-in of", "text"), ("not_executed", "not executed", "text"),
        ("run_dir", "run folder", "text"), ("source", "sweep folder", "text"),
    )),
])
BY_KEY: Dict[str, Figure] = {figure.key: figure for figure in FIGURES}


def figure(key: str) -> Figure:
    """The figure named `key`; a key outside the vocabulary is a KeyError naming it."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"{key!r} is not in harness.rundir.vocabulary.FIGURES") from None


def header(key: str) -> str:
    return figure(key).header


def format_value(key: str, value: Any) -> str:
    return figure(key).format(value)


def unknown_keys(keys: Iterable[str]) -> List[str]:
    """The keys that are not in the vocabulary, in order."""
    return [key for key in keys if key not in BY_KEY]


def ordered_keys(keys: Iterable[str]) -> List[str]:
    """`keys` in table order: by group (run, layout, measured, predicted, other), then as FIGURES lists them."""
    rank = {figure.key: index for index, figure in enumerate(FIGURES)}
    return sorted(keys, key=lambda key: (GROUPS.index(figure(key).group), rank[key]))


# FSDP1's strategies (torch.distributed.fsdp.ShardingStrategy) by ZeRO stage: 3 shards params, grads and
# optimizer states; 2 keeps the params gathered between forward and backward; HYBRID_* shard within a
# replica group and replicate across groups (layout.dp_replicate > 1).
# FSDP has no optimizer-only level: a zero_stage=1 point (refused, pruned) keeps its number, not a strategy it
# never ran under
_FSDP_STRATEGIES = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP", 0: "NO_SHARD"}
_FSDP_HYBRID = {3: "HYBRID_SHARD", 2: "_HYBRID_SHARD_ZERO2"}


def sharding_words(engine: Any, zero_stage: Any, dp_replicate: Any = 1) -> str:
    """How a layout shards its states, in its engine's own words: DeepSpeed `ZeRO-2`; FSDP `SHARD_GRAD_OP`,
    `FULL_SHARD`, `HYBRID_SHARD`; nd (FSDP2 `fully_shard`) `FSDP2 reshard` (reshard_after_forward=True, stage
    3), `FSDP2 keep` (stage 2), `HSDP` over replicas, `replicate` (stage 0); Megatron `distributed optimizer`
    (stage 1) or `DDP`. `-` where the engine or stage is unknown."""
    stage, replicas = _number(zero_stage), _number(dp_replicate) or 1
    if stage is None or not isinstance(engine, str) or not engine:
        return "-"
    stage = int(stage)
    if engine == "deepspeed":
        return f"ZeRO-{stage}"
    if engine == "fsdp":
        table = _FSDP_HYBRID if replicas > 1 and stage >= 1 else _FSDP_STRATEGIES
        return table.get(stage, f"zero_stage {stage}")
    if engine == "nd":
        if stage == 1:  # refused by nd, as by FSDP
            return f"zero_stage {stage}"
        if stage < 2:
            return "replicate"
        words = "FSDP2 reshard" if stage == 3 else "FSDP2 keep"
        return f"HSDP ({words})" if replicas > 1 else words
    if engine.startswith("megatron"):
        return "distributed optimizer" if stage >= 1 else "DDP"
    return f"zero_stage {stage}"


def sharding_column(rows: Iterable[Mapping[str, Any]]) -> List[str]:
    return [sharding_words(row.get("engine"), row.get("zero_stage"), row.get("dp_replicate")) for row in rows]
