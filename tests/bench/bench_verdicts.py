"""Benchmark: do verdicts hold? The cpu_grid sweep run several times on this machine; every pair of its layouts
judged in every run (report.verdict); prints each pair's verdicts and the count of contradicting significant
verdicts (one run says A is faster, another says B is; the goal is 0).

    python tests/bench/bench_verdicts.py                      # cpu_grid with bench.repeats=2, three times
    python tests/bench/bench_verdicts.py --times 2 -- engine=deepspeed layout.zero_stage=1,2   # a smaller grid
    python tests/bench/bench_verdicts.py --reuse DIR          # judge the sweeps already under DIR
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[2]
HARNESS = [sys.executable, "-m", "harness.cli"]
# One run per point leaves run-to-run variation out of every interval: on a shared host it is the larger part
# (a single-run cpu_grid, three times, gave 1 contradicting verdict of 20 significant ones). Two interleaved
# repeats put it in.
DEFAULT_OVERRIDES = ["bench.repeats=2"]


def run_sweeps(root: Path, times: int, overrides: Sequence[str]) -> List[Path]:
    """`times` sweeps of cpu_grid (with `overrides`) under root/<i>, one after another."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    for i in range(times):
        args = [*HARNESS, "sweep", "sweep=cpu_grid", f"results_dir={root / str(i)}", "tracking=disabled", *overrides]
        print(f"[bench] sweep {i + 1}/{times}: {' '.join(args[2:])} (load {os.getloadavg()[0]:.1f})", flush=True)
        subprocess.run(args, cwd=ROOT, env=env, check=False, stdout=subprocess.DEVNULL)
        print(f"[bench] sweep {i + 1}/{times} done (load {os.getloadavg()[0]:.1f})", flush=True)
    return sweep_dirs(root)


def host_lines(sweeps: Sequence[Path]) -> List[str]:
    """Per sweep: each run's 1-minute load at its start and its ranks' largest wait for a core over the timed
    steps (metrics.json `measured.host`), so that a verdict that moved can be set beside what the host did."""
    import json

    lines = []
    for i, sweep in enumerate(sweeps, 1):
        parts = []
        for metrics in sorted(sweep.glob("*/metrics.json")):
            host = json.loads(metrics.read_text())["measured"].get("host") or {}
            load = ((host.get("start") or {}).get("load_avg") or ["?"])[0]
            shares = [s for s in host.get("core_wait_shares") or [] if s is not None]
            wait = f" wait {max(shares):.0%}" if shares else ""
            parts.append(f"{metrics.parent.name} load {load}{wait}{' DISTURBED' if host.get('disturbed') else ''}")
        lines.append(f"[bench] sweep {i} host: " + "; ".join(parts))
    return lines


def sweep_dirs(root: Path) -> List[Path]:
    return sorted(path.parent for path in root.glob("**/sweep.json"))


def judged_pairs(sweeps: Sequence[Path]) -> Dict[Tuple[str, str], List[str]]:
    """(layout A, layout B) -> per sweep: the faster one's name when significant, `=` when not, `?` if missing."""
    from harness.report.headline import candidates
    from harness.report.table import summary_frame
    from harness.report.verdict import comparable, verdict

    frames = [candidates(summary_frame([sweep])) for sweep in sweeps]
    labels = sorted({label for frame in frames for label in frame.get("label", [])})
    pairs: Dict[Tuple[str, str], List[str]] = {}
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            calls = []
            for frame in frames:
                rows = {row["label"]: row.to_dict() for _, row in frame.iterrows() if comparable(row)}
                if a not in rows or b not in rows:
                    calls.append("?")
                    continue
                judged = verdict(rows[a], rows[b], a, b)
                calls.append(judged.faster if judged.significant else "=")
            pairs[(a, b)] = calls
    return pairs


def contradictions(pairs: Dict[Tuple[str, str], List[str]]) -> int:
    """Pairs whose significant verdicts name different winners in different sweeps."""
    return sum(len({c for c in calls if c not in ("=", "?")}) > 1 for calls in pairs.values())


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--reuse", type=Path)
    parser.add_argument("overrides", nargs="*", help=f"sweep overrides (default: {' '.join(DEFAULT_OVERRIDES)})")
    args = parser.parse_args(argv)
    if args.reuse:
        sweeps = sweep_dirs(args.reuse)
    else:
        root = Path(tempfile.mkdtemp(prefix="bench-verdicts-"))
        sweeps = run_sweeps(root, args.times, args.overrides or DEFAULT_OVERRIDES)
    print("\n".join(host_lines(sweeps)), flush=True)
    pairs = judged_pairs(sweeps)
    for (a, b), calls in pairs.items():
        print(f"[bench] {a} vs {b}: " + " | ".join(c if c in ("=", "?") else f"{c} faster" for c in calls))
    significant = sum(c not in ("=", "?") for calls in pairs.values() for c in calls)
    print(f"[bench] verdicts over {len(sweeps)} cpu_grid sweeps: {len(pairs)} pairs, {significant} significant "
          f"verdicts, {contradictions(pairs)} contradicting (goal 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
