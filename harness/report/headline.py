"""Which layout to use: the fastest completed layout that fits (most tokens/s), said in one sentence, and
whether the runner-up is really slower (report.verdict)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import pandas as pd

from harness.report.repeats import pool_repeats
from harness.report.verdict import Verdict, comparable, verdict
from harness.rundir import COMPLETED, FINAL_STATES
from harness.rundir.vocabulary import ci_words, format_gib, format_percent, format_seconds, sharding_words


@dataclass(frozen=True)
class Headline:
    sweep: str
    best: Optional[Dict[str, Any]]  # the chosen run's row, None when nothing completed and fits
    runner_up: Optional[Dict[str, Any]]
    text: str  # the answer, one sentence
    detail: str  # what it was chosen among, and what is still missing
    verdict: Optional[Verdict] = None  # the choice against the runner-up


def _num(value: Any) -> Optional[float]:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    return float(value)


def candidates(frame: pd.DataFrame) -> pd.DataFrame:
    """Completed runs that fit their device memory, fastest first (global tokens/s, then per device).

    Global tokens/s answers "which layout finishes training soonest on this cluster"; when the runs use
    different numbers of devices the headline also names the best per device. Repeats of a point count once,
    pooled (report.repeats).
    """
    if frame.empty or "status" not in frame:
        return frame
    frame = pool_repeats(frame)
    done = frame[(frame["status"] == COMPLETED) & (frame["fits"] != False)]  # noqa: E712 (None = unknown fit)
    done = done[done["tokens_per_s"].notna()]
    return done.sort_values(["tokens_per_s", "tokens_per_s_per_device"], ascending=False)


# (column, how it reads); a degree of 1 is left out.
_LAYOUT_WORDS = (("engine", "{}"), ("dp_replicate", "dp_replicate={}"), ("dp_shard", "dp_shard={}"), ("tp", "tp={}"),
                 ("pp", "pp={}"), ("cp", "cp={}"), ("ep", "ep={}"), ("zero_stage", "ZeRO-{}"),
                 ("offload_optimizer", "optimizer offload {}"), ("offload_params", "param offload {}"),
                 ("micro_batch", "micro-batch {}"), ("grad_accum", "accumulation {}"), ("seq_len", "sequence {}"),
                 ("activation_checkpointing", "checkpointing {}"), ("precision", "{}"))


def layout_summary(row: Dict[str, Any]) -> str:
    """The whole layout of a run in words (the label names only what differs between runs)."""
    words = []
    for column, pattern in _LAYOUT_WORDS:
        value = row.get(column)
        if value is None or (isinstance(value, float) and pd.isna(value)) or value == "none":
            continue
        if column in ("dp_replicate", "tp", "pp", "cp", "ep", "grad_accum") and value == 1:
            continue
        if column == "zero_stage":  # in the engine's own words: ZeRO-2, SHARD_GRAD_OP, FSDP2 keep, ...
            words.append(sharding_words(row.get("engine"), value, row.get("dp_replicate")))
            continue
        words.append(pattern.format(value))
    return ", ".join(words)


def _status_counts(frame: pd.DataFrame) -> str:
    counts = frame["status"].value_counts()
    return ", ".join(f"{n} {state.lower()}" for state, n in counts.items())


def _answer(best: Dict[str, Any], across: bool = False, settled: bool = True) -> str:
    world = _num(best.get("world_size"))
    source = f" from {best['series']}" if across else ""
    text = (f"{'Use' if settled else 'Fastest measured:'} {best['label']}{source}: "
            f"{best['tokens_per_s']:,.0f} tokens/s"
            + (f" on {world:.0f} device{'s' if world != 1 else ''}" if world else "")
            + f" ({best['tokens_per_s_per_device']:,.0f} per device)")
    if _num(best.get("tokens_per_s_ci_low")) is not None:
        text += f" [{ci_words(best)} {best['tokens_per_s_ci_low']:,.0f}–{best['tokens_per_s_ci_high']:,.0f}]"
    if _num(best.get("mfu")) is not None:
        text += f", MFU {format_percent(best['mfu'])}"
    if _num(best.get("step_time_s")) is not None:
        text += f", step time {format_seconds(best['step_time_s'])}"
    if _num(best.get("mem_measured_gib")) is not None:
        text += f", memory {format_gib(best['mem_measured_gib'])} per device"
        if _num(best.get("device_memory_gib")):
            text += f" of {format_gib(best['device_memory_gib'])}"
    return text + "."


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def runner_up_verdict(ranked: pd.DataFrame, across: bool = False) -> Optional[Verdict]:
    """The best against the runner-up (report.verdict), None with one candidate or without step times."""
    if len(ranked) < 2:
        return None
    best, runner = ranked.iloc[0].to_dict(), ranked.iloc[1].to_dict()
    if not (comparable(best) and comparable(runner)):
        return None
    return verdict(best, runner, _name(best, across), _name(runner, across))


def _name(row: Dict[str, Any], across: bool) -> str:
    return f"{row['label']} ({row['series']})" if across else str(row["label"])


def _comparison(ranked: pd.DataFrame, best: Dict[str, Any], judged: Optional[Verdict]) -> str:
    """How the choice stands against the runner-up, and against the best per device if that differs."""
    text = ""
    if judged is not None:
        text = " " + sentence(judged.text) if judged.significant else ""  # else the answer says it
    elif len(ranked) > 1:
        text = f" Runner-up: {ranked.iloc[1]['label']} (no step times to compare them by)."
    per_device = ranked.sort_values("tokens_per_s_per_device", ascending=False).iloc[0]
    if per_device["run_dir"] != best["run_dir"] and ranked["world_size"].nunique() > 1:
        text += (f" Per device, {per_device['label']} is best "
                 f"({per_device['tokens_per_s_per_device']:,.0f} tokens/s per device).")
    return text


def headline(frame: pd.DataFrame, sweep: str = "", across: bool = False) -> Headline:
    """The answer to "which layout should I use" for the runs in `frame` (one sweep; `across`: several
    sweeps compared, the answer names the sweep its run comes from)."""
    ranked = candidates(frame)
    unfinished = int((~frame["status"].isin(FINAL_STATES)).sum()) if not frame.empty else 0
    partial = f" {unfinished} of {len(frame)} runs have not finished: the answer may change." if unfinished else ""
    if ranked.empty:
        detail = f"{len(frame)} runs: {_status_counts(frame)}." if not frame.empty else "No runs found."
        return Headline(sweep, None, None, "No layout has completed and fit yet.", detail + partial)
    best = ranked.iloc[0].to_dict()
    runner = ranked.iloc[1].to_dict() if len(ranked) > 1 else None
    judged = runner_up_verdict(ranked, across)
    settled = judged is None or judged.significant
    detail = (f"Layout: {layout_summary(best)}. Fastest of {len(ranked)} completed layouts that fit "
              f"({len(frame)} runs: {_status_counts(frame)}).")
    if across:
        per_sweep = [f"{name}: {group.iloc[0]['label']} ({group.iloc[0]['tokens_per_s']:,.0f} tokens/s)"
                     for name, group in ranked.groupby("series", sort=True)]
        detail += " Best of each sweep: " + "; ".join(per_sweep) + "."
    answer = _answer(best, across, settled)
    if not settled:
        answer += " " + sentence(judged.text)
    return Headline(sweep, best, runner, answer, detail + _comparison(ranked, best, judged) + partial, judged)


def headlines(frame: pd.DataFrame) -> List[Headline]:
    """One headline: for one sweep its best layout; for several (per `series`: a sweep name found in several
    folders counts once per folder) the best across all of them, naming its sweep."""
    if frame.empty:
        return [headline(frame)]
    if frame["series"].nunique(dropna=False) > 1:
        return [headline(frame, "compared", across=True)]
    return [headline(group, str(series)) for series, group in frame.groupby("series", sort=True, dropna=False)]
