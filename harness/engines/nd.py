"""nd, launch side: Megatron-style tensor x pipeline parallel x FSDP2 on one DeviceMesh (DTensor,
torch.distributed.pipelining).

`render` writes `nd_plan.json` (mesh, TP plan per module, pipeline stages, FSDP and CP settings, all as data
from `nd_plans`) and the torchrun line; harness.engines.nd_session's `apply` builds the torch objects from that
file on each rank, so what runs is exactly what was rendered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Tuple

from harness.config.schema import RunConfig
from harness.engines import nd_plans
from harness.engines.rendered import RenderedRun, render_launch
from harness.plan.planner import spec_for
from harness.rundir import ND_PLAN_FILE, write_text

PLAN_FILE = ND_PLAN_FILE


def check(cfg: RunConfig) -> Tuple[List[str], List[str]]:
    """(errors, warnings) for this config under engine=nd; the planner reports them."""
    return nd_plans.check(cfg)


def model_problems(cfg: RunConfig) -> List[str]:
    """The model families the stage module cannot run, whatever the layout."""
    return nd_plans.family_problems(spec_for(cfg.model))


def render(cfg: RunConfig, run_dir: Path) -> RenderedRun:
    run_dir = Path(run_dir)
    if cfg.engine.launcher != "torchrun":
        raise ValueError(f"engine=nd launches with torchrun, not engine.launcher={cfg.engine.launcher!r}")
    plan = nd_plans.nd_plan(cfg)  # raises, naming every problem, on a layout nd cannot run
    write_text(run_dir / PLAN_FILE, json.dumps(plan, indent=2) + "\n")
    return render_launch(cfg, run_dir, "torchrun", [PLAN_FILE])
