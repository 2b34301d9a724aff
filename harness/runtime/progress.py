"""Rank 0's live record of every training step: one console line (kept in launch.log or the Slurm job's
log), one JSON line in the run directory's progress.jsonl (what the harness follows, locally and on Slurm)
and one W&B row."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from harness.plan.utilization import mfu
from harness.rundir.vocabulary import format_bytes, format_percent, format_rate, format_seconds, header

# Every step line starts with this.
PROGRESS_PREFIX = "[step "
# One StepRecord per line, appended by rank 0 as each step ends; harness/launch/follow.py reads it live from
# the run directory (on the shared filesystem for Slurm runs) and prints each record's line().
PROGRESS_FILE = "progress.jsonl"
# W&B history keys, each with its unit; `step` is the x-axis of every chart.
STEP_KEY = "step"
LOSS_KEY = "loss"
STEP_TIME_KEY = "step_time_s"
TOKENS_KEY = "tokens_per_s"
MFU_KEY = "mfu"  # a fraction, as in metrics.json, summary.csv and the W&B summary
MEMORY_KEY = "memory_gib"
GIB = 1024**3


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as rank 0 saw it. Time, throughput and MFU are None for warm-up steps, which
    are not timed (their first step builds the optimizer state and would distort a live curve)."""

    step: int
    steps: int
    warmup: bool
    loss: float
    step_time_s: Optional[float]
    tokens_per_s: Optional[float]
    mfu: Optional[float]
    memory_bytes: Optional[int]

    def line(self) -> str:
        """e.g. `[step 7/20] loss 5.5012 | 8,155 tokens/s | MFU 2.8% | memory 1.9 MiB | step time 31.4 ms`,
        each figure named and formatted as in every table (harness.rundir.vocabulary)."""
        parts = [f"{PROGRESS_PREFIX}{self.step}/{self.steps}{' warm-up' if self.warmup else ''}]",
                 f"loss {self.loss:.4f}"]
        if self.tokens_per_s is not None:
            parts.append(f"| {format_rate(self.tokens_per_s)} {header('tokens_per_s')}")
        if self.mfu is not None:
            parts.append(f"| {header('mfu')} {format_percent(self.mfu)}")
        if self.memory_bytes is not None:
            parts.append(f"| {header('mem_state_activation_gib')} {format_bytes(self.memory_bytes)}")
        if self.step_time_s is not None:
            parts.append(f"| {header('step_time_s')} {format_seconds(self.step_time_s)}")
        return " ".join(parts)

    def json_line(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":")) + "\n"

    @classmethod
    def from_json_line(cls, line: str) -> Optional["StepRecord"]:
        """The record of one progress.jsonl line; None for a line that is not one (a torn or foreign line)."""
        try:
            return cls(**json.loads(line))
        except (ValueError, TypeError):
            return None

    def wandb_row(self) -> Dict[str, float]:
        row = {STEP_KEY: self.step, LOSS_KEY: self.loss}
        optional = {STEP_TIME_KEY: self.step_time_s, TOKENS_KEY: self.tokens_per_s,
                    MFU_KEY: self.mfu,
                    MEMORY_KEY: None if self.memory_bytes is None else self.memory_bytes / GIB}
        row.update({key: value for key, value in optional.items() if value is not None})
        return row


def mean_over_ranks(loss: Any, kind: Any) -> float:
    """The step's loss as metrics.json reports it: the mean over every rank's (data-parallel) loss. One
    scalar all-reduce after the timed span; without a process group (tests) the local value."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return float(loss)
    from harness.modeling.device import torch_device

    total = torch.tensor([float(loss)], dtype=torch.float64,
                         device=torch_device(kind) if kind is not None else "cpu")
    dist.all_reduce(total)
    return float(total.item()) / dist.get_world_size()


class StepReporter:
    """Called after every step on every rank; only rank 0 prints and logs. Memory is the allocator's peak
    on GPUs, else the states and saved activations metered in the last warm-up step (`metered_bytes`)."""

    def __init__(self, rank: int, total_steps: int, warmup_steps: int, tokens_per_step: int,
                 flops_per_token: Optional[float], world_size: int, tracker: Any, kind: Any,
                 peak_flops: Optional[float], progress_path: Optional[Path] = None):
        self.rank, self.total, self.warmup = rank, total_steps, warmup_steps
        self.progress_path = Path(progress_path) if progress_path is not None else None
        if self.progress_path is not None and rank == 0:
            self.progress_path.write_text("")  # this attempt's steps only
        self.tokens_per_step, self.flops_per_token, self.world = tokens_per_step, flops_per_token, world_size
        self.tracker, self.kind, self.peak_flops = tracker, kind, peak_flops
        self.metered_bytes: Optional[int] = None

    def memory_bytes(self) -> Optional[int]:
        from harness.modeling import device

        peak = device.peak_allocated_bytes(self.kind) if self.kind is not None else None
        return peak if peak is not None else self.metered_bytes

    def record(self, step: int, loss: Any, step_time_s: Optional[float]) -> Optional[StepRecord]:
        """On every rank (the loss is averaged over all of them, a collective); rank 0 prints and logs."""
        loss = mean_over_ranks(loss, self.kind)
        if self.rank != 0:
            return None
        tokens = self.tokens_per_step / step_time_s if step_time_s else None
        utilization = None
        if tokens is not None and self.flops_per_token is not None:
            utilization = mfu(tokens, self.flops_per_token, self.peak_flops, self.world)
        record = StepRecord(step + 1, self.total, step < self.warmup, float(loss), step_time_s, tokens,
                            utilization, self.memory_bytes())
        print(record.line(), flush=True)
        if self.progress_path is not None:
            # One write of one whole line: a reader polling the file sees whole records or a tail it waits on.
            with open(self.progress_path, "a") as out:
                out.write(record.json_line())
        if self.tracker is not None:
            self.tracker.log_step(record.wandb_row())
        return record

    __call__ = record
