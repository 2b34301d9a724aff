"""Benchmark: how good the untuned recommender's pick is, measured on the local Slurm cluster (2 nodes x 2 ranks).

Tiny Llama at a fixed global batch of 16 sequences of 64 tokens. The grid is engine (deepspeed, fsdp, nd) x ZeRO stage
(0, 3) x tp (1, 2) x pp (1, 2) x micro-batch (1, 4) x checkpointing (none, full); every layout of it the one validity
decision admits is written as a recipe and run by `harness sweep` on the cluster, with the recommender's overall top
choice added where the grid lacks it. Prints each layout's predicted and measured tokens/s and the measured tokens/s
of the recommender's top choice over the best measured in the grid. Then runs `harness tune`'s loop over the three
engines (top TUNE_K; a layout the grid measured is not run again, any other is run on the cluster), and prints the
measured tokens/s of its pick over the best measured in the grid and tune's runs together. Needs the local cluster
(`make slurm-up`, SLURM_CONF); minutes of wall time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.config.compose import compose_run_config  # noqa: E402
from harness.launch.recommend import admit, label, preset_files, ranked, recommend_overrides, write_preset  # noqa: E402
from harness.launch.tune import Measurement, Space, report, sweep_measure, tune  # noqa: E402
from harness.plan import hardware  # noqa: E402
from harness.plan.recommend import Choice, candidates  # noqa: E402

GLOBAL_BATCH = 16
BASE = ["model=tiny_llama", "cluster=local_slurm", "cluster.nodes=2", "layout.seq_len=64", "tracking=disabled",
        "bench.warmup_steps=2", "bench.steps=5"]
ENGINES = ("deepspeed", "fsdp", "nd")
TUNE_K = 3


def in_grid(layout) -> bool:
    return (layout.zero_stage in (0, 3) and layout.tp in (1, 2) and layout.pp in (1, 2) and layout.micro_batch in (1, 4)
            and layout.activation_checkpointing in ("none", "full") and layout.offload_optimizer == "none"
            and layout.cp == 1 and layout.ep == 1 and layout.dp_replicate == 1 and layout.pp_virtual_stages == 1)


def grid(results: Path):
    """(the admitted grid layouts of every engine as plans, the recommender's top plan, the overrides per engine)."""
    plans, tops = [], []
    for engine in ENGINES:
        overrides, _ = recommend_overrides([*BASE, f"engine={engine}", f"results_dir={results}"])
        cfg = compose_run_config(overrides)
        plans += [(overrides, cfg, plan) for plan in candidates(cfg, GLOBAL_BATCH, admit) if in_grid(plan.layout)]
        top, _ = ranked(cfg, GLOBAL_BATCH, 1)
        tops.append((overrides, cfg, top[0].plan))
    best = max(tops, key=lambda item: item[2].tokens_per_s)
    if not any(label(p) == label(best[2]) and p.engine.name == best[2].engine.name for _, _, p in plans):
        plans.append(best)
    return plans, best[2]


def main() -> int:
    if not os.environ.get("SLURM_CONF"):
        print("bench_recommend_quality: skipped, no local Slurm cluster (make slurm-up, then export SLURM_CONF)")
        return 0
    results = Path(tempfile.mkdtemp(prefix="bench-recommend-quality-"))
    env = {**os.environ, "HARNESS_CONFIG_DIR": str(results / "config"), "PYTHONPATH": str(ROOT)}
    os.environ["HARNESS_CONFIG_DIR"] = env["HARNESS_CONFIG_DIR"]
    plans, top = grid(results)
    names = []
    for n, (overrides, cfg, plan) in enumerate(plans):
        name = f"quality_{n:03d}"
        files = preset_files([Choice(plan, ())], name, overrides, cfg, "bench_recommend_quality")
        write_preset({k: v for k, v in files.items() if k.startswith("recipes/")}, results / "config")
        names.append(f"{name}_1")
    print(f"{len(plans)} layouts on 2 nodes x 2 ranks; the recommender's top: {top.engine.name} {label(top)}", flush=True)
    sweep = subprocess.run([sys.executable, "-m", "harness.cli", "sweep", f"recipes={','.join(names)}",
                            "launcher=slurm_local", "cluster=local_slurm", "cluster.nodes=2",
                            f"results_dir={results}", "sweep_name=quality"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
    print(sweep.stdout[-3000:], sweep.stderr[-2000:], flush=True)
    code = summarize(results, names, plans, top)
    return max(code, tuned(results, names, plans))


def grid_measurements(results: Path, names, plans):
    """{(engine, layout label): Measurement} of every grid layout that ran."""
    by_name = {}
    for metrics_file in results.glob("quality/*/*/metrics.json"):
        record = json.loads(metrics_file.read_text())
        measured = record.get("measured") or {}
        if measured.get("step_time_s"):
            by_name[record["layout"]["name"]] = Measurement(measured["step_time_s"], measured["tokens_per_s"])
    return {(plan.engine.name, label(plan)): by_name[name] for name, (_, _, plan) in zip(names, plans)
            if name in by_name}


def tuned(results: Path, names, plans) -> int:
    """`harness tune`'s loop over the three engines, measuring through the grid where it has the layout; its pick's
    measured tokens/s over the best measured. The refitted profile goes to the bench's own profile directory."""
    grid = grid_measurements(results, names, plans)
    run = sweep_measure(results)

    def measure(round_, name):
        missing = [(space, plan) for space, plan in round_ if (plan.engine.name, label(plan)) not in grid]
        ran = run(missing, name) if missing else {}
        grid.update(ran)
        return {(p.engine.name, label(p)): grid[(p.engine.name, label(p))] for _, p in round_
                if (p.engine.name, label(p)) in grid}

    host = hardware.profile_path(hardware.cpu_profile_name())
    hardware.PROFILE_DIR = results / "profiles"
    hardware.PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    if host.exists():
        shutil.copy(host, hardware.profile_path(hardware.cpu_profile_name()))
    spaces = []
    for engine in ENGINES:
        overrides, _ = recommend_overrides([*BASE, f"engine={engine}", f"results_dir={results}"])
        spaces.append(Space(tuple(overrides), compose_run_config(overrides)))
    result = tune(spaces, GLOBAL_BATCH, TUNE_K, "quality_tune", measure, "bench")
    print("\n".join(report(result)), flush=True)
    pick = result.best()
    if pick is None or not grid:
        print("tune measured nothing", file=sys.stderr)
        return 1
    best_key = max(grid, key=lambda k: grid[k].tokens_per_s)
    print(f"harness tune's pick ({pick[0]} {pick[1]}): {result.measured[pick].tokens_per_s:,.0f} tokens/s measured "
          f"= {result.measured[pick].tokens_per_s / grid[best_key].tokens_per_s:.3f} of the best measured "
          f"({best_key[0]} {best_key[1]}: {grid[best_key].tokens_per_s:,.0f}) over the grid and tune's "
          f"{len(result.measured)} runs", flush=True)
    return 0


def summarize(results: Path, names, plans, top) -> int:
    """Each layout's predicted and measured tokens/s, then the top choice's measured share of the best measured."""
    measured = {}
    for metrics_file in results.glob("quality/*/*/metrics.json"):
        record = json.loads(metrics_file.read_text())
        measured[record["layout"]["name"]] = record["measured"]["tokens_per_s"]
    rows = sorted(((measured.get(name), name, plan) for name, (_, _, plan) in zip(names, plans)),
                  key=lambda row: -(row[0] or 0.0))
    for tokens, name, plan in rows:
        shown = f"{tokens:9,.0f}" if tokens else "   failed"
        print(f"{name}  {plan.engine.name:9s} {label(plan):60s} predicted {plan.tokens_per_s:9,.0f}  measured {shown}")
    top_name = next(name for name, (_, _, plan) in zip(names, plans)
                    if plan.engine.name == top.engine.name and label(plan) == label(top))
    best, best_name = rows[0][0], rows[0][1]
    if not best or not measured.get(top_name):
        print(f"no measurement of the best or of the recommender's top ({top_name})", file=sys.stderr)
        return 1
    failed = [name for tokens, name, _ in rows if not tokens]
    print(f"untuned recommender's top ({top.engine.name} {label(top)}): {measured[top_name]:,.0f} tokens/s measured "
          f"= {measured[top_name] / best:.3f} of the best measured ({best_name}: {best:,.0f}) over {len(rows)} "
          f"layouts ({len(failed)} failed: {', '.join(failed) or 'none'})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
