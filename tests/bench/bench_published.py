"""Benchmark: the time model against every published GPU run (tests/data/*.csv, mapped by tests.published.runs).

Prints one line per row (table, engine, model and layout, measured and predicted tokens/s per GPU, the error,
and whether the plan fits the device: every row ran, so "no" is a memory-model miss), then the median and max
|error| per table and per engine, and the worst rows.

    python tests/bench/bench_published.py                 # every table
    python tests/bench/bench_published.py --table dgxc_h100
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.plan.planner import GIB, make_plan  # noqa: E402
from tests.published.runs import (REPEATS, SAME_SITE, TABLES, PublishedRun, beyond_site, gpus_of,  # noqa: E402
                                  label_without_gpus, layout_key, predicted_tokens_per_s_per_gpu, prediction_error,
                                  published_runs, repeated_layouts, weak_scaling_groups)

Result = Tuple[PublishedRun, float, float, Optional[bool], float]  # run, predicted, error, fits, GiB per rank


def layout_text(run: PublishedRun) -> str:
    layout = run.config.layout
    shard = layout.dp_shard or 1
    parts = [f"dp{layout.dp_replicate}x{shard}" if layout.dp_replicate > 1 else f"dp{shard}"]
    parts += [f"{name}{getattr(layout, name)}" for name in ("tp", "pp", "cp") if getattr(layout, name) > 1]
    if layout.pp_virtual_stages > 1:
        parts.append(f"vp{layout.pp_virtual_stages}")
    parts += [f"z{layout.zero_stage}", f"mb{layout.micro_batch}", f"ga{layout.grad_accum}", f"T{layout.seq_len}"]
    if layout.activation_checkpointing != "none":
        parts.append(f"ckpt={layout.activation_checkpointing}")
    if run.config.engine.sequence_parallel:
        parts.append("sp")
    return " ".join(parts)


def evaluate(runs: List[PublishedRun]) -> List[Result]:
    results = []
    for run in runs:
        plan = make_plan(run.config)
        results.append((run, predicted_tokens_per_s_per_gpu(run, plan), prediction_error(run, plan), plan.fits,
                        plan.memory.total_bytes / GIB))
    return results


def summary(label: str, errors: List[float]) -> str:
    absolute = [abs(e) for e in errors]
    signed = statistics.median(errors)
    return (f"{label:<34} {len(errors):>4} rows  median |error| {statistics.median(absolute):6.1%}  "
            f"max {max(absolute):6.1%}  median signed {signed:+6.1%}")


def weak_scaling(results: List[Result]) -> List[str]:
    """Per group of rows that differ only in their GPU count (tests.published.runs.weak_scaling_groups): the per-GPU
    throughput's change from the fewest GPUs to the most, measured and predicted. A model that gets each row within
    its band can still miss the trend, which is what a user scaling out relies on."""
    predicted = {id(run): tokens for run, tokens, _, _, _ in results}
    lines = []
    for group in weak_scaling_groups([run for run, _, _, _, _ in results]):
        few, most = group[0], group[-1]
        measured_change = most.tokens_per_s_per_gpu / few.tokens_per_s_per_gpu - 1
        predicted_change = predicted[id(most)] / predicted[id(few)] - 1
        lines.append(f"  {few.table:<24} {label_without_gpus(few):<44} {gpus_of(few):>4} -> "
                     f"{gpus_of(most):<4} GPUs  measured {measured_change:+6.1%}  predicted {predicted_change:+6.1%}")
    return lines


def repeats(results: List[Result], worst: int) -> List[str]:
    """Per table with an earlier campaign by its source (tests.published.runs.REPEATS): how far the two measurements
    of each layout both measured differ, beside the model's error on each, the pairs that differ most first. A
    row's error cannot be read more finely than its source repeats it."""
    error = {layout_key(run): e for run, _, e, _, _ in results}
    lines = []
    for table in [t for t in REPEATS if any(run.table == t for run, _, _, _, _ in results)]:
        pairs = repeated_layouts(table)
        changes = [row.tokens_per_s_per_gpu / earlier.tokens_per_s_per_gpu - 1 for row, earlier in pairs]
        absolute = [abs(change) for change in changes]
        lines.append(f"  {table}: {len(pairs)} layouts measured twice, the pinned campaign over the earlier: median "
                     f"|change| {statistics.median(absolute):.1%}, max {max(absolute):.1%}, median signed "
                     f"{statistics.median(changes):+.1%}")
        for change, (row, earlier) in sorted(zip(changes, pairs), key=lambda c: -abs(c[0]))[:worst]:
            lines.append(f"  {change:+7.1%}  {row.label}: {earlier.tokens_per_s_per_gpu:.0f} then "
                         f"{row.tokens_per_s_per_gpu:.0f}; model {prediction_error(earlier):+.1%} then "
                         f"{error[layout_key(row)]:+.1%}")
    return lines


