"""Benchmark: plan 100,000 layouts (a grid over presets, engines and degrees); prints the time."""

from __future__ import annotations

import itertools
import os
import random
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.config.schema import (  # noqa: E402
    BenchConfig, ClusterConfig, LayoutConfig, ModelConfig, RunConfig, engine_config,
)
from harness.plan.planner import clear_caches, make_plan, plan_rows  # noqa: E402

N_LAYOUTS = 100_000


def model_configs():
    paths = sorted((ROOT / "hydra_configs" / "model").glob("*.yaml"))
    presets = [yaml.safe_load(path.read_text()) for path in paths]
    return [ModelConfig(name=p["name"], hf_config=p["hf_config"]) for p in presets]


def grid(n: int):
    """n RunConfigs; model / engine / cluster / bench objects are shared, each layout is its own."""
    models = model_configs()
    engines = [engine_config(name=name, **({"sequence_parallel": sp} if name in ("nd", "megatron_lm") else {})) for name in ("deepspeed", "fsdp", "nd", "megatron_lm")
               for sp in (False, True)]
    clusters = {}
    bench = BenchConfig()
    axes = itertools.product(models, engines, (0, 1, 2, 3), (1, 2, 4, 8), (1, 2, 4), (1, 2, 4, 8, 16), (1, 2),
                             ("none", "selective", "full"), (1, 2), (2048, 8192), ("1F1B", "Interleaved1F1B"))
    points = list(axes)
    random.Random(0).shuffle(points)  # a fixed, representative mix of valid and invalid layouts
    configs = []
    for model, engine, zero, tp, pp, dp, cp, ckpt, mb, seq, schedule in points:
        world = dp * tp * pp * cp
        key = (max(1, world // 8), min(world, 8))
        if key not in clusters:
            clusters[key] = ClusterConfig(name="h100", nodes=key[0], accelerators_per_node=key[1],
                                          accelerator="h100_sxm")
        layout = LayoutConfig(dp_shard=dp, tp=tp, pp=pp, cp=cp, zero_stage=zero, micro_batch=mb, grad_accum=2 * pp,
                              seq_len=seq, activation_checkpointing=ckpt, pp_schedule=schedule,
                              pp_virtual_stages=2 if schedule == "Interleaved1F1B" and pp > 1 else 1)
        configs.append(RunConfig(model=model, engine=engine, layout=layout, cluster=clusters[key], bench=bench))
        if len(configs) == n:
            break
    return configs


def timed(fn):
    """(wall seconds, CPU seconds of this process): on a shared machine the CPU time is the honest one."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main(repeats: int = 3) -> None:
    configs = grid(N_LAYOUTS)
    runs, plans = [], None
    for _ in range(repeats):  # cold every time: no spec, rule or state cached from the previous run
        clear_caches()
        plans = None  # let the previous run's plans go before timing the next one
        wall, cpu, plans = timed(lambda: [make_plan(cfg) for cfg in configs])
        runs.append((wall, cpu))
    wall, cpu = min(runs, key=lambda run: run[1])
    valid = sum(plan.valid for plan in plans)
    print(f"make_plan, {len(plans):,} layouts ({valid:,} valid), caches cold: best of {repeats}: "
          f"{wall:.2f} s wall, {cpu:.2f} s CPU ({cpu / len(plans) * 1e6:.1f} us per layout)")
    print(f"  all runs (wall / CPU s): {', '.join(f'{w:.2f} / {c:.2f}' for w, c in runs)}")
    valid_configs = [cfg for cfg, plan in zip(configs, plans) if plan.valid]
    _, cpu_valid, _ = timed(lambda: [make_plan(cfg) for cfg in valid_configs])
    print(f"valid layouts again (caches warm): {cpu_valid / len(valid_configs) * 1e6:.1f} us CPU per layout")
    wall, cpu, _ = timed(lambda: plan_rows(plans))
    print(f"plan_rows: {wall:.2f} s wall, {cpu:.2f} s CPU for {len(plans):,} rows")
    _, reference, _ = timed(lambda: [sum(range(100)) for _ in range(100_000)])
    print(f"load gauge: 100k x sum(range(100)) took {reference:.3f} s CPU in this process; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
