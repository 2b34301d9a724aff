"""The plan's prediction for one run (memory per rank, MFU, fit), from plan.json and metrics.json."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from harness.rundir import Predicted, RunResult

GIB = 2**30

# plan.json files written before the `predicted` section carried time kept it at the top level (the
# fields of `Plan.to_dict()`): top-level key -> Predicted field. The only other spelling ever written.
LEGACY_PLAN_KEYS: Dict[str, str] = {"predicted_mfu": "mfu", "predicted_hfu": "hfu", "tokens_per_s": "tokens_per_s"}


def _present(record: Mapping[str, Any]) -> Dict[str, Any]:
    return {key: value for key, value in record.items() if value is not None}


def prediction(plan: Optional[Mapping[str, Any]], metrics: Optional[RunResult]) -> Predicted:
    """Predicted figures of a run: plan.json's `predicted` section (it exists for pruned runs too) over
    the copy metrics.json carries, over older plan.json files' top-level keys. `total_bytes` falls back to
    the four state and activation terms where a plan did not give the allowance."""
    plan = plan or {}
    merged = {field: plan[key] for key, field in LEGACY_PLAN_KEYS.items() if plan.get(key) is not None}
    if metrics is not None:
        merged.update(_present(metrics.predicted.to_dict()))
    section = plan.get("predicted")
    merged.update(_present(section if isinstance(section, Mapping) else {}))
    predicted = Predicted.from_dict(merged)
    if predicted.total_bytes is None:
        predicted.total_bytes = predicted.state_activation_bytes
    return predicted


def plan_messages(plan: Optional[Mapping[str, Any]]) -> List[str]:
    """The plan's errors and warnings, for the status table."""
    if not isinstance(plan, Mapping):
        return []
    return [str(m) for key in ("errors", "warnings") for m in (plan.get(key) or [])]
