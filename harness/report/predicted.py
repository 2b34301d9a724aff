"""The plan's prediction for one run (memory per rank, MFU, fit), read tolerantly from plan.json / metrics.json."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional

GIB = 2**30

# Names a field may have in a plan record. The planner's `MemoryBreakdown` splits the optimizer into
# master / moments / fp32 gradient copy; the runtime measures them as one `optimizer_bytes`.
_ALIASES: Dict[str, tuple] = {
    "param_bytes": ("param_bytes", "params_bytes", "parameter_bytes"),
    "grad_bytes": ("grad_bytes", "grads_bytes", "gradient_bytes"),
    "optimizer_bytes": ("optimizer_bytes", "optimizer_state_bytes", "optim_bytes"),
    "activation_bytes": ("activation_bytes", "activations_bytes"),
    "total_bytes": ("total_bytes", "device_bytes", "total_device_bytes", "memory_bytes", "peak_bytes"),
    "host_bytes": ("host_bytes",),
    "device_memory_bytes": ("device_memory_bytes", "memory_per_accelerator_bytes"),
    "mfu": ("mfu", "predicted_mfu"),
    "hfu": ("hfu", "predicted_hfu"),
    "step_time_s": ("step_time_s", "predicted_step_time_s"),
    "tokens_per_s": ("tokens_per_s", "predicted_tokens_per_s"),
    "fits": ("fits",),
    "oom_reason": ("oom_reason",),
}
_OPTIMIZER_PARTS = ("master_bytes", "moment_bytes", "optimizer_grad_bytes")
# Sub-records a prediction may be nested in.
_NESTS = ("predicted", "prediction", "memory", "memory_per_rank", "breakdown")


def _candidates(record: Optional[Mapping[str, Any]], depth: int = 0) -> List[Mapping[str, Any]]:
    """The record and the prediction-like dicts nested in it (breadth first, two levels)."""
    if not isinstance(record, Mapping):
        return []
    found: List[Mapping[str, Any]] = []
    if depth < 3:
        for nest in _NESTS:
            found.extend(_candidates(record.get(nest), depth + 1))
    return found + [record]


def _lookup(records: Iterable[Mapping[str, Any]], field: str) -> Any:
    names = _ALIASES[field]
    for record in records:
        for name in names:
            if record.get(name) is not None:
                return record[name]
            gib = name.replace("_bytes", "_gib")
            if gib != name and record.get(gib) is not None:
                return float(record[gib]) * GIB
    return None


def prediction(plan: Optional[Mapping[str, Any]], metrics: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Predicted figures of a run, every key present (None where the plan does not say).

    plan.json is read first (it exists for pruned runs too), then the copy metrics.json carries.
    """
    records = [*_candidates(plan), *_candidates((metrics or {}).get("predicted"))]
    out = {field: _lookup(records, field) for field in _ALIASES}
    if out["optimizer_bytes"] is None:
        parts = [next((r[p] for r in records if r.get(p) is not None), None) for p in _OPTIMIZER_PARTS]
        if any(part is not None for part in parts):
            out["optimizer_bytes"] = sum(part or 0 for part in parts)
    components = [out[k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes")]
    out["state_activation_bytes"] = sum(components) if all(c is not None for c in components) else None
    if out["total_bytes"] is None:
        out["total_bytes"] = out["state_activation_bytes"]
    for key in ("fits",):
        if out[key] is not None:
            out[key] = bool(out[key])
    return out


def plan_messages(plan: Optional[Mapping[str, Any]]) -> List[str]:
    """The plan's errors and warnings, for the status table."""
    if not isinstance(plan, Mapping):
        return []
    return [str(m) for key in ("errors", "warnings") for m in (plan.get(key) or [])]
