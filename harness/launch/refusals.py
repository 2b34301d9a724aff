"""Why a layout search admitted nothing: every refused candidate's reasons, grouped where they differ only in
their numbers, most common first, and the candidate that came closest to fitting in memory."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set

from harness.plan.planner import Plan
from harness.plan.recommend import rule as rule_of
from harness.plan.units import format_bytes


@dataclass
class Refusals:
    """Reasons counted per rule (a reason with its numbers blanked), the first wording of each kept as its
    example; a reason shared by every candidate is the one that blocks them all."""

    candidates: int = 0
    counts: Counter = field(default_factory=Counter)
    alone: Counter = field(default_factory=Counter)  # rules that were a candidate's only reason
    examples: Dict[str, str] = field(default_factory=dict)
    closest: Optional[Plan] = None  # of the plans refused for device memory alone, the one over it by the least
    values: Dict[str, Set[str]] = field(default_factory=dict)  # every candidate's values of constrained fields

    def saw(self, layout_values: Dict[str, str]) -> None:
        for key, value in layout_values.items():
            self.values.setdefault(key, set()).add(value)

    def never_seen(self, constraint: Dict[str, str]) -> Dict[str, str]:
        """The constraint's fields whose value no candidate had."""
        return {k: v for k, v in constraint.items() if v not in self.values.get(k, set())}

    def add(self, plan: Plan, reasons: Sequence[str]) -> None:
        if not reasons:
            return
        self.candidates += 1
        rules = {rule_of(reason): reason for reason in reasons}
        for rule, reason in rules.items():
            self.counts[rule] += 1
            self.examples.setdefault(rule, reason)
        if len(rules) == 1:
            self.alone.update(rules.keys())
        over_device_only = plan.fits is False and len(reasons) == 1  # the device-memory reason alone
        if over_device_only and (self.closest is None or plan.margin_bytes > self.closest.margin_bytes):
            self.closest = plan

    def _line(self, rule: str, count: int) -> str:
        """`count` refusals by `rule`, marked ', the only reason:' where each of those candidates had no other."""
        alone = ", the only reason:" if self.alone[rule] == count else ""
        return f"  {count:,}x{alone} {self.examples[rule]}"

    def summary(self, label: Any, shown: int = 3) -> List[str]:
        """Lines for the user: how many were refused, the `shown` most common reasons with their counts and an
        example, and the closest to fitting (`label` names a plan's layout)."""
        lines = [f"{self.candidates:,} candidate layouts refused; the most common reasons:"]
        common = self.counts.most_common(shown)
        lines += [self._line(rule, count) for rule, count in common]
        # a rule that alone refused candidates every other rule admits, however rare, is the one to lift
        listed = {rule for rule, _ in common}
        lines += [self._line(rule, count) for rule, count in self.alone.most_common() if rule not in listed][:shown]
        if self.closest is not None:
            plan = self.closest
            lines.append(f"  closest to fitting: {label(plan)} needs {format_bytes(plan.memory.total_bytes)} per "
                         f"rank of {format_bytes(plan.device_memory_bytes)} (over by "
                         f"{format_bytes(-plan.margin_bytes)})")
        return lines
