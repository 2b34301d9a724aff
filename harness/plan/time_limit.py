"""Whether a run ends inside its Slurm time limit: start-up + (warm-up + timed steps) x predicted step time,
and the warning the job asks for ahead of the limit, against `launcher.time_limit`.

One rule (`time_limit_problem`) for every path that submits a job (`harness run` and `harness sweep` on
Slurm, `--dry-run` included) and for `harness plan`'s output. The rank side stops at a step boundary when
the warning signal arrives and writes the steps it measured (metrics.json marked partial), so the warning's
lead (`warning_lead_s`) is part of the time a run needs.

Refused rather than warned: such a job is predicted to end TIMEOUT, its allocation spent on a partial
measurement at best, while the fix is one field (the message names it and the limit that would do); where
the prediction is known to be pessimistic, a longer limit is the override.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from harness.plan.construction import model_init_mode

# The signal Slurm sends ahead of the time limit (`#SBATCH --signal=USR1@<lead>`); the ranks handle it and the
# launchers started between them and Slurm ignore it. SIGTERM is the time limit itself (and torchrun's shutdown
# of its workers), which leaves no time to finish a step.
WARNING_SIGNAL = "USR1"

# Start-up, before the first training step. Each part is an allowance with its basis:
# - imports, rendezvous, process-group and NCCL communicator set-up: `import torch, transformers, deepspeed,
#   accelerate` takes 2.9 s here with a warm page cache (`python -c "import time; t=time.time(); import torch,
#   transformers, deepspeed, accelerate; print(time.time()-t)"`, 2 loaded cores); a job's first import reads a
#   cold, often network, filesystem on every node at once, and communicators are built across nodes: 60 s.
STARTUP_FIXED_S = 60.0
# - model construction, parameters initialised per second: on the host, transformers'
#   AutoModelForCausalLM.from_config built a 187 M-parameter Llama (fp32) at 4.4e7 parameters/s here (2 loaded
#   cores). On a GPU, initialisation is memory-bound kernels: two fp32 writes per parameter (the module's own
#   init, then transformers' _init_weights), 8 B at an H100's 3.35 TB/s is 4e11 parameters/s; DeepSpeed's
#   zero.Init partitions module by module with Python work per tensor, so allow 40x less: 1e10.
INIT_PARAMS_PER_S = {"host": 4.4e7, "device": 1e10}
# - JIT-built DeepSpeed ops (engine.compiled_ops), built on the node the first time a job runs with an empty
#   TORCH_EXTENSIONS_DIR (the job script keeps it in the harness cache, so later jobs load them): DeepSpeedCPUAdam
#   (optimizer offload) 390 s and FusedAdam 184 s, first builds on a loaded machine (docs: MEASURED.md).
COMPILE_S = {"cpu_adam": 390.0, "fused_adam": 184.0}
# The time model has no measured GPU point yet: a run is planned with 25% head-room on its predicted step.
STEP_TIME_HEADROOM = 1.25
# After the warning the ranks finish the step they are in, agree to stop, gather their records and write
# metrics.json: one step (with head-room) plus 60 s. Slurm may send the signal up to 60 s earlier than asked
# ("Due to the resolution of event handling by Slurm", sbatch(1) --signal), which only lengthens the lead.
WRITE_ALLOWANCE_S = 60.0
DEFAULT_LEAD_S = 120  # no predicted step time
MAX_LEAD_S = 65535  # sbatch(1): sig_time between 0 and 65535

SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")
UNLIMITED = {"UNLIMITED", "INFINITE"}


def limit_seconds(text: str) -> Optional[float]:
    """A Slurm time limit in seconds (None: unlimited). sbatch(1) --time: "minutes", "minutes:seconds",
    "hours:minutes:seconds", "days-hours", "days-hours:minutes", "days-hours:minutes:seconds"."""
    if str(text).upper() in UNLIMITED:
        return None
    match = SLURM_TIME.fullmatch(str(text))
    if not match:
        raise ValueError(f"launcher.time_limit={text!r} is not a Slurm time such as 00:30:00 or 1-00:00:00")
    days, a, b, c = (int(match.group(k)) if match.group(k) else None for k in ("days", "a", "b", "c"))
    if days is not None:  # days-hours[:minutes[:seconds]]
        return float(days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0))
    if c is not None:  # hours:minutes:seconds
        return float(a * 3600 + b * 60 + c)
    if b is not None:  # minutes:seconds
        return float(a * 60 + b)
    return float(a * 60)  # minutes


def warning_lead_s(step_time_s: Optional[float]) -> int:
    """Seconds ahead of the limit at which the job asks for WARNING_SIGNAL: long enough to finish the step in
    flight and write the partial measurement."""
    if not step_time_s:
        return DEFAULT_LEAD_S
    return min(MAX_LEAD_S, math.ceil(STEP_TIME_HEADROOM * step_time_s + WRITE_ALLOWANCE_S))


def startup_s(total_params: int, model_init: str, accelerator: str, compiled_ops: bool, offload_optimizer: str) -> float:
    """Seconds before the first step: the fixed allowance, building the model (on the host when it is built full
    and moved; on the device when built from the meta device, where every rank initialises each full tensor
    before zero.Init keeps its partition, an upper bound for engines that initialise only their shard), and the
    first build of JIT-compiled DeepSpeed ops."""
    on_device = model_init == "meta" and accelerator != "cpu"
    init = total_params / INIT_PARAMS_PER_S["device" if on_device else "host"]
    compile_s = 0.0
    if compiled_ops:
        compile_s = COMPILE_S["cpu_adam" if offload_optimizer != "none" else "fused_adam"]
    return STARTUP_FIXED_S + init + compile_s


@dataclass(frozen=True)
class JobTime:
    """What a run needs of its job's time limit, part by part (seconds)."""

    startup_s: float
    steps: int  # warm-up + timed
    step_time_s: float  # predicted
    lead_s: int
    limit_s: Optional[float]  # None: unlimited

    @property
    def steps_s(self) -> float:
        return self.steps * self.step_time_s * STEP_TIME_HEADROOM

    @property
    def needed_s(self) -> float:
        return self.startup_s + self.steps_s + self.lead_s

    @property
    def fits(self) -> bool:
        return self.limit_s is None or self.needed_s <= self.limit_s

    def describe(self) -> str:
        return (f"start-up {self.startup_s:.0f} s + {self.steps} steps x {self.step_time_s:.4g} s predicted x "
                f"{STEP_TIME_HEADROOM} head-room ({self.steps_s / 60:.1f} min) + {self.lead_s} s warning lead "
                f"= {self.needed_s / 60:.1f} min")


