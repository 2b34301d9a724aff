"""Benchmark: plan 100,000 layouts (a grid over presets, engines and degrees); prints the time."""

from __future__ import annotations

import itertools
import random
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.config.schema import BenchConfig, ClusterConfig, EngineConfig, LayoutConfig, ModelConfig, RunConfig  # noqa: E402
from harness.plan.planner import make_plan, plan_rows  # noqa: E402

N_LAYOUTS = 100_000


def model_configs():
    paths = sorted((ROOT / "hydra_configs" / "model").glob("*.yaml"))
    return [ModelConfig(name=d["name"], hf_config=d["hf_config"]) for d in (yaml.safe_load(p.read_text()) for p in paths)]


def grid(n: int):
    """n RunConfigs; model / engine / cluster / bench objects are shared, each layout is its own."""
    models = model_configs()
    engines = [EngineConfig(name=name, sequence_parallel=sp) for name in ("deepspeed", "fsdp", "nd", "megatron_lm")
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
            clusters[key] = ClusterConfig(name="h100", nodes=key[0], accelerators_per_node=key[1], accelerator="h100_sxm")
        layout = LayoutConfig(dp_shard=dp, tp=tp, pp=pp, cp=cp, zero_stage=zero, micro_batch=mb, grad_accum=2 * pp,
                              seq_len=seq, activation_checkpointing=ckpt, pp_schedule=schedule,
                              pp_virtual_stages=2 if schedule == "Interleaved1F1B" and pp > 1 else 1)
        configs.append(RunConfig(model=model, engine=engine, layout=layout, cluster=clusters[key], bench=bench))
        if len(configs) == n:
            break
    return configs


def main() -> None:
    configs = grid(N_LAYOUTS)
    make_plan(configs[0])  # warm the spec cache the way a sweep would after its first layout
    start = time.perf_counter()
    plans = [make_plan(cfg) for cfg in configs]
    elapsed = time.perf_counter() - start
    start = time.perf_counter()
    plan_rows(plans)
    rows_elapsed = time.perf_counter() - start
    valid = sum(plan.valid for plan in plans)
    print(f"planned {len(plans):,} layouts ({valid:,} valid) in {elapsed:.2f} s "
          f"({elapsed / len(plans) * 1e6:.1f} us per layout); plan_rows {rows_elapsed:.2f} s")
    valid_configs = [cfg for cfg, plan in zip(configs, plans) if plan.valid]
    start = time.perf_counter()
    for cfg in valid_configs:
        make_plan(cfg)
    per_valid = (time.perf_counter() - start) / max(1, len(valid_configs))
    print(f"valid layouts only: {per_valid * 1e6:.1f} us per layout = {per_valid * N_LAYOUTS:.2f} s per 100k")


if __name__ == "__main__":
    main()
