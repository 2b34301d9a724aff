"""Turn one composed config into a run directory: resolved config, plan, engine files, PENDING status."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional

from harness.config.compose import run_config_to_dict
from harness.config.hub import HubUnreachable, fetch_hub_config
from harness.config.schema import RunConfig
from harness.engines import engine_module, registry
from harness.engines.deepspeed_ops import ASYNC_IO, op_compatible
from harness.engines.admission import judge
from harness.engines.rendered import RenderedRun
from harness.launch.host_profile import measure_host_profile
from harness.launch.local import for_backend
from harness.plan.construction import model_init_mode
from harness.plan.planner import Plan, band_columns, make_plan
from harness.plan.time_limit import plan_time_limit_problem
from harness.rundir import (
    CONFIG_FILE,
    PENDING,
    PLAN_FILE,
    PRUNED,
    Predicted,
    claim_run_dir,
    write_json,
    write_status,
)
from harness.runtime.sinks import tracking_problem


class RunRejected(ValueError):
    """Bad input found before launch; the message names every field, value and rule."""


@dataclass(frozen=True)
class PreparedRun:
    run_dir: Path
    cfg: RunConfig
    plan: Plan
    rendered: Optional[RenderedRun]

    @property
    def pruned(self) -> bool:
        return self.rendered is None


def resolve_model(cfg: RunConfig) -> RunConfig:
    """A hub id's config.json replaces the preset's fields (where the hub is reachable)."""
    if not cfg.model.hub_id:
        return cfg
    fields = fetch_hub_config(cfg.model.hub_id)
    return replace(cfg, model=replace(cfg.model, hf_config={**cfg.model.hf_config, **fields}))


def launch_problems(cfg: RunConfig) -> List[str]:
    """Checks of the run itself rather than of its layout (harness.engines.admission.judge decides the layout)."""
    problems = []
    if cfg.bench.steps < 1:
        problems.append(f"bench.steps={cfg.bench.steps} must be >= 1")
    if cfg.bench.warmup_steps < 2:
        # Step 1 creates the optimizer state; the last warm-up step is the one whose state is measured.
        problems.append(f"bench.warmup_steps={cfg.bench.warmup_steps} must be >= 2")
    if cfg.bench.warmup_max_steps < cfg.bench.warmup_steps:
        problems.append(f"bench.warmup_max_steps={cfg.bench.warmup_max_steps} must be >= "
                        f"bench.warmup_steps={cfg.bench.warmup_steps}")
    problem = tracking_problem(cfg.tracking, dict(os.environ))
    if problem:
        problems.append(problem)
    problem = nvme_problem(cfg)
    if problem:
        problems.append(problem)
    return problems


def nvme_problem(cfg: RunConfig) -> Optional[str]:
    """NVMe offload swaps through DeepSpeed's async_io op; where the ranks start on this machine and the op
    cannot load here, every rank would fail at its first step (`harness doctor` shows the same fact)."""
    targets = [f"layout.{key}=nvme" for key in ("offload_optimizer", "offload_params")
               if getattr(cfg.layout, key) == "nvme"]
    if not targets or cfg.engine.name != "deepspeed" or cfg.launcher.backend != "local":
        return None
    name, ok = op_compatible(ASYNC_IO)
    if ok:
        return None
    return (f"{' and '.join(targets)} needs DeepSpeed's {name} op, which cannot load on this machine "
            "(`harness doctor`: needs libaio, e.g. Debian's libaio-dev); offload to cpu instead")


def plan_record(plan: Plan, model_init: str = "auto") -> dict:
    """plan.json: the whole plan, the prediction in the same keys as the measurement, and how ranks build
    the model (`full` or `meta`, model.init resolved)."""
    record = plan.to_dict()
    if plan.model is not None:
        cluster = plan.cluster
        record["model_init"] = model_init_mode(plan.engine.name, plan.layout.zero_stage, model_init,
                                               plan.model.total_params, cluster.accelerators_per_node,
                                               cluster.host_memory_gib, plan.layout.offload_params)
    record["recompute_flops_per_token"] = (
        plan.hfu_flops_per_token - plan.flops_per_token if plan.flops_per_token is not None else None
    )
    record["predicted"] = prediction(plan).to_dict() if plan.memory else {}
    return record


def prediction(plan: Plan) -> Predicted:
    """The plan's prediction in the measurement's keys (the planner splits the optimizer into master
    weights, moments and an fp32 gradient copy; the meter measures them as one `optimizer_bytes`)."""
    memory = plan.memory
    step_time_s = plan.tokens_per_step / plan.tokens_per_s if plan.tokens_per_s else None
    return Predicted(
        param_bytes=memory.param_bytes, grad_bytes=memory.grad_bytes,
        optimizer_bytes=memory.master_bytes + memory.moment_bytes + memory.optimizer_grad_bytes,
        activation_bytes=memory.activation_bytes, total_bytes=memory.total_bytes, host_bytes=memory.host_bytes,
        nvme_bytes=memory.nvme_bytes, device_memory_bytes=plan.device_memory_bytes, fits=plan.fits,
        margin_bytes=plan.margin_bytes, mfu=plan.predicted_mfu, hfu=plan.predicted_hfu,
        step_time_s=step_time_s, tokens_per_s=plan.tokens_per_s,
        tflop_per_s_per_device=plan.tflop_per_s_per_device, **band_columns(plan.prediction_band),
        extra={"time": plan.time.to_dict()} if plan.time else {},
    )


def prepare_run(cfg: RunConfig, run_dir: Path, prune: bool = False) -> PreparedRun:
    """Validate and predict, then render. Invalid input raises, or (prune=True) leaves a PRUNED run dir.
    The run directory is `run_dir`, or `run_dir-N` when another process claimed it first (PreparedRun.run_dir)."""
    run_dir = claim_run_dir(run_dir)
    try:
        cfg = resolve_model(cfg)
    except HubUnreachable as error:
        raise RunRejected(str(error)) from error
    write_json(run_dir / CONFIG_FILE, run_config_to_dict(cfg))
    verdict = judge(cfg)
    plan, engine = verdict.plan, engine_module(cfg.engine.name)
    errors = [*verdict.errors, *launch_problems(cfg)]
    # a run that will launch and asks for this host's profile gets it measured first, once
    if not errors and plan.step_time_s is None and measure_host_profile(cfg):
        plan = make_plan(cfg)
    write_json(run_dir / PLAN_FILE, plan_record(plan, cfg.model.init))
    if errors:
        write_status(run_dir, PRUNED, "; ".join(errors))
        if prune:
            return PreparedRun(run_dir, cfg, plan, None)
        raise RunRejected("the run was not launched:\n  - " + "\n  - ".join(errors))
    rendered = for_backend(cfg, engine.render(cfg, run_dir))
    rendered.save()
    if registry.engine(cfg.engine.name).export_only:
        # Export engines (Megatron-LM) write a command line for the user's own cluster; nothing runs here.
        write_status(run_dir, PRUNED, f"engine={cfg.engine.name} is export only: see {', '.join(rendered.files)}")
        return PreparedRun(run_dir, cfg, plan, None)
    write_status(run_dir, PENDING)
    return PreparedRun(run_dir, cfg, plan, rendered)
