"""Typed records of a run directory: status.json, errors/rank<N>.json and metrics.json (measured + predicted)."""

from __future__ import annotations

import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional

from harness.rundir.files import fatal_report_file
from harness.rundir.states import RunState

SCHEMA_VERSION = 1


class RecordError(ValueError):
    """A file parsed as JSON but is not the record it should be (wrong type, missing field, unknown state)."""


def _known(cls, data: Mapping[str, Any], what: str) -> Dict[str, Any]:
    """The fields of `cls` present in `data`; a required field that is missing raises RecordError."""
    if not isinstance(data, Mapping):
        raise RecordError(f"{what} is a {type(data).__name__}, not an object")
    names = {f.name for f in fields(cls)}
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise RecordError(f"{what} lacks {', '.join(missing)}")
    return {key: value for key, value in data.items() if key in names}


@dataclass
class Status:
    """status.json: the run's state, why, and when it was written."""

    state: RunState
    reason: str = ""
    time: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"state": self.state.value, "reason": self.reason, "time": self.time}

    @classmethod
    def now(cls, state: RunState, reason: str = "") -> "Status":
        return cls(RunState(state), reason, time.time())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Status":
        known = _known(cls, data, "status")
        try:
            known["state"] = RunState(known["state"])
        except ValueError:
            raise RecordError(f"unknown state {known['state']!r}") from None
        return cls(**known)


# faulthandler's names of the fatal signals it reports (CPython Python/faulthandler.c).
FATAL_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
FATAL_FRAMES = 3  # innermost frames of the crashing thread named in a fatal record's message


@dataclass
class RankError:
    """errors/rank<N>.json: one failing rank's exception, so a failure is classified without reading logs.
    `time`: when the record was written (its file's modification time), set by the reader, not stored."""

    rank: int
    type: str
    message: str
    out_of_memory: bool = False
    time: Optional[float] = field(default=None, compare=False)

    def to_dict(self) -> Dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key != "time"}

    @classmethod
    def from_fatal_report(cls, rank: int, text: str) -> Optional["RankError"]:
        """The record of a rank that died of a fatal signal, from the stack faulthandler wrote as it died
        (errors/rank<N>.fatal); None when the report is empty (the rank did not die that way)."""
        lines = text.splitlines()
        if not lines:
            return None
        what = lines[0].removeprefix("Fatal Python error: ").strip()
        current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), len(lines))
        frames = [line.strip() for line in lines[current + 1:] if line.strip().startswith("File ")]
        where = " < ".join(frames[:FATAL_FRAMES]) or "no Python frame in the crashing thread"
        stacks = f"every thread's stack in {fatal_report_file(rank)}"
        return cls(rank, FATAL_SIGNALS.get(what, "fatal error"), f"{what} ({stacks}) at {where}")

    @classmethod
    def from_exception(cls, rank: int, error: BaseException) -> "RankError":
        out_of_memory = "OutOfMemoryError" in type(error).__name__ or isinstance(error, MemoryError)
        return cls(rank, type(error).__name__, str(error)[:2000], out_of_memory)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RankError":
        return cls(**_known(cls, data, "rank error"))

    def reason(self) -> str:
        """One line naming the rank and its exception (the status reason)."""
        return f"rank {self.rank}: {self.type}: {self.message[:300]}"


# Keys of run directories written before every key carried its unit: read back under the new name.
OLD_MEASURED_KEYS = {"tflops_per_device": "tflop_per_s_per_device",
                     "peak_flops_per_device": "peak_flop_per_s_per_device"}


@dataclass
class Measured:
    """Measured on the ranks and reduced across them; units are in the names."""

    tokens_per_s: float
    tokens_per_s_per_device: float
    step_time_s: float  # median of the timed steps
    step_times_s: List[float]
    tflop_per_s_per_device: float
    mfu: Optional[float]  # None when the accelerator's peak is unknown
    hfu: Optional[float]
    peak_flop_per_s_per_device: Optional[float]
    peak_flops_source: str  # "datasheet:<key>", "measured:cpu-matmul" or "unknown"
    # Bytes held by each rank (max over ranks): exact sums of tensor storage.
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int  # peak saved for backward (saved_tensors_hooks)
    host_bytes: int  # offloaded states held in host memory
    # The device allocator's peak (CUDA); None where there is no allocator to ask (CPU).
    peak_allocated_bytes: Optional[int]
    losses: List[float]
    loss_first: float
    loss_final: float
    per_rank: List[Dict[str, Any]] = field(default_factory=list)
    nvme_bytes: int = 0  # offloaded states in this rank's NVMe swap files (their sizes on disk)
    # rundir.stats.StepStats of the timed steps: median, its interval, quartiles, CV, outlying steps.
    step_stats: Optional[Dict[str, Any]] = None
    # figure -> [low, high] at step_stats' ci_level, for every figure derived from the step time.
    intervals: Dict[str, List[float]] = field(default_factory=dict)
    warmup_steps: Optional[int] = None  # warm-up steps run (the steady-state rule may add to the least)
    host: Optional[Dict[str, Any]] = None  # runtime.host_state.host_record: the host's condition, disturbed or not
    # The first warm-up step (slowest rank), never among the timed steps: it carries lazy initialisation and, with
    # engine.compile, torch.compile's tracing and code generation. compile_s = first_step_s - step_time_s
    # when the run compiles (None otherwise).
    first_step_s: Optional[float] = None
    compile_s: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measured":
        renamed = {OLD_MEASURED_KEYS.get(key, key): value for key, value in data.items()}
        return cls(**_known(cls, renamed, "measured"))


