"""The program every rank runs: build, wrap with the engine, warm up, time N steps, reduce, write."""

from __future__ import annotations

import json
import os
import statistics
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from harness.config.compose import run_config_from_dict
from harness.config.naming import run_label
from harness.config.schema import RunConfig
from harness.config.standin import standin_banner
from harness.engines.float8 import float8_linear_count
from harness.engines.registry import rank_side
from harness.modeling import device
from harness.modeling.model import build_model
from harness.plan.peak import peak_flops as peak_flops_of
from harness.plan.time_limit import WARNING_SIGNAL
from harness.plan.uncertainty import interval, versus_band
from harness.plan.utilization import hfu, mfu
from harness.rundir import (
    COMPLETED,
    CONFIG_FILE,
    METRICS_FILE,
    PLAN_FILE,
    RUNNING,
    TIMEOUT,
    Measured,
    Predicted,
    RunResult,
    partial_measurement,
    write_error,
    write_json,
    write_status,
)
from harness.rundir.stats import figure_intervals, step_stats, steady
from harness.runtime.data import micro_batches, token_source
from harness.runtime.fatal_report import FatalReport
from harness.runtime.host_state import CoreWaitClock, host_record, snapshot
from harness.runtime.lifecycle import WarningSignal, die_with_parent
from harness.runtime.meter import (
    SavedActivationMeter,
    StepTimer,
    measure_matmul_peak_flops,
)
from harness.runtime.progress import GIB, MEMORY_KEY, PROGRESS_FILE, StepReporter
from harness.runtime.sinks import WandbRun, wandb_group


def load_run(run_dir: Path):
    cfg = run_config_from_dict(json.loads((run_dir / CONFIG_FILE).read_text()))
    plan = json.loads((run_dir / PLAN_FILE).read_text())
    return cfg, plan


def batch_maker(session, source, cfg: RunConfig):
    layout = cfg.layout

    def batches(step: int):
        return micro_batches(source, step, layout.micro_batch, layout.grad_accum, session.dp_rank, session.dp_size)

    return batches


def steady_on_every_rank(times_s: List[float], kind: device.DeviceKind) -> bool:
    """The steady-state rule (rundir.stats.steady) on this rank's warm-up times, agreed by all ranks (a MIN
    all-reduce), so that every rank leaves warm-up at the same step."""
    flag = torch.tensor([1.0 if steady(times_s) else 0.0], device=device.torch_device(kind))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def warm_up(session, batches, bench, kind: device.DeviceKind, report=None, timer: Optional[StepTimer] = None):
    """Untimed steps: at least bench.warmup_steps, more until step time is steady, at most
    bench.warmup_max_steps. The last one (a steady-state step: optimizer state exists, lazy initialisation and
    torch.distributed.pipelining's first-step metadata pass are behind) is metered for saved activations
    and, at its accumulation boundary, for the bytes of parameters, gradients and optimizer state. `timer`
    times each of them (the first carries torch.compile's work); the steady rule reads the unmetered ones."""
    meter, state, losses = SavedActivationMeter(session.model.parameters()), {}, []
    timer = timer or StepTimer(kind)
    step = 0
    while step < bench.warmup_steps - 1 or (step < bench.warmup_max_steps - 1
                                            and not steady_on_every_rank(timer.times_s, kind)):
        with timer.step():
            losses.append(session.train_step(batches(step)))
        if report:
            report(step, losses[-1], None)
        step += 1
    with meter.recording(), timer.step():
        losses.append(session.train_step(batches(step), on_boundary=lambda: state.update(session.state_bytes())))
    if report:
        report(step, losses[-1], None)
    return losses, meter.peak_bytes, state


