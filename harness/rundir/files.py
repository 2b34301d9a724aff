"""Every file name a run directory or a sweep directory holds, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Union

# A run directory (one point of a sweep, or one `harness run`).
CLAIM_FILE = "claim.json"  # created first and exclusively by the one process that fills the directory
CONFIG_FILE = "config.json"  # the resolved RunConfig
PLAN_FILE = "plan.json"  # the planner's verdict and prediction
RENDERED_FILE = "rendered.json"  # the launch command the engine rendered (read back by resume)
STATUS_FILE = "status.json"  # the run's state; its presence makes a directory a run directory
METRICS_FILE = "metrics.json"  # the measurement (rank 0), written once the run completed
ERRORS_DIR = "errors"  # one record per failing rank: errors/rank<N>.json (or rank<N>.fatal)
LAUNCH_LOG = "launch.log"  # the local launcher's combined output
WANDB_DIR = "wandb"  # every W&B file of the run stays below here
JOB_SCRIPT = "job.sbatch"  # the Slurm batch script of the run
SUBMISSION_FILE = "slurm.json"  # written by the submitter: which job the sweep submitted
JOB_RECORD_FILE = "slurm_job.json"  # written inside the job: which job actually ran it
ATTEMPTS_DIR = "attempts"  # earlier attempts' files, kept by resume
HYDRA_RECORD_DIR = ".hydra"  # Hydra's record of the composition (its default name), written by `harness run`

# Engine files, rendered beside the run's config.
DS_CONFIG_FILE = "ds_config.json"
ND_PLAN_FILE = "nd_plan.json"
ACCELERATE_CONFIG_FILE = "accelerate.yaml"
MEGATRON_SCRIPT_FILE = "megatron_args.sh"
MEGATRON_ARGS_FILE = "megatron_args.json"

# A sweep directory (or any report folder).
SWEEP_FILE = "sweep.json"  # how the sweep was asked for
SWEEP_SLURM_DIR = "slurm"  # the sweep's array scripts and Slurm logs
SUMMARY_CSV = "summary.csv"
SUMMARY_PARQUET = "summary.parquet"
REPORT_HTML = "report.html"
PLOTLY_JS = "plotly.min.js"  # plotly.js beside report.html, written once per report folder
WANDB_REPORT_JSON = "wandb_report.json"
WANDB_REPORT_URL = "wandb_report.url"  # where a published report lives


def error_file(rank: int) -> str:
    """The error record of one rank, relative to the run directory."""
    return f"{ERRORS_DIR}/rank{rank}.json"


def fatal_report_file(rank: int) -> str:
    """Where a rank's faulthandler writes its Python stack if a fatal signal (SIGSEGV, SIGABRT...) kills it."""
    return f"{ERRORS_DIR}/rank{rank}.fatal"


def slurm_log(job: str) -> str:
    """A Slurm job's output, relative to the run directory: sbatch's default --output (slurm-%j.out, in the
    job's --chdir, the run directory); the job script sets no --output of its own."""
    return f"slurm-{job}.out"


def wandb_file_environment(folder: Union[str, Path]) -> Dict[str, str]:
    """The variables that keep every file wandb writes below `folder`/wandb: its runs (wandb puts them in
    $WANDB_DIR/wandb/, where `wandb sync <folder>/wandb` finds them), caches, settings and artifacts.
    Without the four *_DIR variables besides WANDB_DIR, wandb writes into ~/.cache/wandb and ~/.config/wandb."""
    base = Path(folder) / WANDB_DIR
    return {
        "WANDB_DIR": str(Path(folder)),
        "WANDB_CACHE_DIR": str(base / ".cache"),
        "WANDB_DATA_DIR": str(base / ".data"),
        "WANDB_CONFIG_DIR": str(base / ".config"),
        "WANDB_ARTIFACT_DIR": str(base / ".artifacts"),
    }
