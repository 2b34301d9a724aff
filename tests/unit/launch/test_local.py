"""Local launch: final states come from structured files and the exit code, never from log text."""

import socket
import sys
import time
from pathlib import Path

import pytest

from harness.cli import split_hydra_flags
from harness.engines.rendered import LOCAL_PORTS, PORT_BASE, PORT_SPAN, RenderedRun
from harness.launch.local import classify, free_port, launch_local
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


def test_local_rendezvous_ports_lie_below_this_machines_ephemeral_ports_and_apart_from_slurm_jobs():
    # An outgoing connection (gloo opens dozens a run) takes its local port from the ephemeral range; a
    # rendezvous port drawn there can be taken between the harness's check and the launcher's bind.
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert LOCAL_PORTS.stop <= ephemeral_low and LOCAL_PORTS.stop <= PORT_BASE
    assert not set(LOCAL_PORTS) & set(range(PORT_BASE, PORT_BASE + PORT_SPAN))
    assert all(free_port() in LOCAL_PORTS for _ in range(20))


def test_a_port_someone_listens_on_is_never_handed_out():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        free = free_port()
        draws = iter([busy, busy, free])
        assert free_port(draw=lambda ports: next(draws)) == free


def test_no_free_port_after_every_draw_is_one_clear_error():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        with pytest.raises(OSError, match="no free rendezvous port in 10000-19999 after 64 draws") as raised:
            free_port(draw=lambda ports: busy)
        assert raised.value.strerror == "no free rendezvous port in 10000-19999 after 64 draws"
