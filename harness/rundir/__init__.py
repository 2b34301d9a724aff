"""The run directory as a contract: file names, run states, typed records, one atomic writer, tolerant readers.

The bottom layer: it imports nothing else of the harness, and every other package reads and writes run
directories through it. `stats.py` holds the statistics of the step times a run records and a report compares.
"""

from harness.rundir.claim import claim_run_dir  # noqa: F401
from harness.rundir.files import *  # noqa: F401,F403 (the file names are the contract)
from harness.rundir.readers import (  # noqa: F401
    CorruptFile,
    RunFiles,
    load_json,
    metrics_written,
    partial_measurement,
    rank_failure,
    read_errors,
    read_fatal_report,
    read_fatal_reports,
    read_metrics,
    read_run,
    read_status,
    run_dirs,
    state_from_files,
)
from harness.rundir.records import (  # noqa: F401
    SCHEMA_VERSION,
    TIME_PARTS,
    Measured,
    Predicted,
    RankError,
    RecordError,
    RunResult,
    Status,
)
from harness.rundir.states import (  # noqa: F401
    CANCELLED,
    COMPLETED,
    CORRUPT,
    FAILED,
    FINAL_STATES,
    OOM,
    PENDING,
    PRUNED,
    RUNNING,
    TIMEOUT,
    RunState,
)
from harness.rundir.store import write_error, write_metrics, write_status  # noqa: F401
from harness.rundir.writer import atomic_path, file_mode, write_bytes, write_json, write_text, write_with  # noqa: F401