# The parts of a predicted step time (Predicted.time_parts), in the order charts stack them.
TIME_PARTS = ("compute", "exposed_comm", "bubble", "optimizer", "offload")


@dataclass
class Predicted:
    """The plan's prediction, in the same keys as the measurement (plan.json `predicted`, metrics.json
    `predicted`). Every field is optional: a pruned or unplannable run predicts only part of it."""

    param_bytes: Optional[int] = None
    grad_bytes: Optional[int] = None
    optimizer_bytes: Optional[int] = None  # master weights + moments + fp32 gradient copy
    activation_bytes: Optional[int] = None
    total_bytes: Optional[int] = None  # the four above plus the allocator allowance
    host_bytes: Optional[int] = None
    nvme_bytes: Optional[int] = None
    device_memory_bytes: Optional[int] = None
    fits: Optional[bool] = None
    margin_bytes: Optional[int] = None
    mfu: Optional[float] = None
    hfu: Optional[float] = None
    step_time_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    tflop_per_s_per_device: Optional[float] = None
    # the band of tokens_per_s (harness.plan.uncertainty.Band): measured / predicted - 1 within ±tokens_per_s_band,
    # from band_rows calibration runs of the engine in band_regime; band_source "calibrated" or "uncalibrated"
    tokens_per_s_band: Optional[float] = None
    band_regime: Optional[str] = None
    band_source: Optional[str] = None
    band_rows: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as written

    @property
    def state_activation_bytes(self) -> Optional[int]:
        """Parameters + gradients + optimizer + saved activations: what the meter measures per rank."""
        parts = (self.param_bytes, self.grad_bytes, self.optimizer_bytes, self.activation_bytes)
        return sum(parts) if all(part is not None for part in parts) else None

    def to_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, **out}

    def time_parts(self) -> Dict[str, float]:
        """Where the predicted step time goes (seconds; they sum to step_time_s): the time model's breakdown
        (`time` in the plan's prediction) as compute, exposed communication, pipeline bubble, optimizer and
        offload. Empty when the plan predicted no time."""
        time = self.extra.get("time")
        if not isinstance(time, Mapping):
            return {}
        try:
            return {"compute": float(sum(time["compute_s"].values())),
                    "exposed_comm": float(sum(axis["exposed"] for axis in time["comm_s"].values())),
                    "bubble": float(time["bubble_s"]), "optimizer": float(time["optimizer_s"]),
                    "offload": float(time["offload_s"])}
        except (KeyError, TypeError, AttributeError, ValueError):
            return {}

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]]) -> "Predicted":
        if data is not None and not isinstance(data, Mapping):
            raise RecordError(f"predicted is a {type(data).__name__}, not an object")
        data = dict(data or {})
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {key: value for key, value in data.items() if key in names}
        if known.get("fits") is not None:
            known["fits"] = bool(known["fits"])
        return cls(**known, extra={key: value for key, value in data.items() if key not in names})


@dataclass
class RunResult:
    """metrics.json: the measurement, its FLOP convention, and the plan's prediction beside it."""

    run_id: str
    sweep: str
    engine: str
    model: str
    world_size: int
    layout: Dict[str, Any]
    cluster: Dict[str, Any]
    flop_convention: str
    flops_per_token: float
    recompute_flops_per_token: float
    tokens_per_step: int
    measured: Measured
    predicted: Predicted
    schema: int = SCHEMA_VERSION
    tracking: Optional[Dict[str, Any]] = None  # the W&B run's id or error, added after the run is tracked
    # A CPU stand-in of a GPU recipe: {"of": recipe, "not_executed": [what CPU cannot run, and why]}.
    standin: Optional[Dict[str, Any]] = None
    # A run cut short (the time limit's warning): {"steps_measured", "steps_planned", "reason"}; the
    # measurement covers the timed steps it finished. None: every timed step was measured.
    partial: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.predicted, Predicted):
            self.predicted = Predicted.from_dict(self.predicted)

    def to_dict(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(measured=self.measured.to_dict(), predicted=self.predicted.to_dict())
        for optional in ("tracking", "standin", "partial"):
            if out[optional] is None:
                del out[optional]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunResult":
        known = _known(cls, data, "metrics")
        known["measured"] = Measured.from_dict(known["measured"])
        known["predicted"] = Predicted.from_dict(known["predicted"])
        return cls(**known)