def same_site(results: List[Result]) -> List[str]:
    """Per table measured at the site of a reference table (tests.published.runs.SAME_SITE): each row's error and
    what it misses beyond the reference engine's median error at that site on the same chip."""
    lines = []
    for table in [t for t in SAME_SITE if any(run.table == t for run, _, _, _, _ in results)]:
        rows = beyond_site(table)
        beyond = [abs(left) for _, _, left in rows]
        lines.append(f"  {table} beside {SAME_SITE[table]}: median |beyond| {statistics.median(beyond):.1%}, "
                     f"max {max(beyond):.1%}")
        for run, error, left in rows:
            lines.append(f"  {run.label:<50} error {error:+6.1%}  beyond the site {left:+6.1%}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", choices=list(TABLES), help="one table only")
    parser.add_argument("--worst", type=int, default=10, help="how many of the worst rows to list again")
    args = parser.parse_args()
    results = evaluate(published_runs(args.table))

    print(f"{'table':<24} {'engine':<12} {'run':<58} {'layout':<46} {'measured':>9} {'predicted':>9} "
          f"{'error':>7} {'fits':>4} {'GiB':>6}")
    for run, predicted, error, fits, gib in results:
        fit = "?" if fits is None else ("yes" if fits else "no")
        print(f"{run.table:<24} {run.engine:<12} {run.label:<58} {layout_text(run):<46} "
              f"{run.tokens_per_s_per_gpu:>9.0f} {predicted:>9.0f} {error:>+7.1%} {fit:>4} {gib:>6.1f}")

    by_table: Dict[str, List[float]] = defaultdict(list)
    by_engine: Dict[str, List[float]] = defaultdict(list)
    for run, _, error, _, _ in results:
        by_table[run.table].append(error)
        by_engine[run.engine].append(error)
    print("\nper table (error = predicted / measured - 1: positive = optimistic)")
    for table, errors in by_table.items():
        print(summary(f"{table} [{TABLES[table].engine}]", errors))
    print("per engine")
    for engine, errors in by_engine.items():
        print(summary(engine, errors))
    print(summary("all", [error for _, _, error, _, _ in results]))
    print("\nweak scaling: tokens/s per GPU from the fewest GPUs to the most, the same layout otherwise")
    print("\n".join(weak_scaling(results)) or "  (no table repeats a layout at several GPU counts)")
    misfits = [r for r in results if r[3] is False]
    print(f"planned as not fitting though they ran: {len(misfits)} of {len(results)}")
    print("\nthe sources' own repeat: one layout measured in two campaigns (earlier campaign: tests/data, REPEATS)")
    print("\n".join(repeats(results, args.worst)) or "  (no table here has an earlier campaign)")

    print("\none site's engines: a row's error beyond the reference engine's median error at its site, same chip")
    print("\n".join(same_site(results)) or "  (no table here has a reference table at its site)")

    print(f"\nworst {args.worst} rows by |error|")
    for run, predicted, error, _, _ in sorted(results, key=lambda r: -abs(r[2]))[:args.worst]:
        print(f"  {error:+7.1%}  {run.table}: {run.label} [{layout_text(run)}] "
              f"{run.tokens_per_s_per_gpu:.0f} measured, {predicted:.0f} predicted")


if __name__ == "__main__":
    main()