def timed_steps(session, batches, steps, timer: StepTimer, losses: list, report=None, stop=None) -> None:
    """The measured loop: nothing but a device sync and a clock read on each side of a step; the live
    report (rank 0's line and W&B row) and `stop` (the ranks agree whether to end here) come after the
    closing sync, outside the timed span."""
    for step in steps:
        with timer.step():
            losses.append(session.train_step(batches(step)))
        if report:
            report(step, losses[-1], timer.times_s[-1])
        if stop is not None and stop():
            return


def agreed_to_stop(warning: WarningSignal, kind: device.DeviceKind) -> bool:
    """Whether any rank has heard the time limit's warning: a MAX all-reduce of one flag, so that every rank
    stops after the same step (a rank stopping alone would leave its peers inside the next step's collectives)."""
    flag = torch.tensor([1.0 if warning.received else 0.0], device=device.torch_device(kind))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def cut_short(measured_steps: int, cfg: RunConfig) -> Optional[Dict[str, Any]]:
    """metrics.json's `partial` record when the ranks stopped before every timed step ran, else None."""
    if measured_steps >= cfg.bench.steps:
        return None
    return {"steps_measured": measured_steps, "steps_planned": cfg.bench.steps,
            "reason": f"stopped at the time limit's warning, SIG{WARNING_SIGNAL}"}


def timed_loop(session, source, cfg: RunConfig, kind: device.DeviceKind, report=None, stop=None):
    bench = cfg.bench
    batches = batch_maker(session, source, cfg)
    warmup_timer = StepTimer(kind)
    losses, activation_bytes, state = warm_up(session, batches, bench, kind, report, warmup_timer)
    warmup = len(losses)
    state = {**state, "warmup_step_times_s": warmup_timer.times_s}
    if report:
        report.warmup, report.total = warmup, warmup + bench.steps
        report.metered_bytes = sum(state.get(k, 0) for k in ("param_bytes", "grad_bytes", "optimizer_bytes")) \
            + activation_bytes
    device.reset_peak_memory(kind)
    timer = StepTimer(kind)
    clock = CoreWaitClock()
    timed_steps(session, batches, range(warmup, warmup + bench.steps), timer, losses, report, stop)
    state["core_wait_share"] = clock.share()
    return timer.times_s, [float(loss) for loss in losses], activation_bytes, state


def rank_record(state, kind, times_s, losses, activation_bytes, peak_flops, float8_linears: int) -> Dict[str, Any]:
    return {
        "rank": dist.get_rank(),
        "float8_linears": float8_linears,  # linears this rank runs in FP8 (layout.precision=fp8)
        "step_times_s": times_s,
        "losses": losses,
        "activation_bytes": activation_bytes,
        "peak_allocated_bytes": device.peak_allocated_bytes(kind),
        "peak_flops": peak_flops,
        **state,
    }


def device_state_and_activation_bytes(record: Dict[str, Any]) -> int:
    return record["param_bytes"] + record["grad_bytes"] + record["optimizer_bytes"] + record["activation_bytes"]


