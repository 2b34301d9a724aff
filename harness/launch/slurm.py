"""Slurm backend, in-job side: the hooks every job.sbatch runs first and last (`python -m harness.launch.slurm`).

The rest of the backend is one module per job: `sbatch.py` renders the scripts, `slurm_commands.py` runs
Slurm's commands, `job_records.py` keeps each run's submission and attempts, `status.py` classifies.
Their public names are re-exported here, so `harness.launch.slurm` stays the one place to import from.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import List, Optional

from harness.launch.job_records import (  # noqa: F401 (re-exported)
    archive_attempt,
    note_previous_attempt,
    note_requeue,
    read_job_record,
    read_submission,
    record_submission,
    submit,
)
from harness.launch.sbatch import (  # noqa: F401 (re-exported)
    CONTROL_CHARS,
    NODE_VARIABLES,
    PORT_BASE,
    PORT_SPAN,
    SECRET_NAME,
    TEMPLATE_DIR,
    ArrayGroup,
    ScriptValueRejected,
    Submission,
    check_env_setup,
    check_extra_sbatch,
    check_name,
    check_pattern,
    check_run_dir,
    group_runs,
    job_name,
    launch_line,
    launcher_executable,
    next_array_index,
    node_command,
    python_executable,
    render_array_script,
    render_job_script,
    resource_directives,
    script_environment,
    write_group,
    write_job_script,
)
from harness.launch.slurm_commands import (  # noqa: F401 (re-exported)
    SACCT_FIELDS,
    SlurmError,
    sacct_rows,
    sbatch,
    scancel,
    slurm_command,
    squeue_jobs,
)
from harness.launch.status import classify_files
from harness.rundir import (  # noqa: F401 (file names re-exported for callers of this module)
    ATTEMPTS_DIR,
    COMPLETED,
    JOB_RECORD_FILE,
    JOB_SCRIPT,
    RUNNING,
    SUBMISSION_FILE,
    SWEEP_SLURM_DIR,
    read_status,
    write_json,
    write_status,
)


def job_start(run_dir: Path) -> None:
    """First thing a job does for its run: set earlier attempts aside, record the job, mark RUNNING."""
    run_dir = Path(run_dir)
    archived = archive_attempt(run_dir)
    env = os.environ
    note_requeue(run_dir, int(env.get("SLURM_RESTART_COUNT", "0") or 0), archived)
    record = {
        "job_id": env.get("SLURM_JOB_ID"),
        "array_job_id": env.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": env.get("SLURM_ARRAY_TASK_ID"),
        "restart_count": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "nodes": env.get("SLURM_JOB_NODELIST"),
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": env.get("MASTER_PORT"),
        "started": time.time(),
    }
    write_json(run_dir / JOB_RECORD_FILE, record)
    key = f"{record['array_job_id']}_{record['array_task_id']}" if record["array_job_id"] else record["job_id"]
    write_status(run_dir, RUNNING, f"slurm job {key} on {record['nodes']}")


def job_end(run_dir: Path, returncode: int) -> None:
    """Last thing a job does: the final state from the run's own files and srun's exit code.

    Killed jobs (time limit, scancel, node failure) never get here; `harness sweep status` classifies
    those from squeue/sacct.
    """
    state, reason = classify_files(Path(run_dir), returncode)
    if state != COMPLETED or read_status(run_dir).state != COMPLETED:
        write_status(run_dir, state, reason)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "job-start":
        job_start(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "job-end":
        job_end(Path(argv[1]), int(argv[2]))
        return 0
    print("usage: python -m harness.launch.slurm job-start RUN_DIR | job-end RUN_DIR EXIT_CODE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
