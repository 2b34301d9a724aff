"""Synthetic sweeps written with the runtime's own writers (harness.rundir), as a real sweep leaves them."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any, Dict, List, Optional

from harness.config.schema import RunConfig
from harness.rundir import (
    COMPLETED,
    FAILED,
    METRICS_FILE,
    OOM,
    PENDING,
    PRUNED,
    RUNNING,
    Measured,
    RunResult,
    write_error,
    write_json,
    write_status,
)

GIB = 2**30
FLOPS_PER_TOKEN = 591744.0
CONVENTION = "6N+6LHQT:attn=causal:lm_head"


def run_config(sweep: str, **layout: Any) -> RunConfig:
    cfg = RunConfig(sweep_name=sweep)
    return dataclasses.replace(cfg, layout=dataclasses.replace(cfg.layout, **layout))


def plan_record(cfg: RunConfig, errors: List[str] = (), fits: Optional[bool] = True,
                memory: Optional[Dict[str, int]] = None, predicted_mfu: Optional[float] = None) -> Dict[str, Any]:
    """Shaped like `Plan.to_dict()` plus the `predicted` block prepare.py adds (harness/plan/planner.py)."""
    layout = cfg.layout
    world = layout.dp_replicate * layout.dp_shard * layout.tp * layout.pp * layout.cp
    memory = memory or {"param_bytes": 213632, "grad_bytes": 106816, "master_bytes": 213632,
                        "moment_bytes": 427264, "optimizer_grad_bytes": 0, "activation_bytes": 832004,
                        "allowance_bytes": 179334}
    optimizer = memory["master_bytes"] + memory["moment_bytes"] + memory["optimizer_grad_bytes"]
    total = memory["param_bytes"] + memory["grad_bytes"] + optimizer + memory["activation_bytes"] \
        + memory["allowance_bytes"]
    device = int(8 * GIB)
    tokens_per_step = layout.micro_batch * layout.grad_accum * layout.dp_replicate * layout.dp_shard * layout.seq_len
    return {
        "valid": not errors, "errors": list(errors), "warnings": [], "world_size": world,
        "layout": dataclasses.asdict(layout), "cluster": dataclasses.asdict(cfg.cluster),
        "memory": {**memory, "total_bytes": total}, "device_memory_bytes": device, "device_memory_source": "config",
        "fits": fits, "margin_bytes": device - total, "flop_convention": CONVENTION,
        "flops_per_token": FLOPS_PER_TOKEN, "hfu_flops_per_token": FLOPS_PER_TOKEN,
        "recompute_flops_per_token": 0.0, "tokens_per_step": tokens_per_step, "predicted_mfu": predicted_mfu,
        "predicted": {"param_bytes": memory["param_bytes"], "grad_bytes": memory["grad_bytes"],
                      "optimizer_bytes": optimizer, "activation_bytes": memory["activation_bytes"],
                      "total_bytes": total, "device_memory_bytes": device, "fits": fits,
                      "margin_bytes": device - total, **(predicted_time(0.04) if predicted_mfu else {})},
    }


def predicted_time(step_time_s: float) -> Dict[str, Any]:
    """A prediction's step time and its breakdown (the time model's `time` section): 60% compute, 25% exposed
    communication on two axes, 10% optimizer, 5% offload."""
    t = step_time_s
    return {"step_time_s": t, "time": {
        "step_time_s": t, "compute_s": {"gemm": 0.4 * t, "attention": 0.1 * t, "elementwise": 0.1 * t, "recompute": 0.0},
        "comm_s": {"dp": {"total": 0.3 * t, "exposed": 0.2 * t}, "tp": {"total": 0.05 * t, "exposed": 0.05 * t}},
        "bubble_s": 0.0, "optimizer_s": 0.1 * t, "offload_s": 0.05 * t, "overlap": {}}}


def measured(step_time_s: float, world: int, tokens_per_step: int, seed: int = 0,
             peak_allocated_bytes: Optional[int] = None) -> Measured:
    rng = random.Random(seed)
    step_times = [step_time_s * (1 + 0.2 * (rng.random() - 0.5)) for _ in range(8)]
    median = sorted(step_times)[len(step_times) // 2 - 1: len(step_times) // 2 + 1]
    step = sum(median) / 2
    tokens_per_s = tokens_per_step / step
    peak = 5e10
    losses = [5.55 - 0.001 * i + 0.002 * rng.random() for i in range(10)]
    per_rank = [{"rank": r, "param_bytes": 213632, "grad_bytes": 106816, "optimizer_bytes": 640896,
                 "activation_bytes": 832004 + 1000 * r, "peak_allocated_bytes": peak_allocated_bytes,
                 "peak_flops": peak} for r in range(world)]
    return Measured(
        tokens_per_s=tokens_per_s, tokens_per_s_per_device=tokens_per_s / world, step_time_s=step,
        step_times_s=step_times, tflop_per_s_per_device=tokens_per_s * FLOPS_PER_TOKEN / world / 1e12,
        mfu=tokens_per_s * FLOPS_PER_TOKEN / (peak * world), hfu=tokens_per_s * FLOPS_PER_TOKEN / (peak * world),
        peak_flop_per_s_per_device=peak, peak_flops_source="measured:cpu-matmul", param_bytes=213632,
        grad_bytes=106816, optimizer_bytes=640896, activation_bytes=832004 + 1000 * (world - 1), host_bytes=0,
        peak_allocated_bytes=peak_allocated_bytes, losses=losses, loss_first=losses[0], loss_final=losses[-1],
        per_rank=per_rank)


def make_run(sweep_dir: Path, name: str, state: str, sweep: str = "synthetic", step_time_s: float = 0.05,
             error: Optional[BaseException] = None, reason: str = "", plan_errors: List[str] = (),
             fits: Optional[bool] = True, predicted_mfu: Optional[float] = None,
             peak_allocated_bytes: Optional[int] = None, **layout: Any) -> Path:
    """One run directory in the given state, with the files the harness leaves at that point."""
    run_dir = Path(sweep_dir) / name
    cfg = run_config(sweep, **layout)
    write_json(run_dir / "config.json", dataclasses.asdict(cfg))
    plan = plan_record(cfg, plan_errors, fits, predicted_mfu=predicted_mfu)
    write_json(run_dir / "plan.json", plan)
    if state == COMPLETED:
        world = plan["world_size"]
        result = RunResult(
            run_id=name, sweep=sweep, engine=cfg.engine.name, model=cfg.model.name, world_size=world,
            layout=dataclasses.asdict(cfg.layout), cluster=dataclasses.asdict(cfg.cluster),
            flop_convention=CONVENTION, flops_per_token=FLOPS_PER_TOKEN, recompute_flops_per_token=0.0,
            tokens_per_step=plan["tokens_per_step"],
            measured=measured(step_time_s, world, plan["tokens_per_step"], seed=len(name),
                              peak_allocated_bytes=peak_allocated_bytes),
            predicted=plan["predicted"])
        write_json(run_dir / METRICS_FILE, result.to_dict())
    if error is not None:
        write_error(run_dir, 1, error)
    write_status(run_dir, state, reason)
    return run_dir


def make_sweep(root: Path, sweep: str = "synthetic") -> Path:
    """A sweep caught mid-way: three completed layouts, one failed, one OOM, one pruned, one running, one pending."""
    sweep_dir = Path(root) / sweep / "2026-01-01_00-00-00"
    make_run(sweep_dir, "0", COMPLETED, sweep, step_time_s=0.040, zero_stage=2, micro_batch=2,
             predicted_mfu=0.02)
    make_run(sweep_dir, "1", COMPLETED, sweep, step_time_s=0.060, zero_stage=3, micro_batch=2,
             predicted_mfu=0.02)
    make_run(sweep_dir, "2", COMPLETED, sweep, step_time_s=0.030, zero_stage=1, micro_batch=1)
    make_run(sweep_dir, "3", FAILED, sweep, error=RuntimeError("NCCL timeout in all_reduce"), zero_stage=0)
    make_run(sweep_dir, "4", OOM, sweep, reason="rank 1: OutOfMemoryError: CUDA out of memory", zero_stage=0,
             micro_batch=8)
    make_run(sweep_dir, "5", PRUNED, sweep, reason="tp=3 must divide num_attention_heads=4",
             plan_errors=["tp=3 must divide num_attention_heads=4"], fits=None, tp=3, dp_shard=1)
    make_run(sweep_dir, "6", RUNNING, sweep, zero_stage=2, micro_batch=4)
    make_run(sweep_dir, "7", PENDING, sweep, zero_stage=3, micro_batch=4)
    return sweep_dir


def make_big_sweep(root: Path, runs: int = 100, sweep: str = "big") -> Path:
    """`runs` run directories over a grid of layouts, mostly completed, some failed / pruned / running."""
    sweep_dir = Path(root) / sweep / "2026-01-01_00-00-00"
    grid = [(zero, mb, ga, ac) for zero in (0, 1, 2, 3) for mb in (1, 2, 4, 8, 16) for ga in (1, 2)
            for ac in ("none", "full", "selective")]
    for i in range(runs):
        zero, mb, ga, ac = grid[i % len(grid)]
        state = {7: FAILED, 13: PRUNED, 19: OOM}.get(i % 20, COMPLETED if i < runs - 5 else RUNNING)
        make_run(sweep_dir, f"{i}", state, sweep, step_time_s=0.01 * mb * (1 + zero / 4), zero_stage=zero,
                 micro_batch=mb, grad_accum=ga, activation_checkpointing=ac,
                 error=RuntimeError("synthetic") if state == FAILED else None,
                 reason="predicted OOM" if state == PRUNED else "", fits=False if state == PRUNED else True)
    return sweep_dir
