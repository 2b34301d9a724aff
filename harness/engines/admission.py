"""The one decision whether a layout may run: planning, recommending, sweeping and launching all ask `judge`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from harness.engines import engine_module, registry
from harness.plan.planner import GIB, Plan, make_plan
from harness.plan.time_limit import plan_time_limit_problem

# A Slurm gres for GPUs: gpu:N or gpu:TYPE:N (harness.launch.sbatch checks the same shape before writing it).
_GRES_COUNT = re.compile(r"^gpu(?::[A-Za-z0-9_.-]+)?:(\d+)$")


@dataclass(frozen=True)
class Verdict:
    """A layout judged: its plan, every reason it is refused (empty: it may run) and every warning."""

    plan: Plan
    errors: Tuple[str, ...]
    warnings: Tuple[str, ...]

    @property
    def admitted(self) -> bool:
        return not self.errors


def judge(cfg: Any, plan: Optional[Plan] = None) -> Verdict:
    """Every reason `cfg` is refused, in one list: the layout and model rules (harness.plan.validate), the
    engine's own rules (its launch side's `check`, asked only of a plannable layout: it reads the plan's
    degrees; of any other, its `model_problems`), memory (the predicted per-rank total against the device), the
    launcher's fit to the cluster, and a Slurm run's time limit against its predicted length
    (harness.plan.time_limit; an export never launches).
    `plan` is cfg's plan when the caller already made it (the recommender makes it without a time)."""
    plan = make_plan(cfg) if plan is None else plan
    errors, warnings = list(plan.errors), list(plan.warnings)
    engine = engine_module(cfg.engine.name)
    if plan.valid:
        engine_errors, engine_warnings = engine.check(cfg)
        errors += [e for e in engine_errors if e not in errors]
        warnings += [w for w in engine_warnings if w not in warnings]
    elif plan.model is not None:  # the engine's rules on the model alone hold whatever the layout breaks
        errors += [e for e in engine.model_problems(cfg) if e not in errors]
    errors += memory_problems(plan) + launcher_problems(cfg)
    if not errors and not registry.engine(cfg.engine.name).export_only:
        limit = plan_time_limit_problem(cfg, plan)
        errors += [limit] if limit else []
    return Verdict(plan, tuple(errors), tuple(warnings))


def memory_problems(plan: Plan) -> List[str]:
    """Out of memory, on the device or the host:
    - the predicted per-rank total over the device's memory (harness.plan.memory: states, activations and the
      cluster's allowance);
    - the states a node's ranks offload (harness.plan.memory's host_bytes per rank, times the ranks per node)
      over the node's host memory (cluster.host_memory_gib): CPU optimizer and parameter offload hold them in
      host RAM for the whole run."""
    problems = []
    if plan.fits is False:
        need, have = plan.memory.total_bytes / GIB, plan.device_memory_bytes / GIB
        problems.append(f"predicted {need:.2f} GiB per rank > {have:.2f} GiB of device memory "
                        f"({plan.device_memory_source}): would run out of memory")
    cluster = plan.cluster
    node_host = (plan.memory.host_bytes if plan.memory is not None else 0) * cluster.accelerators_per_node
    if node_host and cluster.host_memory_gib and node_host > cluster.host_memory_gib * GIB:
        problems.append(f"offloaded states need {node_host / GIB:.1f} GiB of host memory per node > "
                        f"cluster.host_memory_gib={cluster.host_memory_gib}: would run out of host memory")
    return problems


def launcher_problems(cfg: Any) -> List[str]:
    """The launcher must reach every node of the cluster and ask Slurm for the GPUs each node's ranks use."""
    launcher, cluster = cfg.launcher, cfg.cluster
    problems = []
    if launcher.backend == "local" and cluster.nodes != 1:
        problems.append(f"launcher.backend=local starts one node, but cluster.nodes={cluster.nodes} "
                        f"(use launcher={needed_launcher(cluster)})")
    match = _GRES_COUNT.match(launcher.gpus_per_node_gres or "")
    if launcher.backend == "slurm" and match and int(match.group(1)) != cluster.accelerators_per_node:
        problems.append(f"launcher.gpus_per_node_gres={launcher.gpus_per_node_gres} asks for {match.group(1)} GPUs "
                        f"per node, but cluster.accelerators_per_node={cluster.accelerators_per_node} ranks run there")
    return problems


def launcher_to_add(overrides: Sequence[str], cfg: Any) -> Optional[str]:
    """The launcher preset to plan `cfg` with when the user chose none and the composed one (local) cannot reach
    the cluster's nodes (`needed_launcher`); None where the user named a launcher or the composed one fits."""
    chosen = any(text.split("=", 1)[0].lstrip("+~") == "launcher" for text in overrides)
    if chosen or cfg.launcher.backend != "local":
        return None
    return needed_launcher(cfg.cluster)


def needed_launcher(cluster: Any) -> Optional[str]:
    """The launcher preset a cluster needs (hydra_configs/launcher/): one node runs locally (None: keep the
    composed one); more than one is a Slurm job, whole GPU nodes (slurm_gpu) or the local CPU test cluster's
    partition (slurm_local: a CPU cluster here is the one `make slurm-up` starts)."""
    if cluster.nodes <= 1:
        return None
    return "slurm_local" if cluster.accelerator == "cpu" else "slurm_gpu"
