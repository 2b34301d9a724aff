"""Which of two measured layouts is faster, said only as far as the data supports it: the one verdict function
every place that names a winner calls (the headline, the sweep's summary, the compare view)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

from harness.rundir.stats import CONFIDENCE, Difference, repeats_to_separate, throughput_difference

# What must be equal for a tokens/s comparison to be like with like; each difference is named in the verdict.
LIKE_FOR_LIKE = (("tokens_per_step", "global batches", "{:,.0f} tokens per step"),
                 ("seq_len", "sequence lengths", "{}"), ("model", "models", "{}"))
MOST_REPEATS = 50


@dataclass(frozen=True)
class Verdict:
    """A against B in tokens/s. `faster` is the name of the faster one only when the interval excludes zero."""

    faster: Optional[str]
    difference: Difference  # A's tokens/s over B's, minus one
    repeats_needed: Optional[int]  # to separate them, when not significant (None: more than MOST_REPEATS)
    caveats: List[str]
    text: str

    @property
    def significant(self) -> bool:
        """A winner is named: the interval excludes zero and neither run was disturbed."""
        return self.faster is not None


def repeats_of(row: Mapping[str, Any]) -> List[List[float]]:
    """A row's step times as repeats (a pooled row keeps each repeat's), each a list of seconds."""
    by_repeat = row.get("step_times_by_repeat")
    if _is_list(by_repeat):
        return [[float(t) for t in group] for group in by_repeat]
    return [[float(t) for t in row["step_times_s"]]]


def _is_list(value: Any) -> bool:
    return hasattr(value, "__len__") and not isinstance(value, str) and len(value) > 0


def caveats(a: Mapping[str, Any], b: Mapping[str, Any]) -> List[str]:
    """The like-for-like fields in which A and B differ, in words ("different global batches: 512 vs 1,024 ...")."""
    found = []
    for column, words, pattern in LIKE_FOR_LIKE:
        x, y = a.get(column), b.get(column)
        if x is not None and y is not None and str(x) != str(y):
            found.append(f"different {words}: {pattern.format(x)} vs {pattern.format(y)}")
    return found


def disturbed(row: Mapping[str, Any]) -> bool:
    """Whether runtime.host_state flagged the run: other processes took the host's cores while it measured."""
    flag = row.get("host_disturbed")
    return bool(flag.item() if hasattr(flag, "item") else flag) if flag is not None and flag == flag else False


def _percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def verdict(a: Mapping[str, Any], b: Mapping[str, Any], name_a: str, name_b: str,
            confidence: float = CONFIDENCE) -> Verdict:
    """A against B by tokens/s (tokens per step over the step time), from their step times.

    "A is faster than B by X% (95% CI a%–b%)" only when the interval of the ratio excludes zero; otherwise "no
    significant difference ... run with bench.repeats=N", N from the observed spread (stats.repeats_to_separate).
    Different global batches, sequence lengths or models are named: tokens/s still compares them, but a
    layout's batch is then part of what differs. A run measured on a disturbed host names no winner: contention
    slows a whole run at once, a shift the step-to-step interval cannot see (two runs of one layout on a busy
    2-core host came out "faster by 110% (95% CI 59%-139%)"), so the verdict asks for a rerun on a quiet host.
    """
    diff = throughput_difference(repeats_of(a), float(a["tokens_per_step"]), repeats_of(b), float(b["tokens_per_step"]),
                                 confidence)
    notes = caveats(a, b)
    level = f"{confidence:.0%} CI"
    single = len(repeats_of(a)) == 1 and len(repeats_of(b)) == 1
    busy = [name for row, name in ((a, name_a), (b, name_b)) if disturbed(row)]
    if busy:
        text = (f"{name_a} and {name_b} cannot be ranked: {' and '.join(busy)} ran while other processes took the "
                f"host's cores (host DISTURBED), which slows a whole run, not single steps "
                f"({_percent(diff.estimate)}, {level} {_percent(diff.low)}–{_percent(diff.high)}); "
                f"rerun {'them' if len(busy) > 1 else 'it'} on a quiet host")
        needed, faster = None, None
    elif diff.significant:
        first, second, d = (name_a, name_b, diff) if diff.estimate > 0 else (name_b, name_a, _flip(diff))
        text = (f"{first} is faster than {second} by {_percent(d.estimate)} in tokens/s "
                f"({level} {_percent(d.low)}–{_percent(d.high)}"
                + ("; one run each, so the interval holds step-to-step noise only: bench.repeats=2 or more adds "
                   "run-to-run" if single else "") + ")")
        needed, faster = None, first
    else:
        repeats = max(len(repeats_of(a)), len(repeats_of(b)))
        needed, faster = repeats_to_separate(diff, repeats, MOST_REPEATS), None
        text = (f"no significant difference between {name_a} and {name_b} at this sample size "
                f"({_percent(diff.estimate)}, {level} {_percent(diff.low)}–{_percent(diff.high)}); ")
        text += (f"run with bench.repeats={needed} to separate them" if needed is not None else
                 f"a difference this small would take more than {MOST_REPEATS} repeats (bench.repeats) to separate")
    if notes:
        text += f" [{'; '.join(notes)}: compared by tokens/s]"
    return Verdict(faster, diff, needed, notes, text)


def _flip(diff: Difference) -> Difference:
    """B against A from A against B: (1 + d) -> 1 / (1 + d) - 1, end points swapped (a monotone map)."""
    return Difference(1 / (1 + diff.estimate) - 1, 1 / (1 + diff.high) - 1, 1 / (1 + diff.low) - 1, diff.confidence)


def comparable(row: Mapping[str, Any]) -> bool:
    """Whether a row has what a verdict needs: step times and tokens per step."""
    times = row.get("step_times_s")
    tokens = row.get("tokens_per_step")
    return _is_list(times) and tokens is not None and tokens == tokens


def verdicts(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> List[Verdict]:
    """Every pair of the rows (in order), for views that compare more than two."""
    return [verdict(rows[i], rows[j], names[i], names[j])
            for i in range(len(rows)) for j in range(i + 1, len(rows))]
