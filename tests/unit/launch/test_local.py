"""Local launch: final states come from structured files and the exit code, never from log text."""

import sys
import time
from pathlib import Path

from harness.cli import split_hydra_flags
from harness.engines.rendered import RenderedRun
from harness.launch.local import classify, launch_local
from harness.rundir import write_error, write_json


def test_classify_completed_needs_metrics(tmp_path):
    assert classify(tmp_path, 0)[0] == "FAILED"
    write_json(tmp_path / "metrics.json", {"measured": {}})
    assert classify(tmp_path, 0) == ("COMPLETED", "")


def test_classify_nonzero_exit_says_whether_metrics_were_written(tmp_path):
    assert classify(tmp_path, 1)[1].startswith("launcher exited with code 1 and no metrics.json")
    write_json(tmp_path / "metrics.json", {"measured": {}})
    assert classify(tmp_path, 1) == ("FAILED", "launcher exited with code 1 after writing metrics.json (see launch.log)")


def test_classify_out_of_memory_from_rank_error_records(tmp_path):
    class OutOfMemoryError(RuntimeError):
        pass

    write_error(tmp_path, 1, OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    state, reason = classify(tmp_path, 1)
    assert state == "OOM" and reason.startswith("rank 1: OutOfMemoryError")


def test_classify_plain_failure_and_timeout(tmp_path):
    write_error(tmp_path, 0, ValueError("bad data.path"))
    assert classify(tmp_path, 1) == ("FAILED", "rank 0: ValueError: bad data.path")
    assert classify(tmp_path, None)[0] == "TIMEOUT"


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()  # a zombie is not running


def test_timeout_kills_every_process_of_the_launch(tmp_path):
    child_pid = tmp_path / "child.pid"
    program = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    rendered = RenderedRun(
        run_dir=str(tmp_path), engine="test", launcher="python", nnodes=1, nproc_per_node=1,
        argv=[sys.executable, "-c", program],
    )  # fmt: skip
    state, _ = launch_local(rendered, timeout_s=3, extra_env={})
    assert state == "TIMEOUT"
    assert '"TIMEOUT"' in (tmp_path / "status.json").read_text()
    pid = int(child_pid.read_text())
    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid), "the launcher's child outlived the timeout"


def test_hydra_flags_are_moved_before_overrides():
    flags, overrides = split_hydra_flags(["recipes=a", "-m", "layout.tp=1,2", "--cfg", "job", "x=1"])
    assert flags == ["-m", "--cfg", "job"]
    assert overrides == ["recipes=a", "layout.tp=1,2", "x=1"]
