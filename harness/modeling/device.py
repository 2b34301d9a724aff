"""The one device abstraction: which torch device, process-group backend, sync and allocator stats."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class DeviceKind:
    """What a rank computes on; decided once from the cluster's accelerator and what torch sees."""

    type: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"

    @property
    def has_allocator_stats(self) -> bool:
        return self.type == "cuda"


def choose_device_kind(accelerator: str, cuda_available: bool) -> DeviceKind:
    """GPU clusters run on CUDA with NCCL; `cpu` runs on gloo. A GPU cluster without CUDA is an error."""
    if accelerator == "cpu":
        return DeviceKind("cpu", "gloo")
    if not cuda_available:
        raise RuntimeError(
            f"cluster.accelerator={accelerator!r} needs CUDA but torch.cuda.is_available() is False "
            "(use cluster=cpu on a machine without GPUs)"
        )
    return DeviceKind("cuda", "nccl")


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def torch_device(kind: DeviceKind) -> torch.device:
    if kind.type == "cuda":
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def bind(kind: DeviceKind) -> None:
    if kind.type == "cuda":
        torch.cuda.set_device(local_rank())


def synchronize(kind: DeviceKind) -> None:
    """Wait for queued kernels so a wall-clock timer measures the work, not its launch."""
    if kind.type == "cuda":
        torch.cuda.synchronize()


def reset_peak_memory(kind: DeviceKind) -> None:
    if kind.has_allocator_stats:
        torch.cuda.reset_peak_memory_stats()


def peak_allocated_bytes(kind: DeviceKind) -> Optional[int]:
    """The CUDA caching allocator's peak; None on CPU, where no allocator keeps one."""
    if kind.has_allocator_stats:
        return int(torch.cuda.max_memory_allocated())
    return None


def dtype_of(precision: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