def _startup_s(cfg: Any, total_params: int, model_init: str) -> float:
    return startup_s(total_params, model_init, cfg.cluster.accelerator,
                     bool(getattr(cfg.engine, "compiled_ops", False)), cfg.layout.offload_optimizer)


def job_time(cfg: Any, step_time_s: float, total_params: int, model_init: str) -> JobTime:
    """The time a Slurm run of `cfg` needs, from its plan's predicted step time and resolved model.init."""
    bench = cfg.bench
    return JobTime(_startup_s(cfg, total_params, model_init), bench.warmup_steps + bench.steps, step_time_s,
                   warning_lead_s(step_time_s), limit_seconds(cfg.launcher.time_limit))


def _too_short(limit: str, need: JobTime, bench: Any, fix: str) -> str:
    """The refusal of a run longer than its limit: the field and its minutes, the time needed part by part, and
    the value that would do."""
    return (f"{limit} ({need.limit_s / 60:.0f} min) is shorter than the run: {need.describe()} "
            f"(bench.warmup_steps={bench.warmup_steps}, bench.steps={bench.steps}); set {fix} or more, or fewer "
            "bench.steps")


def time_limit_problem(cfg: Any, step_time_s: Optional[float], total_params: Optional[int],
                       model_init: str) -> Optional[str]:
    """Why a Slurm run would reach its time limit before it measured every step (refused before submission),
    or None. Not checked without a predicted step time or off Slurm (a local run has launcher.timeout_s)."""
    if cfg.launcher.backend != "slurm" or not step_time_s or total_params is None:
        return None
    try:
        need = job_time(cfg, step_time_s, total_params, model_init)
    except ValueError as error:
        return str(error)
    if need.fits:
        return None
    minutes = math.ceil(need.needed_s / 60)
    return _too_short(f"launcher.time_limit={cfg.launcher.time_limit}", need, cfg.bench,
                      f"launcher.time_limit={minutes // 60:02d}:{minutes % 60:02d}:00")


def _model_init(cfg: Any, plan: Any) -> str:
    cluster, layout = cfg.cluster, cfg.layout
    return model_init_mode(cfg.engine.name, layout.zero_stage, cfg.model.init, plan.model.total_params,
                           cluster.accelerators_per_node, cluster.host_memory_gib, layout.offload_params)


def plan_time_limit_problem(cfg: Any, plan: Any) -> Optional[str]:
    """`time_limit_problem` for a planned config (its predicted step time, parameter count and resolved
    model.init); None for a plan without a model."""
    if plan.model is None:
        return None
    return time_limit_problem(cfg, plan.step_time_s, plan.model.total_params, _model_init(cfg, plan))


def local_timeout_problem(cfg: Any, plan: Any) -> Optional[str]:
    """Why a local run would reach launcher.timeout_s, where the watchdog ends it TIMEOUT with no warning ahead,
    before it measured every step; None off the local launcher or without a predicted step time or a model."""
    if cfg.launcher.backend != "local" or plan.model is None or not plan.step_time_s:
        return None
    bench, timeout = cfg.bench, cfg.launcher.timeout_s
    need = JobTime(_startup_s(cfg, plan.model.total_params, _model_init(cfg, plan)),
                   bench.warmup_steps + bench.steps, plan.step_time_s, 0, float(timeout))
    if need.fits:
        return None
    return _too_short(f"launcher.timeout_s={timeout}", need, bench, f"launcher.timeout_s={math.ceil(need.needed_s)}")


def plan_job_time(cfg: Any, plan: Any) -> Optional[JobTime]:
    """What a planned Slurm run needs of its time limit (`harness plan`'s columns); None off Slurm, without a
    predicted step time or a model, or with a limit that is not a Slurm time."""
    if cfg.launcher.backend != "slurm" or plan.model is None or not plan.step_time_s:
        return None
    try:
        return job_time(cfg, plan.step_time_s, plan.model.total_params, _model_init(cfg, plan))
    except ValueError:
        return None
