"""Measurements taken on a rank: step timers, saved-activation bytes, exact state bytes, CPU peak."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from harness.modeling.device import DeviceKind, synchronize


class StepTimer:
    """Wall-clock step times with a device sync on both sides of each step."""

    def __init__(self, kind: DeviceKind):
        self.kind = kind
        self.times_s: List[float] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        synchronize(self.kind)
        start = time.perf_counter()
        yield
        synchronize(self.kind)
        self.times_s.append(time.perf_counter() - start)


class _Saved:
    """A saved tensor's stand-in; when autograd drops it after backward, its bytes stop counting."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: torch.Tensor, meter: "SavedActivationMeter", key: int):
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter._release(self.key)


class SavedActivationMeter:
    """Peak bytes of tensors autograd holds for backward, counted once per storage; parameters excluded.

    Live bytes rise as the forward saves tensors and fall as backward frees them, so the peak is what
    a schedule really keeps in flight (one micro-batch under plain accumulation, more under 1F1B).
    """

    def __init__(self, parameters: Iterable[torch.Tensor] = ()) -> None:
        # Engines keep weights in flat buffers (DeepSpeed ZeRO-1/2), so a saved view of a weight is
        # not a leaf: weight storages are excluded by address as well.
        self.weight_storages = {getattr(p, "_local_tensor", p).untyped_storage().data_ptr() for p in parameters}
        self.live: Dict[int, List[int]] = {}  # storage pointer -> [references, bytes]
        self.live_bytes = 0
        self.peak_bytes = 0

    def _pack(self, tensor: torch.Tensor):
        if tensor.is_leaf and tensor.requires_grad:
            return tensor  # a parameter: model state, not an activation
        base = tensor._base
        if base is not None and base.is_leaf and base.requires_grad:
            return tensor  # a view of a parameter (FSDP's gathered weights)
        local = getattr(tensor, "_local_tensor", tensor)
        local = getattr(local, "elem", local)  # AsyncCollectiveTensor wraps the result of a TP collective
        storage = local.untyped_storage()
        key = storage.data_ptr()
        if key in self.weight_storages:
            return tensor
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [1, storage.nbytes()]
            self.live_bytes += storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        else:
            entry[0] += 1
        # Keep a detached alias: a tensor a node saves from its own output has that node as grad_fn, and
        # holding it would close a node -> saved tensor -> node cycle that only running the node breaks
        # (a split backward's input pass keeps the graph, its weight pass never runs the input-only nodes).
        return _Saved(tensor.detach(), self, key)

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self.live[key]

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    @contextmanager
    def recording(self) -> Iterator["SavedActivationMeter"]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self


def measure_matmul_peak_flops(dtype: torch.dtype, sizes: Tuple[int, ...] = (64, 128, 256, 512),
                              repeats: int = 8) -> float:
    """This process's achievable matmul FLOP/s: the CPU's peak is measured, never looked up.

    The best over several square sizes: which size runs fastest depends on the CPU and the dtype (bf16
    without native instructions is fastest on small tiles, several times faster than at 512), and a peak
    taken at one unlucky size would let a model's own matmuls beat it (MFU above 1).
    """
    best_rate = 0.0
    for size in sizes:
        a = torch.randn(size, size, dtype=dtype)
        b = torch.randn(size, size, dtype=dtype)
        torch.matmul(a, b)  # warm-up: thread pool and kernels
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        best_rate = max(best_rate, 2.0 * size**3 / best)
    return best_rate
