"""Who a local run's end is blamed on: the rank that failed or hung, never a rank's child or nobody; a
run that ended well blames no one; the ranks never outlive the run's watchdog."""

import os
import signal
import threading
import time

import psutil

from harness.launch.local import launch_local
from harness.launch.watchdog import rank_processes
from harness.rundir import read_errors, read_status
from tests.faults.procs import fake_job, running, wait_for_ranks, wait_until_gone


def _launch_in_thread(run_dir, timeout_s=120, mode=""):
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=launch_local(fake_job(run_dir, mode=mode),
                                                                            timeout_s, {})))
    worker.start()
    return worker, result


def test_a_completed_run_leaves_no_error_record(fake_run):
    """Each fake rank starts a short-lived child that inherits RANK, as a real rank's compiler does."""
    state, reason = launch_local(fake_job(fake_run, mode="succeed"), 120, {})
    assert (state, reason) == ("COMPLETED", "")
    assert not (fake_run / "errors").exists(), list((fake_run / "errors").iterdir())


def test_a_ranks_children_are_not_ranks(fake_run):
    worker, result = _launch_in_thread(fake_run)
    ranks = wait_for_ranks(fake_run)
    launcher = psutil.Process(ranks[0]).parent().pid
    deadline = time.time() + 10
    while time.time() < deadline and not any(child.children() for child in psutil.Process(launcher).children()):
        time.sleep(0.02)  # each rank's child lives 0.5 s from the rank's start
    tracked = rank_processes(launcher)
    time.sleep(1.0)  # a rank dies some time into a run, after its children ended
    os.kill(ranks[1], signal.SIGKILL)
    worker.join(timeout=90)
    state, reason = result["out"]
    # Not "out of memory" nor "ended without an error record": that was a rank's child, seen end.
    assert state == "FAILED" and reason.startswith("rank 1: SIGKILL"), reason
    assert tracked == {ranks[0]: 0, ranks[1]: 1}


def test_a_stopped_rank_is_named_when_the_time_limit_ends_the_run(fake_run):
    # The time limit must leave room for the watchdog, torchrun and both ranks to start first: on two busy cores
    # (`make test` runs the Slurm tests beside this one) torchrun's import alone took more than 6 s.
    worker, result = _launch_in_thread(fake_run, timeout_s=15)
    ranks = wait_for_ranks(fake_run)
    os.kill(ranks[1], signal.SIGSTOP)
    try:
        worker.join(timeout=60)
    finally:
        for pid in ranks:
            if running(pid):
                os.kill(pid, signal.SIGCONT)
    state, reason = result["out"]
    assert state == "TIMEOUT", reason
    assert "rank 1 stopped by a signal" in reason, reason
    assert wait_until_gone(ranks, timeout_s=10) == []


def test_kill9_of_the_watchdog_takes_the_launcher_and_ranks_down(fake_run):
    worker, result = _launch_in_thread(fake_run)
    ranks = wait_for_ranks(fake_run)
    launcher = psutil.Process(ranks[0]).parent()
    watchdog = launcher.parent()
    assert "harness.launch.watchdog" in " ".join(watchdog.cmdline())
    watchdog.kill()
    survivors = wait_until_gone([launcher.pid, *ranks], timeout_s=20)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], "a process outlived the watchdog"
    worker.join(timeout=30)
    state, reason = result["out"]
    assert state == "FAILED" and "watchdog was killed by SIGKILL" in reason, reason
    assert read_status(fake_run).reason == reason


def test_a_hung_rank_is_the_one_whose_cpu_time_stopped_growing():
    """Without a stopped process, the hung rank is the one whose CPU time stopped; its peers keep polling."""
    import subprocess

    from harness.launch.watchdog import STALL_S, RankSeen, Tree, stall_reason

    now = time.time()
    tree = Tree(subprocess.Popen(["true"]))
    tree.launcher.wait()
    tree.ranks = {1: RankSeen(1, 0, now, last_progress=now - 1), 2: RankSeen(2, 1, now, last_progress=now - 40)}
    assert [seen.rank for seen in tree.stalled()] == [1]
    assert stall_reason(tree.stalled(), now) == "rank 1 made no progress for the last 40 s"
    tree.ranks[2].last_progress = now - STALL_S / 2  # slow, not hung: nobody is named
    assert tree.stalled() == [] and stall_reason([], now) == ""
