"""Short human names for runs, built from the layout's values (never parsed back)."""

from __future__ import annotations

from harness.config.schema import RunConfig


def run_label(run: RunConfig) -> str:
    """e.g. `deepspeed dp2 z2 mb2x1 s64 bf16`: the engine, every degree above 1, and the batch shape."""
    layout = run.layout
    parts = [run.engine.name]
    for axis in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep"):
        degree = getattr(layout, axis)
        if degree > 1:
            parts.append(f"{'dp' if axis == 'dp_shard' else 'rep' if axis == 'dp_replicate' else axis}{degree}")
    parts.append(f"z{layout.zero_stage}")
    if layout.pp > 1:
        parts.append(layout.pp_schedule)
    for kind, target in (("opt", layout.offload_optimizer), ("param", layout.offload_params)):
        if target != "none":
            parts.append(f"{kind}->{target}")
    parts.append(f"mb{layout.micro_batch}x{layout.grad_accum}")
    parts.append(f"s{layout.seq_len}")
    if layout.activation_checkpointing != "none":
        parts.append(f"ckpt-{layout.activation_checkpointing}")
    parts.append(layout.precision)
    return " ".join(parts)
