"""The engine contract: what the launch side (check, render) and the rank side (construct, apply, session) of
every engine provide. `harness.engines.registry` checks each engine's modules against it when it loads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Tuple, runtime_checkable

from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun

# The state bytes every session reports; an engine may add more (DeepSpeed: "nvme_bytes").
STATE_KEYS = ("param_bytes", "grad_bytes", "optimizer_bytes", "host_bytes")


@runtime_checkable
class LaunchSide(Protocol):
    """Pure Python (no torch at import): runs where runs are prepared."""

    def check(self, cfg: RunConfig) -> Tuple[List[str], List[str]]:
        """(errors, warnings): the engine's own rules beyond the planner's support table, applied before
        `render`; an error names the field, its value and the rule."""

    def model_problems(self, cfg: RunConfig) -> List[str]:
        """The part of `check`'s errors that no layout changes (the model families the engine runs): asked of
        every layout, even one the planner refuses, and once before a search."""

    def render(self, cfg: RunConfig, run_dir: Path) -> RenderedRun:
        """Write the engine's files into `run_dir` and return how its ranks are started."""


@runtime_checkable
class Session(Protocol):
    """One rank's wrapped model and optimizer."""

    # This rank's parameters (their local shards): what the activation meter leaves out as weights.
    model: Any
    # Ranks with the same dp_rank read the same batch.
    dp_rank: int
    dp_size: int

    def train_step(self, micro_batches: Iterable[Any], on_boundary: Optional[Callable[[], None]] = None) -> Any:
        """One optimizer step. `on_boundary` runs after the last backward, before the optimizer step; the
        returned loss is this data-parallel rank's mean over its micro-batches, on every rank."""

    def state_bytes(self) -> Dict[str, int]:
        """Exact storage bytes this rank holds (STATE_KEYS), read at `on_boundary`: optimizer bytes include
        an fp32 master copy kept beside the weights; offloaded states count in `host_bytes`, not on the
        device."""


@runtime_checkable
class RankSide(Protocol):
    """Imported on each rank only (torch at module level)."""

    # Builds the model itself, partitioned as it goes, when plan.json says model_init=meta
    # (construct(cfg, run_dir, kind) -> model); None: the runtime builds it (on the meta device then).
    construct: Optional[Callable[..., Any]]

    def apply(self, cfg: RunConfig, run_dir: Path, model: Any, kind: Any) -> Session:
        """Shard and wrap `model` as the engine's rendered files say; `kind` is the rank's DeviceKind."""