def reduce_ranks(records: List[Dict[str, Any]], cfg: RunConfig, plan: Dict[str, Any]) -> Measured:
    """Across ranks: a step lasts as long as its slowest rank; the loss is the mean over dp ranks."""
    world = len(records)
    n_steps = len(records[0]["step_times_s"])
    step_times = [max(r["step_times_s"][i] for r in records) for i in range(n_steps)]
    warmup = len(records[0]["losses"]) - n_steps
    stats = step_stats(step_times, first_step=warmup)
    step_time = stats.median_s
    tokens_per_s = plan["tokens_per_step"] / step_time
    losses = [statistics.fmean(r["losses"][i] for r in records) for i in range(len(records[0]["losses"]))]
    measured_peaks = [r["peak_flops"] for r in records if r["peak_flops"]]
    peak = peak_flops_of(cfg.cluster.accelerator, cfg.layout.precision,
                         statistics.fmean(measured_peaks) if measured_peaks else None)
    peak_flops, source = peak.flops, peak.source
    flops_per_token, recompute_flops = plan["flops_per_token"], plan["recompute_flops_per_token"]
    peak_alloc = [r["peak_allocated_bytes"] for r in records if r["peak_allocated_bytes"] is not None]
    # The rank that needs the most device memory (under PP the stages differ), as the planner predicts.
    worst = max(records, key=device_state_and_activation_bytes)
    rates = {"tokens_per_s": tokens_per_s, "tokens_per_s_per_device": tokens_per_s / world,
             "tflop_per_s_per_device": tokens_per_s * flops_per_token / world / 1e12,
             "mfu": mfu(tokens_per_s, flops_per_token, peak_flops, world),
             "hfu": hfu(tokens_per_s, flops_per_token, recompute_flops, peak_flops, world)}
    return Measured(
        **rates,
        step_time_s=step_time,
        step_times_s=step_times,
        peak_flop_per_s_per_device=peak_flops,
        peak_flops_source=source,
        param_bytes=worst["param_bytes"],
        grad_bytes=worst["grad_bytes"],
        optimizer_bytes=worst["optimizer_bytes"],
        activation_bytes=worst["activation_bytes"],
        host_bytes=worst.get("host_bytes", 0),
        nvme_bytes=worst.get("nvme_bytes", 0),
        peak_allocated_bytes=max(peak_alloc) if peak_alloc else None,
        losses=losses,
        loss_first=losses[0],
        loss_final=losses[-1],
        per_rank=[{k: v for k, v in r.items() if k not in ("losses", "step_times_s")} for r in records],
        step_stats=stats.to_dict(),
        intervals=figure_intervals(stats, rates),
        warmup_steps=warmup,
        **compile_time(records, step_time, cfg.engine.compile),
    )


def compile_time(records: List[Dict[str, Any]], step_time: float, compiled: bool) -> Dict[str, Optional[float]]:
    """The first warm-up step of the slowest rank, and the compile time it carries beyond a steady step."""
    firsts = [r["warmup_step_times_s"][0] for r in records if r.get("warmup_step_times_s")]
    first = max(firsts) if firsts else None
    return {"first_step_s": first,
            "compile_s": max(first - step_time, 0.0) if compiled and first is not None else None}


