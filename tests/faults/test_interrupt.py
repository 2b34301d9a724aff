"""Ctrl-C (SIGINT) of a local sweep: the running point is stopped and CANCELLED, the summary is written,
the command exits 130 with no traceback, and no process of the point is left."""

import signal
import sys
import threading

from harness import cli
from harness.config.compose import compose_run_config
from harness.commands import sweep as sweep_command
from harness.launch.points import Point
from harness.rundir import PENDING, read_status, write_status
from tests.faults.procs import fake_job, wait_for_ranks, wait_until_gone


def test_sigint_of_a_local_sweep_cancels_the_running_point(tmp_path, monkeypatch, capsys):
    # Ctrl-C as a terminal's foreground command gets it: Python raises KeyboardInterrupt only where SIGINT was not
    # ignored at start, and a suite started in the background of a non-interactive shell (`make test &`,
    # nohup) inherits it ignored. The fault suite's conftest restores the handler afterwards.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = compose_run_config(["tracking=disabled", "sweep_name=faults"])
    sweep_dir = tmp_path / "faults" / "20260101-000000"
    points = []
    for name in ("000-fake-first", "001-fake-second"):
        run_dir = sweep_dir / name
        run_dir.mkdir(parents=True)
        write_status(run_dir, PENDING)
        points.append(Point(run_dir, [], cfg, fake_job(run_dir)))
    # The grid is given; everything after it (launch, the watchdog, the summary, the exit code) is real.
    monkeypatch.setattr(sweep_command, "expand", lambda overrides, submit_pruned: (sweep_dir, points, "local"))
    first = points[0].run_dir
    ranks = []

    def interrupt_once_running():
        ranks.extend(wait_for_ranks(first))
        # To the main thread, as a terminal's Ctrl-C reaches the single-threaded harness.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    monkeypatch.setattr(sys, "argv", ["harness", "sweep", "sweep_name=faults"])
    code = cli.main()
    out = capsys.readouterr()
    assert code == 130
    assert "Traceback" not in out.out + out.err and "interrupted" in out.err
    assert read_status(first).state == "CANCELLED"
    assert read_status(points[1].run_dir).state == "PENDING", "the next point never started"
    assert not (points[1].run_dir / "launch.log").exists()
    assert (sweep_dir / "summary.csv").exists()
    assert "000-fake-first" in (sweep_dir / "summary.csv").read_text()
    assert wait_until_gone(ranks, timeout_s=15) == []
