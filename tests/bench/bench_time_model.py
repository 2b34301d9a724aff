"""Benchmark: predicted against measured step time on this machine, for every cpu_* recipe, the cpu_grid
sweep and a spread over tp / pp / ZeRO stage / offload / checkpointing; prints the error table with the
load average at each run, the median and the maximum absolute error. Each run also records how long its ranks
waited for a core (other processes on their cores); `error|wait` is the error of the prediction stretched by that
wait (time_model.under_core_wait), which separates the model's error from the host's load.

    python tests/bench/bench_time_model.py               # calibrate if needed, run everything, compare
    python tests/bench/bench_time_model.py --reuse DIR   # compare the runs already under DIR
    python tests/bench/bench_time_model.py --reuse DIR --profile P.json   # ... predicted under profile P
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
HARNESS = [sys.executable, "-m", "harness.cli"]

# (label, overrides): every cpu_* recipe, then the spread the recipes do not cover.
SPREAD = [
    ("zero2 ckpt=full", ["recipes=cpu_zero2", "layout.activation_checkpointing=full"]),
    ("nd tp2 ckpt=selective", ["recipes=cpu_nd_tp2", "layout.activation_checkpointing=selective"]),
    ("nd tp2 ckpt=full", ["recipes=cpu_nd_tp2", "layout.activation_checkpointing=full"]),
    ("nd pp2 ga4", ["recipes=cpu_nd_pp2", "layout.grad_accum=4"]),
    ("zero2 mb8", ["recipes=cpu_zero2", "layout.micro_batch=8"]),
    # shapes and schedules no engine factor (harness/plan/host_work.py) was measured on
    ("zero3 4 layers mb4", ["recipes=cpu_zero3", "model.hf_config.num_hidden_layers=4", "layout.micro_batch=4"]),
    ("fsdp ga2 seq128", ["recipes=cpu_fsdp", "layout.grad_accum=2", "layout.seq_len=128"]),
    ("nd tp2 mb4", ["recipes=cpu_nd_tp2", "layout.micro_batch=4"]),
    ("nd pp2 GPipe 4 layers", ["recipes=cpu_nd_pp2", "layout.pp_schedule=GPipe", "model.hf_config.num_hidden_layers=4"]),
    ("zero0 hidden128", ["recipes=cpu_zero2", "layout.zero_stage=0", "model.hf_config.hidden_size=128",
                         "model.hf_config.intermediate_size=256"]),
    ("fsdp1 ga4 3 layers", ["recipes=cpu_fsdp1", "layout.grad_accum=4", "model.hf_config.num_hidden_layers=3"]),
]


def recipes() -> List[Tuple[str, List[str]]]:
    return [(p.stem, [f"recipes={p.stem}"]) for p in sorted((ROOT / "recipes").glob("cpu_*.yaml"))]


# Timed steps per run: a median over the recipes' 3-8 steps moves by 20 % or more between runs on a shared
# 2-core host; 20 steps hold it to a few per cent.
STEPS = "bench.steps=20"


def run(label: str, overrides: List[str], out: Path) -> None:
    """One `harness run` into out/<label>, the load average noted beside it."""
    run_dir = out / label.replace(" ", "_").replace("=", "-")
    load = os.getloadavg()
    started = time.time()
    proc = subprocess.run([*HARNESS, "run", *overrides, STEPS, f"hydra.run.dir={run_dir}",
                           "tracking.backend=disabled"],
                          cwd=ROOT, capture_output=True, text=True)
    (run_dir / "bench_load.json").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "bench_load.json").write_text(json.dumps({"label": label, "load_before": load,
                                                          "load_after": os.getloadavg(), "rc": proc.returncode,
                                                          "wall_s": time.time() - started}))
    if proc.returncode:
        print(f"{label}: exit {proc.returncode}\n{proc.stderr[-1500:]}", file=sys.stderr)


def sweep(out: Path) -> None:
    """The cpu_grid sweep into out/cpu_grid."""
    load = os.getloadavg()
    subprocess.run([*HARNESS, "sweep", "sweep=cpu_grid", f"hydra.sweep.dir={out / 'cpu_grid'}",
                    "tracking.backend=disabled", STEPS], cwd=ROOT, capture_output=True, text=True)
    for run_dir in (out / "cpu_grid").iterdir():
        if run_dir.is_dir():
            (run_dir / "bench_load.json").write_text(json.dumps({"label": f"cpu_grid/{run_dir.name}",
                                                                  "load_before": load,
                                                                  "load_after": os.getloadavg()}))


PROFILE: Optional[Path] = None  # --profile: judge every run under this profile instead of its own


def predict(run_dir: Path) -> Optional[float]:
    """The step time the current model and profile predict for a run's resolved config (so runs measured
    before a recalibration are judged by the profile in use now, or by --profile)."""
    sys.path.insert(0, str(ROOT))
    from harness.config.compose import run_config_from_dict
    from harness.plan.planner import make_plan
    from harness.rundir.files import CONFIG_FILE

    config = run_dir / CONFIG_FILE
    if not config.exists():
        return None
    resolved = json.loads(config.read_text())
    if PROFILE is not None:
        resolved["cluster"]["profile"] = str(PROFILE)
    return make_plan(run_config_from_dict(resolved)).step_time_s


def interval_error(predicted: float, low: float, high: float) -> float:
    """How far the prediction lies outside the measured 95% interval, relative to the nearer end (0 inside):
    a prediction inside the interval is as right as this measurement can tell."""
    if predicted < low:
        return predicted / low - 1
    if predicted > high:
        return predicted / high - 1
    return 0.0


def under_core_wait(predicted: float, shares: List[float]) -> float:
    sys.path.insert(0, str(ROOT))
    from harness.plan.time_model import under_core_wait as rule

    return rule(predicted, shares)


def lockstep(shares: List[float]) -> float:
    sys.path.insert(0, str(ROOT))
    from harness.plan.time_model import lockstep_wait_share

    return lockstep_wait_share(shares)


def compare(out: Path) -> List[Dict[str, object]]:
    """One row per completed run under `out`: measured step time with its interval, predicted, the error against
    the median and against the interval, the load, and whether the host disturbed the run (with why)."""
    rows = []
    for metrics in sorted(out.rglob("metrics.json")):
        payload = json.loads(metrics.read_text())
        predicted = predict(metrics.parent)
        measured = payload["measured"]
        load_file = metrics.parent / "bench_load.json"
        load = json.loads(load_file.read_text()) if load_file.exists() else {}
        if predicted is None:
            continue
        low, high = (measured.get("intervals") or {}).get("step_time_s", [measured["step_time_s"]] * 2)
        host = measured.get("host") or {}
        shares = [share for share in host.get("core_wait_shares") or [] if share is not None]
        wait = lockstep(shares) if shares else None
        rows.append({"run": load.get("label", metrics.parent.name), "measured_s": measured["step_time_s"],
                     "low_s": low, "high_s": high, "predicted_s": predicted,
                     "error": predicted / measured["step_time_s"] - 1,
                     "interval_error": interval_error(predicted, low, high), "wait": wait,
                     "wait_error": (under_core_wait(predicted, shares) / measured["step_time_s"] - 1
                                    if shares else None),
                     "load": (load.get("load_before") or (host.get("start") or {}).get("load_avg") or [None])[0],
                     "disturbed": host.get("disturbed"), "why": "; ".join(host.get("disturbances") or [])})
    return rows


def summary(rows: List[Dict[str, object]], what: str) -> Optional[Tuple[float, float]]:
    if not rows:
        print(f"{what}: none")
        return None
    errors = [abs(r["error"]) for r in rows]
    outside = [abs(r["interval_error"]) for r in rows]
    median, worst = statistics.median(errors), max(errors)
    slow = sum(r["error"] < 0 for r in rows)
    print(f"{what}: {len(rows)} runs: median |error| {median:.1%}, max |error| {worst:.1%} (targets 15% / 35%), "
          f"measured slower than predicted in {slow}; against the 95% interval: median "
          f"{statistics.median(outside):.1%}, max {max(outside):.1%}, {sum(e == 0 for e in outside)} predictions "
          "inside it")
    waited = [r for r in rows if r["wait_error"] is not None]
    if waited:  # the prediction stretched by each run's measured wait for a core (time_model.under_core_wait)
        adjusted = [abs(r["wait_error"]) for r in waited]
        print(f"   under each run's own core wait ({len(waited)} runs, wait {min(r['wait'] for r in waited):.0%}-"
              f"{max(r['wait'] for r in waited):.0%}): median |error| {statistics.median(adjusted):.1%}, max "
              f"{max(adjusted):.1%}, measured slower in {sum(r['wait_error'] < 0 for r in waited)}")
    return median, worst


def print_table(rows: List[Dict[str, object]]) -> Optional[Tuple[float, float]]:
    print(f"{'run':<34} {'load':>5} {'measured ms (95% CI)':>26} {'predicted ms':>13} {'error':>8} {'vs CI':>7} "
          f"{'wait':>5} {'error|wait':>10} host")
    for r in rows:
        load = f"{r['load']:.1f}" if r["load"] is not None else "-"
        interval = f"{r['measured_s'] * 1e3:.1f} ({r['low_s'] * 1e3:.1f}-{r['high_s'] * 1e3:.1f})"
        host = "DISTURBED" if r["disturbed"] else "quiet" if r["disturbed"] is False else "-"
        wait = f"{r['wait']:.0%}" if r["wait"] is not None else "-"
        wait_error = f"{r['wait_error']:+.1%}" if r["wait_error"] is not None else "-"
        print(f"{r['run']:<34} {load:>5} {interval:>26} {r['predicted_s'] * 1e3:>13.1f} {r['error']:>+8.1%} "
              f"{r['interval_error']:>+7.1%} {wait:>5} {wait_error:>10} {host}")
    if not rows:
        print("no completed run with a prediction")
        return None
    for r in rows:
        if r["disturbed"]:
            print(f"excluded {r['run']}: {r['why']}")
    summary(rows, "all runs")
    return summary([r for r in rows if not r["disturbed"]], "undisturbed runs (the check)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reuse", type=Path, help="compare the runs already under this directory")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "time_model_check" / time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--profile", type=Path, help="predict under this profile file (default: each run's own)")
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile
    if args.reuse:
        print_table(compare(args.reuse))
        return 0
    sys.path.insert(0, str(ROOT))
    from harness.launch.host_profile import measure_missing_host_profile
    from harness.plan.hardware import cpu_profile_name, profile_path

    measure_missing_host_profile()
    path = profile_path(cpu_profile_name())
    raw = json.loads(path.read_text()).get("raw") or {}
    wait = raw.get("core_wait_share")
    print(f"hardware profile: {path}, measured under load {(raw.get('load_average') or ['?'])[0]}, its ranks "
          f"waiting for a core {f'{wait:.0%}' if wait is not None else '(not recorded)'} of the time")
    for label, overrides in recipes() + SPREAD:
        run(label, overrides, args.out)
    sweep(args.out)
    print(f"runs under {args.out}")
    print_table(compare(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
