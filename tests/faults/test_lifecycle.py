"""Process lifecycle under faults: the real torchrun with fake ranks, killed the way users and kernels do."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from harness import REPO_ROOT
from harness.engines.rendered import RenderedRun
from harness.launch.local import launch_local
from harness.launch.run_lock import LOCK_FILE, RunLock, live_holder
from harness.launch.watchdog import RankSeen, record_signal_deaths
from harness.rundir import error_file, fatal_report_file, rank_failure, read_errors, read_status
from tests.faults.procs import fake_job, running, wait_for_ranks, wait_until_gone

HARNESS = "import sys; from pathlib import Path; from harness.engines.rendered import RenderedRun; " \
          "from harness.launch.local import launch_local; " \
          "print(launch_local(RenderedRun.load(Path(sys.argv[1])), 120, {}), flush=True)"


def _processes_naming(text: str):
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(text in part for part in process.info["cmdline"] or []) and running(process.pid):
            found.append(process.pid)
    return found


def test_kill9_of_the_harness_leaves_no_process_behind(fake_run):
    fake_job(fake_run).save()
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(fake_run)], cwd=REPO_ROOT)
    ranks = wait_for_ranks(fake_run)
    tree = [child.pid for child in psutil.Process(harness.pid).children(recursive=True)]
    assert set(ranks) <= set(tree), "the ranks run under the harness's watchdog"
    harness.kill()
    harness.wait()
    assert wait_until_gone(tree, timeout_s=30) == [], "a process of the run outlived the harness"
    assert _processes_naming(str(fake_run)) == []
    status = read_status(fake_run)
    assert status.state == "CANCELLED" and "harness" in status.reason
    assert live_holder(fake_run) is None, "the lock of a dead tree is stale"


def test_kill9_of_one_rank_names_that_rank_not_its_peer(fake_run):
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=launch_local(fake_job(fake_run), 120, {})))
    worker.start()
    ranks = wait_for_ranks(fake_run)
    time.sleep(1.0)  # a rank dies some time into a run, not in its first milliseconds
    os.kill(ranks[1], signal.SIGKILL)
    worker.join(timeout=90)
    state, reason = result["out"]
    assert state in ("FAILED", "OOM") and reason.startswith("rank 1: "), reason
    assert "SIGKILL" in reason or "without an error record" in reason, reason
    # Rank 0's own record (the peer's symptom) is kept, but it is not the reason.
    assert {error.rank for error in read_errors(fake_run)} == {0, 1}
    assert read_status(fake_run).reason == reason
    assert wait_until_gone(ranks, timeout_s=10) == []


def test_a_rank_killed_by_sigsegv_is_named_with_its_stack_not_its_peer(fake_run):
    """faulthandler's report (errors/rank1.fatal, written as the rank dies) is the rank's record, so the
    reason is the same whether the local watchdog saw the death or not (a Slurm job has no watchdog)."""
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=launch_local(fake_job(fake_run), 120, {})))
    worker.start()
    ranks = wait_for_ranks(fake_run)
    time.sleep(1.0)
    os.kill(ranks[1], signal.SIGSEGV)
    worker.join(timeout=90)
    state, reason = result["out"]
    assert state == "FAILED", reason
    assert reason.startswith("rank 1: SIGSEGV: Segmentation fault (every thread's stack in errors/rank1.fatal) at "
                             'File "'), reason
    assert "fake_rank.py" in reason, reason
    assert not (fake_run / "errors" / "rank1.json").exists()  # the watchdog left the rank's own record
    assert rank_failure(read_errors(fake_run)) == ("FAILED", reason)
    assert wait_until_gone(ranks, timeout_s=10) == []


def _watchdog_of_this_process() -> psutil.Process:
    deadline = time.time() + 30
    while time.time() < deadline:
        for child in psutil.Process().children():
            if "harness.launch.watchdog" in " ".join(child.cmdline()):
                return child
        time.sleep(0.05)
    raise AssertionError("no watchdog started")


def test_a_sigsegv_is_named_even_when_the_watchdog_sees_the_peers_cleanup_only_afterwards(fake_run):
    """A loaded host can keep the watchdog off the CPU while one rank segfaults and the launcher kills its
    peer: the peer was then last seen alive before the crash. Stopping the watchdog over that stretch makes
    the overlap certain; the crash, not the cleanup, is still the reason."""
    result = {}
    job = fake_job(fake_run, mode="unaware")
    worker = threading.Thread(target=lambda: result.update(out=launch_local(job, 120, {})))
    worker.start()
    ranks = wait_for_ranks(fake_run)
    watchdog = _watchdog_of_this_process()
    time.sleep(1.0)
    watchdog.suspend()
    try:
        os.kill(ranks[1], signal.SIGSEGV)
        assert wait_until_gone(ranks, timeout_s=60) == [], "the launcher did not end the peer"
    finally:
        watchdog.resume()
    worker.join(timeout=90)
    state, reason = result["out"]
    assert {error.rank: error.type for error in read_errors(fake_run)} == {0: "killed", 1: "SIGSEGV"}
    assert state == "FAILED" and reason.startswith("rank 1: SIGSEGV: "), reason
    assert rank_failure(read_errors(fake_run)) == ("FAILED", reason)


def test_sigkill_near_the_memory_limit_reads_as_host_oom(tmp_path):
    total = 24 * 2**30
    near = RankSeen(pid=1, rank=3, last_alive=time.time(), rss=20 * 2**30, available=int(0.02 * total),
                    exit_status=signal.SIGKILL)  # waitpid status of a SIGKILL: the signal number itself
    roomy = RankSeen(pid=2, rank=4, last_alive=time.time(), rss=2**30, available=total // 2,
                     exit_status=signal.SIGKILL)
    record_signal_deaths(tmp_path, [near, roomy], total)
    errors = {error.rank: error for error in read_errors(tmp_path)}
    assert errors[3].out_of_memory and "out of memory (host)" in errors[3].message
    assert "host memory available 0.48 of 24.00 GiB" in errors[3].message
    assert not errors[4].out_of_memory and errors[4].type == "SIGKILL"


def test_a_death_found_after_a_peers_crash_is_dated_after_it_and_one_found_before_it_is_not(tmp_path):
    crash = time.time()
    report = tmp_path / fatal_report_file(1)
    report.parent.mkdir()
    report.write_text('Fatal Python error: Segmentation fault\n\nCurrent thread 0x1:\n  File "step.py", line 9\n')
    os.utime(report, (crash, crash))
    cleanup = RankSeen(pid=1, rank=0, last_alive=crash - 0.5, seen_gone=crash + 0.5, available=2**33)
    record_signal_deaths(tmp_path, [cleanup], 24 * 2**30)
    assert rank_failure(read_errors(tmp_path))[1].startswith("rank 1: SIGSEGV: Segmentation fault"), \
        "seen alive before the crash and gone after it: the crash is named"
    (tmp_path / error_file(0)).unlink()
    first = RankSeen(pid=1, rank=0, last_alive=crash - 0.5, seen_gone=crash - 0.1, available=2**33)
    record_signal_deaths(tmp_path, [first], 24 * 2**30)
    assert rank_failure(read_errors(tmp_path))[1].startswith("rank 0: killed: "), "gone before the crash: it died first"


def test_a_live_run_is_never_launched_twice(fake_run):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with RunLock(fake_run) as lock:
            lock.hand_to(holder.pid)
            state, reason = launch_local(fake_job(fake_run), 120, {})
        assert state == "RUNNING" and f"pid {holder.pid}" in reason
        assert not (fake_run / "launch.log").exists() and not (fake_run / "pids").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_is_replaced(fake_run):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (fake_run / LOCK_FILE).write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid,
                                                  "start_time": time.time() - 5}))
    assert live_holder(fake_run) is None
    rendered = RenderedRun(run_dir=str(fake_run), engine="fake", launcher="python", nnodes=1, nproc_per_node=1,
                           argv=[sys.executable, "-c", "print('ran')"])
    state, reason = launch_local(rendered, 60, {})
    assert "ran" in (fake_run / "launch.log").read_text()
    assert state == "FAILED" and "no metrics.json" in reason
    assert not (fake_run / LOCK_FILE).exists()


# A launcher (parent) that starts one rank and sleeps; the rank asks to die with it or not, then sleeps.
_LAUNCHER = ("import subprocess, sys, time; "
             "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
             "print(child.pid, flush=True); time.sleep(120)")
_RANK = "import time; {arm}time.sleep(120)"


def _orphan_after_parent_kill(arm: str) -> bool:
    """Start launcher -> rank, kill -9 the launcher alone; True when the rank outlives it by 5 s."""
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, _RANK.format(arm=arm)], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
    rank = int(launcher.stdout.readline())
    time.sleep(1.0)  # the rank has armed its death signal (imports done)
    launcher.kill()
    launcher.wait()
    survivors = wait_until_gone([rank], timeout_s=5)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return bool(survivors)


def test_a_rank_dies_with_its_launcher_even_when_only_the_launcher_is_killed():
    """The rank's own parent-death signal (runtime.lifecycle, armed first thing in bench.main); without it the
    rank of a kill -9'd launcher outside any watchdog runs on."""
    assert not _orphan_after_parent_kill("from harness.runtime.lifecycle import die_with_parent; "
                                         "die_with_parent(); ")
    assert _orphan_after_parent_kill(""), "control: an unarmed rank outlives its launcher"
