"""What one run leaves behind: `status.json` states and the `metrics.json` record (no torch)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

METRICS_FILE = "metrics.json"
STATUS_FILE = "status.json"
SCHEMA_VERSION = 1

# Lifecycle of a run directory; the last five are final.
PENDING, RUNNING, COMPLETED, FAILED, OOM, TIMEOUT, CANCELLED, PRUNED = (
    "PENDING",
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "OOM",
    "TIMEOUT",
    "CANCELLED",
    "PRUNED",
)
FINAL_STATES = (COMPLETED, FAILED, OOM, TIMEOUT, CANCELLED, PRUNED)


@dataclass
class Measured:
    """Measured on the ranks and reduced across them; units are in the names."""

    tokens_per_s: float
    tokens_per_s_per_device: float
    step_time_s: float  # median of the timed steps
    step_times_s: List[float]
    tflops_per_device: float
    mfu: Optional[float]  # None when the accelerator's peak is unknown
    hfu: Optional[float]
    peak_flops_per_device: Optional[float]
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


@dataclass
class RunResult:
    """The content of `metrics.json`: measurement, its FLOP convention, and the plan's prediction."""

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
    predicted: Dict[str, Any]
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON next to its destination and rename over it, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_status(run_dir: Path, state: str, reason: str = "") -> None:
    write_json_atomic(Path(run_dir) / STATUS_FILE, {"state": state, "reason": reason, "time": time.time()})


ERRORS_DIR = "errors"


def write_error(run_dir: Path, rank: int, error: BaseException) -> None:
    """One structured record per failing rank, so a failure is classified without reading logs."""
    out_of_memory = "OutOfMemoryError" in type(error).__name__ or isinstance(error, MemoryError)
    write_json_atomic(
        Path(run_dir) / ERRORS_DIR / f"rank{rank}.json",
        {"rank": rank, "type": type(error).__name__, "message": str(error)[:2000], "out_of_memory": out_of_memory},
    )


def read_errors(run_dir: Path) -> List[Dict[str, Any]]:
    folder = Path(run_dir) / ERRORS_DIR
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))] if folder.is_dir() else []


def read_status(run_dir: Path) -> Dict[str, Any]:
    path = Path(run_dir) / STATUS_FILE
    if not path.exists():
        return {"state": "UNKNOWN", "reason": "no status file", "time": None}
    return json.loads(path.read_text())


def read_metrics(run_dir: Path) -> Optional[Dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    return json.loads(path.read_text()) if path.exists() else None
