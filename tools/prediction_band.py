"""Regenerate harness/plan/data/prediction_band.json: the time model's residuals (measured / predicted - 1 of
tokens/s) per engine and regime, from the public GPU tables and the recorded CPU benchmark.

    python tools/prediction_band.py           # rewrite the table from the current model
    python tools/prediction_band.py --check   # exit 1 when the committed table is not what the model gives now

GPU rows: tests/published/runs.py (`published_runs()`, `prediction_error(run)`) where it exists, else the
llm-foundry H100 table (tests/unit/plan/test_published_throughput.py), each predicted by `make_plan` now. CPU rows:
tests/data/cpu_time_model_residuals.csv, a recorded run of tests/bench/bench_time_model.py (its header says how).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.plan.uncertainty import BAND_FILE, COVERAGE, MIN_ROWS, half_width, regime_of, residual  # noqa: E402

PUBLISHED = ROOT / "tests" / "published" / "runs.py"
CPU_TABLE = ROOT / "tests" / "data" / "cpu_time_model_residuals.csv"
DIGITS = 4  # residuals to 0.01%: far below any band, and stable against the last bits of a prediction


class Row(NamedTuple):
    """One calibration row: where it comes from, its engine and regime, and its residual."""

    table: str
    label: str
    engine: str
    regime: str
    residual: float


def gpu_rows() -> List[Row]:
    """The public GPU tables' rows, predicted by the current model."""
    if PUBLISHED.exists():
        return published_rows()
    return llm_foundry_rows()


def published_rows() -> List[Row]:
    from tests.published.runs import prediction_error, published_runs

    rows = []
    for run in published_runs():
        error = prediction_error(run)  # predicted / measured - 1
        rows.append(Row(run.table, run.label, run.engine, regime_of(run.config), residual(1 + error, 1.0)))
    return rows


def llm_foundry_rows() -> List[Row]:
    from tests.unit.plan.test_published_throughput import TABLE, mpt_config, predictions

    rows = []
    for row, plan, error in predictions():
        cfg = mpt_config(row)
        label = f"mpt-{row['model']} T={row['seq_len']} gpus={row['gpus']} ckpt={row['checkpointing']}"
        rows.append(Row(TABLE.stem, label, cfg.engine.name, regime_of(cfg), residual(1 + error, 1.0)))
    return rows


def cpu_rows() -> List[Row]:
    """The recorded CPU benchmark: a step-time error predicted_s / measured_s - 1 is measured / predicted - 1 of
    tokens/s."""
    with CPU_TABLE.open() as f:
        records = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return [Row(CPU_TABLE.stem, r["run"], r["engine"], r["regime"],
                residual(1 / float(r["predicted_ms"]), 1 / float(r["measured_ms"]))) for r in records]


def document(rows: Iterable[Row]) -> Dict[str, Any]:
    """The table: per engine and regime the rows' labels and residuals, with the band they give
    (harness.plan.uncertainty.half_width) for the reader; harness.plan.uncertainty.band recomputes it."""
    groups: Dict[str, Dict[str, Dict[str, Any]]] = {}
    tables = set()
    for row in rows:
        tables.add(row.table)
        group = groups.setdefault(row.engine, {}).setdefault(row.regime, {"rows": [], "residuals": []})
        group["rows"].append(f"{row.table}: {row.label}")
        group["residuals"].append(round(row.residual, DIGITS))
    for regimes in groups.values():
        for group in regimes.values():
            width, coverage = half_width(group["residuals"])
            group["half_width"], group["coverage"] = round(width, DIGITS), round(coverage, DIGITS)
    return {
        "about": "measured / predicted - 1 of tokens/s per engine and regime; written by tools/prediction_band.py",
        "coverage_target": COVERAGE,
        "min_rows": MIN_ROWS,
        "tables": sorted(tables),
        "groups": {engine: dict(sorted(regimes.items())) for engine, regimes in sorted(groups.items())},
    }


def current() -> Dict[str, Any]:
    """What the table holds under the current model, as JSON reads it back."""
    return json.loads(json.dumps(document([*gpu_rows(), *cpu_rows()])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed table is stale")
    args = parser.parse_args()
    table = current()
    if args.check:
        stale = json.loads(BAND_FILE.read_text()) != table
        print(f"{BAND_FILE.relative_to(ROOT)}: {'stale: run python tools/prediction_band.py' if stale else 'current'}")
        return int(stale)
    BAND_FILE.parent.mkdir(parents=True, exist_ok=True)
    tmp = BAND_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(BAND_FILE)
    for engine, regimes in table["groups"].items():
        for name, group in regimes.items():
            print(f"{engine:<10} {name:<24} {len(group['residuals']):>3} rows: ±{group['half_width']:.1%} "
                  f"(coverage {group['coverage']:.0%})")
    print(f"wrote {BAND_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
