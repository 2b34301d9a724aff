"""Where a run's numbers go: metrics.json (atomic, rank 0) and a W&B run whose files stay in the run dir."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from harness.config.schema import TrackingConfig
from harness.rundir import wandb_file_environment


def wandb_environment(run_dir: Path, tracking: TrackingConfig) -> Dict[str, str]:
    """Variables that keep every wandb file inside the run dir and bound its waits.

    WANDB_MODE must be in the environment (init(mode=) alone still looks up telemetry at exit).
    """
    return {
        "WANDB_MODE": tracking.mode,
        **wandb_file_environment(run_dir),
        "WANDB_INIT_TIMEOUT": str(tracking.init_timeout_s),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
    }


def tracking_problem(tracking: TrackingConfig, environ: Dict[str, str]) -> Optional[str]:
    """Why tracking cannot start as configured (checked before launch), or None."""
    if tracking.backend == "wandb" and tracking.mode == "online" and not environ.get("WANDB_API_KEY"):
        return "tracking.mode=online needs WANDB_API_KEY in the environment (or use tracking=wandb_offline)"
    return None


def wandb_group(sweep_name: str, run_dir: Path) -> str:
    """One W&B group per invocation of a sweep: its name and the timestamp folder its runs share, so a
    re-run never mixes into an earlier one's charts and report."""
    return f"{sweep_name}-{Path(run_dir).resolve().parent.name}"


class WandbRun:
    """A W&B run from rank 0; every failure is reported and swallowed so local results are never lost."""

    def __init__(self, run_dir: Path, tracking: TrackingConfig, name: str, group: str, job_type: str,
                 config: Dict[str, Any], tags: Sequence[str] = ()):
        self.run = None
        self.group = group
        self.error: Optional[str] = None
        if tracking.backend != "wandb":
            return
        try:
            import wandb

            for key, value in wandb_environment(run_dir, tracking).items():
                os.environ.setdefault(key, value)
            Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(
                project=tracking.project,
                entity=tracking.entity,
                dir=os.environ["WANDB_DIR"],
                name=name,
                group=group,
                job_type=job_type,
                config=config,
                tags=[tag[:64] for tag in tags],
                reinit="finish_previous",
                settings=wandb.Settings(init_timeout=tracking.init_timeout_s, console="off"),
            )
            # Every chart's x-axis is the training step (harness/runtime/progress.py logs it in each row).
            self.run.define_metric("step")
            self.run.define_metric("*", step_metric="step")
        except Exception as error:  # tracking must never cost the measurement
            self.error = f"wandb init failed: {type(error).__name__}: {error}"

    def log_step(self, row: Dict[str, float]) -> None:
        """One training step's row, written as it happens (live charts online)."""
        if self.run is None:
            return
        try:
            self.run.log(row)
        except Exception as error:
            self.error = f"wandb log failed: {type(error).__name__}: {error}"

    def finish(self, summary: Dict[str, Any]) -> None:
        if self.run is None:
            return
        try:
            self.run.summary.update(summary)
            self.run.finish()
        except Exception as error:
            self.error = f"wandb finish failed: {type(error).__name__}: {error}"