def run(run_dir: Path, warning: WarningSignal) -> int:
    cfg, plan = load_run(run_dir)
    kind = device.choose_device_kind(cfg.cluster.accelerator, torch.cuda.is_available())
    device.bind(kind)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        write_status(run_dir, RUNNING)
        if cfg.standin.of:
            print(standin_banner(cfg.standin.of, cfg.standin.not_executed), flush=True)
    engine = rank_side(cfg.engine.name)
    on_meta = plan.get("model_init") == "meta"
    if on_meta and engine.construct is not None:
        model = engine.construct(cfg, run_dir, kind)  # the engine builds it sharded (DeepSpeed's zero.Init)
    else:
        model = build_model(cfg.model.hf_config, cfg.bench.seed, on_meta=on_meta)
    session = engine.apply(cfg, run_dir, model, kind)
    # Measured on every rank at once, so the figure includes the contention of the real run. Not on a
    # stand-in: its MFU would rate a GPU recipe's tiny copy against this CPU (and bf16 takes seconds).
    measure_peak = cfg.cluster.accelerator == "cpu" and not cfg.standin.of
    peak = measure_matmul_peak_flops(device.dtype_of(cfg.layout.precision)) if measure_peak else None
    source = token_source(cfg.data, cfg.model.hf_config["vocab_size"], cfg.layout.seq_len)
    tracker = open_tracker(run_dir, cfg, plan) if rank == 0 else None
    # Until warm-up is steady its length is known only to be at most warmup_max_steps (timed_loop sets it then).
    report = StepReporter(rank, cfg.bench.warmup_max_steps + cfg.bench.steps, cfg.bench.warmup_max_steps,
                          plan["tokens_per_step"], plan["flops_per_token"], dist.get_world_size(), tracker,
                          kind, peak_flops_of(cfg.cluster.accelerator, cfg.layout.precision, peak).flops,
                          progress_path=run_dir / PROGRESS_FILE)
    host_start = snapshot(kind.type == "cuda") if rank == 0 else None
    times_s, losses, activation_bytes, state = timed_loop(session, source, cfg, kind, report,
                                                          stop=lambda: agreed_to_stop(warning, kind))
    host_end = snapshot(kind.type == "cuda") if rank == 0 else None
    record = rank_record(state, kind, times_s, losses, activation_bytes, peak, float8_linear_count(model))
    records: List[Dict[str, Any]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(records, record)
    if rank == 0:
        measured = reduce_ranks(records, cfg, plan)
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        measured.host = host_record(host_start, host_end, local_ranks, [r.get("core_wait_share") for r in records])
        write_result(run_dir, cfg, plan, measured, tracker, cut_short(len(times_s), cfg))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def open_tracker(run_dir: Path, cfg: RunConfig, plan: Dict[str, Any]) -> WandbRun:
    """Rank 0's W&B run, opened before the first step so that its charts fill while the run trains."""
    return WandbRun(run_dir, cfg.tracking, name=f"{run_dir.name}: {run_label(cfg)}",
                    group=wandb_group(cfg.sweep_name, run_dir), job_type=cfg.engine.name,
                    config={**json.loads((run_dir / CONFIG_FILE).read_text()), "plan": plan},
                    tags=run_label(cfg).split())


def write_result(run_dir: Path, cfg: RunConfig, plan: Dict[str, Any], measured: Measured,
                 tracker: WandbRun, partial: Optional[Dict[str, Any]] = None) -> None:
    result = RunResult(
        run_id=run_dir.name,
        sweep=cfg.sweep_name,
        engine=cfg.engine.name,
        model=cfg.model.name,
        world_size=len(measured.per_rank),
        layout=json.loads(json.dumps(cfg.layout.__dict__)),
        cluster=json.loads(json.dumps(cfg.cluster.__dict__)),
        flop_convention=plan["flop_convention"],
        flops_per_token=plan["flops_per_token"],
        recompute_flops_per_token=plan["recompute_flops_per_token"],
        tokens_per_step=plan["tokens_per_step"],
        measured=measured,
        predicted=plan["predicted"],
        standin={"of": cfg.standin.of, "not_executed": list(cfg.standin.not_executed)} if cfg.standin.of else None,
        partial=partial,
    )
    payload = result.to_dict()
    # Local results first: a tracking failure or hang must never cost the measurement.
    write_json(run_dir / METRICS_FILE, payload)
    if partial:  # cut at the time limit's warning: TIMEOUT, its measurement kept
        write_status(run_dir, TIMEOUT, partial_measurement(run_dir))
    else:
        write_status(run_dir, COMPLETED)
    tracker.finish(_flat_summary(payload))
    payload["tracking"] = {"wandb_error": tracker.error, "wandb_run_id": getattr(tracker.run, "id", None),
                           "wandb_group": tracker.group}
    write_json(run_dir / METRICS_FILE, payload)


# Measured fields that are records, not figures: the statistics below flatten what W&B shows of them.
STRUCTURED = ("step_stats", "host", "intervals", "per_rank", "losses", "step_times_s")


def _flat_summary(payload: Dict[str, Any]) -> Dict[str, Any]:
    """Run summary for W&B: scalar measurements, the FLOP convention, and the prediction beside them."""
    measured = payload["measured"]
    # Scalars only (a structured field is left out also when it is None), under summary.csv's names.
    summary = {k: v for k, v in measured.items() if k not in STRUCTURED and not isinstance(v, (list, dict))}
    summary["warmup_steps_run"] = summary.pop("warmup_steps", None)
    summary.update(interval_summary(measured))
    summary["memory_per_rank_bytes"] = max(device_state_and_activation_bytes(r) for r in measured["per_rank"])
    # The live chart keys (harness/runtime/progress.py) end on the run's medians rather than its last step:
    # `mfu` (a fraction, as in metrics.json and summary.csv) is already the median; memory_gib is the
    # allocator's peak where there is one, else the largest rank's states and activations.
    summary[MEMORY_KEY] = (measured["peak_allocated_bytes"] or summary["memory_per_rank_bytes"]) / GIB
    predicted = payload["predicted"]
    # The prediction under summary.csv's names (harness/report/table.py), so one figure has one key.
    summary.update(
        flop_convention=payload["flop_convention"],
        flops_per_token=payload["flops_per_token"],
        world_size=payload["world_size"],
        tokens_per_step=payload["tokens_per_step"],
        pred_total_bytes=predicted.get("total_bytes"),
        mfu_predicted=predicted.get("mfu"),
        hfu_predicted=predicted.get("hfu"),
        step_time_predicted_s=predicted.get("step_time_s"),
        tokens_per_s_predicted=predicted.get("tokens_per_s"),
        tflop_per_s_per_device_predicted=predicted.get("tflop_per_s_per_device"),
        **band_summary(predicted, measured.get("tokens_per_s")),
    )
    # where the predicted step time goes, beside the measured step time (seconds)
    parts = Predicted.from_dict(predicted).time_parts()
    summary.update({f"pred_time_{part}_s": seconds for part, seconds in parts.items()})
    return summary


def band_summary(predicted: Dict[str, Any], measured_tokens_per_s: Optional[float]) -> Dict[str, Any]:
    """The band of the predicted tokens/s (harness.plan.uncertainty) under summary.csv's names, its ends as
    tokens/s (a W&B bar chart draws them beside the measurement), and where the measured tokens/s fell."""
    band, rate = predicted.get("tokens_per_s_band"), predicted.get("tokens_per_s")
    keys = ("tokens_per_s_band", "band_regime", "band_source", "band_rows")
    low, high = interval(rate, band) if band is not None and rate is not None else (None, None)
    return {**{key: predicted.get(key) for key in keys}, "tokens_per_s_predicted_low": low,
            "tokens_per_s_predicted_high": high, "tokens_per_s_in_band": versus_band(rate, measured_tokens_per_s, band)}


def interval_summary(measured: Dict[str, Any]) -> Dict[str, Any]:
    """W&B summary keys of the statistics: `<figure>_ci_low` / `_ci_high` for every figure with an interval,
    the interval's coverage, the spread (IQR, CV), the outlying steps' count, warm-up and the host's verdict."""
    out: Dict[str, Any] = {}
    for name, (low, high) in (measured.get("intervals") or {}).items():
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = low, high
    stats = measured.get("step_stats") or {}
    if stats:
        out.update(step_time_ci_level=stats["ci_level"], step_time_iqr_s=stats["iqr_s"], step_time_cv=stats["cv"],
                   step_outliers=len(stats["outliers"]), timed_steps=stats["n"])
    host = measured.get("host") or {}
    if host:
        out["host_disturbed"] = host["disturbed"]
    return out


def main() -> int:
    die_with_parent()
    warning = WarningSignal()  # first: a warning before the handler is set would be lost (the launcher ignores it)
    run_dir = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", "0"))
    with FatalReport(run_dir, rank):
        try:
            return run(run_dir, warning)
        except BaseException as error:
            traceback.print_exc()
            write_error(run_dir, rank, error)
            raise


def exit_without_teardown(code: int) -> None:
    """Leave without the interpreter's teardown. Once results are on disk and the process group is gone,
    the only thing left to run is C++ static destruction, where a rank that used gloo and FSDP sometimes
    aborts ("terminate called without an active exception", SIGABRT) and its launcher then kills the
    other ranks and reports a failure for a run that completed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main())
