"""Exhaustive form of tests/unit/launch/test_recommend_admitted.py (which samples): for every model preset x cluster
preset x engine, every layout of the recommender's top 3 choices (and two of each choice's alike layouts) is
prepared and rendered as `harness sweep --dry-run` would. Prints one line per combination and the failures; exit 1
on any. Minutes of CPU: run by hand, `python tests/bench/bench_recommend_admitted.py`."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

_spec = importlib.util.spec_from_file_location("admitted", ROOT / "tests/unit/launch/test_recommend_admitted.py")
admitted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(admitted)


def check(model: str, cluster: str, engine: str, root: Path) -> str:
    overrides, _ = admitted.recommend_overrides([f"model={model}", f"cluster={cluster}", f"engine={engine}",
                                                 "layout.seq_len=4096", "tracking=disabled"])
    cfg = admitted.compose_run_config(overrides)
    top, count = admitted.ranked(cfg, 4 * cfg.cluster.ranks, 3)
    for i, choice in enumerate(top):
        for j, plan in enumerate([choice.plan, *choice.alike[:2]]):
            admitted.dry_run(replace(cfg, layout=plan.layout, engine=plan.engine), root / f"{i}-{j}")
    return f"{count} admitted, {len(top)} choices rendered"


def main() -> int:
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, (model, cluster, engine) in enumerate((m, c, e) for m in admitted.MODELS for c in admitted.CLUSTERS
                                                     for e in admitted.ENGINES):
            try:
                print(f"ok {model} {cluster} {engine}: {check(model, cluster, engine, Path(tmp) / str(n))}", flush=True)
            except Exception as error:  # every failure is printed, the rest still run
                failures += 1
                print(f"FAIL {model} {cluster} {engine}: {error!r}"[:800], flush=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
