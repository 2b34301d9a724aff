"""The root cause among the ranks' records, one rule for every launcher: out of memory first, then the
earliest record, a launcher's cleanup after a failure of the same time, then the lowest rank; a rank
killed by a fatal signal is recorded by its own faulthandler report."""

from __future__ import annotations

import os
import subprocess
import sys

from harness import REPO_ROOT
from harness.rundir import RankError, rank_failure, read_errors, write_error, write_json

PEER = RuntimeError("[/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:27532")
CRASH = """
import ctypes, sys
from pathlib import Path
from harness.runtime.fatal_report import FatalReport

def crash_inside_a_collective():
    ctypes.string_at(0)  # a read of address 0: SIGSEGV

with FatalReport(Path(sys.argv[1]), int(sys.argv[2])):
    if sys.argv[3] == "crash":
        crash_inside_a_collective()
"""


def _run_rank(run_dir, rank: int, how: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", CRASH, str(run_dir), str(rank), how], env=env,
                          capture_output=True, text=True, timeout=60)


def _dated(run_dir, name: str, when: float) -> None:
    os.utime(run_dir / "errors" / name, (when, when))


def test_a_segfaulting_rank_leaves_its_record_and_a_clean_exit_leaves_none(tmp_path):
    clean = _run_rank(tmp_path, 3, "exit")
    assert clean.returncode == 0 and not (tmp_path / "errors").exists()
    crashed = _run_rank(tmp_path, 5, "crash")
    assert crashed.returncode == -11  # the signal still ends the rank: its launcher sees SIGSEGV
    (error,) = read_errors(tmp_path)
    assert (error.rank, error.type, error.out_of_memory) == (5, "SIGSEGV", False)
    assert error.message.startswith("Segmentation fault (every thread's stack in errors/rank5.fatal) at File ")
    # innermost frame first: ctypes' string_at, then the function that called it
    frames = error.message.split(" at ", 1)[1].split(" < ")
    assert "string_at" in frames[0] and "crash_inside_a_collective" in frames[1], frames
    assert error.time is not None and "time" not in error.to_dict()


def test_the_earliest_record_is_the_cause_not_the_lowest_rank(tmp_path):
    _run_rank(tmp_path, 5, "crash")
    write_error(tmp_path, 0, PEER)
    write_error(tmp_path, 1, PEER)
    _dated(tmp_path, "rank5.fatal", 1000.0)
    _dated(tmp_path, "rank0.json", 1000.5)
    _dated(tmp_path, "rank1.json", 1000.2)
    state, reason = rank_failure(read_errors(tmp_path))
    assert state == "FAILED" and reason.startswith("rank 5: SIGSEGV: Segmentation fault"), reason
    _dated(tmp_path, "rank5.fatal", 1001.0)  # had the peers failed first, the first of them is named
    assert rank_failure(read_errors(tmp_path))[1].startswith("rank 1: RuntimeError: ")


def test_out_of_memory_wins_and_cleanup_sorts_after_a_failure_of_the_same_time(tmp_path):
    write_json(tmp_path / "errors" / "rank2.json", RankError(2, "SIGTERM", "exit signal 15").to_dict())
    write_json(tmp_path / "errors" / "rank3.json", RankError(3, "RuntimeError", "boom").to_dict())
    _dated(tmp_path, "rank2.json", 50.0)
    _dated(tmp_path, "rank3.json", 50.0)
    assert rank_failure(read_errors(tmp_path)) == ("FAILED", "rank 3: RuntimeError: boom")
    write_json(tmp_path / "errors" / "rank7.json", RankError(7, "OutOfMemoryError", "CUDA", True).to_dict())
    _dated(tmp_path, "rank7.json", 99.0)
    assert rank_failure(read_errors(tmp_path)) == ("OOM", "rank 7: OutOfMemoryError: CUDA")


def test_a_rank_own_exception_record_wins_over_its_fatal_report(tmp_path):
    """An exception first, then a crash while the interpreter went down: the exception is what happened."""
    _run_rank(tmp_path, 4, "crash")
    write_error(tmp_path, 4, ValueError("bad shape"))
    (error,) = read_errors(tmp_path)
    assert error.reason() == "rank 4: ValueError: bad shape"
