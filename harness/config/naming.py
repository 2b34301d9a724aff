"""Short human names for runs, built from the layout's values (never parsed back)."""

from __future__ import annotations

import re
from typing import List, Sequence, Tuple

from harness.config.schema import RunConfig

_SLUG_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def stage_layers_words(layers: Sequence[int]) -> str:
    """An uneven pipeline split, each run of equal stages as layers*stages: [2]*8 + [3]*16 + [2]*8 is
    `2*8,3*16,2*8` ("" for the even split)."""
    runs: List[List[int]] = []
    for count in layers:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ",".join(f"{count}*{times}" if times > 1 else str(count) for count, times in runs)


def run_label(run: RunConfig) -> str:
    """e.g. `deepspeed dp2 z2 mb2x1 s64 bf16`: the engine (`fsdp1` for FSDP1), every degree above 1, the
    pipeline's schedule, virtual stages and uneven split, the batch shape, and `compile` when compiled: two
    layouts that run differently never share a label."""
    layout = run.layout
    engine = run.engine.name
    parts = [f"{getattr(engine, 'value', engine)}{'1' if run.engine.fsdp_version == 1 else ''}"]
    for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep"):
        degree = getattr(layout, axis)
        if degree > 1:
            parts.append(f"{'dp' if axis == 'dp_shard' else 'rep' if axis == 'dp_replicate' else axis}{degree}")
    parts.append(f"z{layout.zero_stage}")
    if layout.pp > 1:
        parts.append(layout.pp_schedule + (f" vpp{layout.pp_virtual_stages}" if layout.pp_virtual_stages > 1 else ""))
        if layout.pp_stage_layers:
            parts.append(f"split={stage_layers_words(layout.pp_stage_layers)}")
    for kind, target in (("opt", layout.offload_optimizer), ("param", layout.offload_params)):
        if target != "none":
            parts.append(f"{kind}->{target}")
    parts.append(f"mb{layout.micro_batch}x{layout.grad_accum}")
    parts.append(f"s{layout.seq_len}")
    if layout.activation_checkpointing != "none":
        parts.append(f"ckpt-{layout.activation_checkpointing}")
    parts.append(layout.precision)
    if run.engine.compile:
        parts.append("compile")
    return " ".join(parts)


# Short forms of the fields that most often vary across a sweep (`zero3` rather than `zero_stage3`).
SHORT_KEYS = {"zero_stage": "zero", "dp_shard": "dp", "dp_replicate": "rep", "activation_checkpointing": "ckpt-",
              "micro_batch": "mb", "grad_accum": "ga", "seq_len": "s", "pp_schedule": "", "precision": "",
              "offload_optimizer": "opt-", "offload_params": "param-", "pp_virtual_stages": "vs"}


def point_names(points: Sequence[Sequence[str]], fallback: Sequence[str]) -> List[str]:
    """`NNN-<values that differ across the grid>`, e.g. `002-deepspeed-zero3`, one per point.

    `points` are the override lists of the grid points; a grid of one point (nothing differs) takes its
    `fallback` name (engine and layout preset). Values become slugs: nothing but letters, digits, `._-`.
    """
    parsed = [dict(_key_value(text) for text in point) for point in points]
    keys = [key for key in dict.fromkeys(k for point in parsed for k in point)
            if len({point.get(key) for point in parsed}) > 1]
    names = []
    for index, (point, default) in enumerate(zip(parsed, fallback)):
        parts = [_label(key, point[key]) for key in keys if point.get(key) is not None]
        names.append(f"{index:03d}-{'-'.join(parts) if parts else default}")
    return names


def _key_value(override: str) -> Tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _label(key: str, value: str) -> str:
    leaf = key.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    prefix = "" if "." not in key else SHORT_KEYS.get(leaf, leaf)
    return _SLUG_CHARS.sub("_", f"{prefix}{value}").strip("._-") or "x"
