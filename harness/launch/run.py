"""Run one prepared point on this machine: print its launch line, run it to a final state, say how it ended."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Tuple

from harness.config.schema import RunConfig
from harness.engines.rendered import RenderedRun
from harness.launch.local import launch_local
from harness.launch.threads import local_threads
from harness.runtime.sinks import wandb_environment


def run_prepared(run_dir: Path, cfg: RunConfig, rendered: RenderedRun, label: str = "",
                 say: Callable[[str], None] = print) -> Tuple[str, str]:
    """(final state, reason) of one prepared run started with its own launcher (`harness run` and the points
    of a local `harness sweep`); W&B files stay inside the run directory. `say` prints a line (the launch
    command, rank 0's step lines as they come (also kept in launch.log), how the run ended)."""
    label = label or Path(run_dir).name
    state, reason = launch_local(rendered, cfg.launcher.timeout_s, wandb_environment(Path(run_dir), cfg.tracking),
                                 say=say, threads=local_threads(cfg),
                                 announce=lambda line: say(f"[harness] {label}: {line}"))
    say(f"[harness] {Path(run_dir).name}: {state} {reason}".rstrip())
    return state, reason
