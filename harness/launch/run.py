"""Run one prepared point on this machine: print its launch line, run it to a final state, say how it ended."""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun
from harness.launch.local import launch_local
from harness.runtime.sinks import wandb_environment


def run_prepared(run_dir: Path, cfg: RunConfig, rendered: RenderedRun, label: str = "") -> Tuple[str, str]:
    """(final state, reason) of one prepared run started with its own launcher (`harness run` and the points
    of a local `harness sweep`); W&B files stay inside the run directory."""
    label = label or Path(run_dir).name
    print(f"[harness] {label}: {rendered.command_line()}", flush=True)
    state, reason = launch_local(rendered, cfg.launcher.timeout_s, wandb_environment(Path(run_dir), cfg.tracking))
    print(f"[harness] {Path(run_dir).name}: {state} {reason}".rstrip(), flush=True)
    return state, reason
