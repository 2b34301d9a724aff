"""The host's condition on record: what a snapshot holds, and the rule that marks a run disturbed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.runtime import host_state


def snap(load=0.5, busy=(), gpus=None):
    return {"time": 0.0, "load_avg": [load, load, load], "cpus": 4, "busy_processes": list(busy), "cpu_mhz": None,
            "gpu": {"available": gpus is not None, "devices": gpus or []}}


def test_a_quiet_host_leaves_the_run_undisturbed():
    record = host_state.host_record(snap(2.0), snap(2.5), local_ranks=2)
    assert record["disturbed"] is False and record["disturbances"] == [] and "busy process" in record["rule"]


def test_a_busy_neighbour_high_load_or_a_troubled_gpu_disturb_it():
    busy = [{"pid": 7, "name": "stress", "cores": 1.0}]
    gpu = [{"index": 0, "throttle_reasons": 0x20, "other_processes": [99]}]
    reasons = host_state.disturbances([snap(busy=busy), snap(load=6.0, gpus=gpu)], local_ranks=2)
    assert reasons == ["busy at start: stress (7) 1.0 cores", "load 6.00 at end on 4 CPUs with 2 ranks",
                       "GPU 0 slowing down at end (reasons 0x20)", "GPU 0 shared at end with pids [99]"]
    # the software power cap alone is a busy GPU's normal state
    capped = [{"index": 0, "throttle_reasons": 0x4, "other_processes": []}]
    assert host_state.disturbances([snap(gpus=capped), snap()], local_ranks=2) == []


def test_a_snapshot_sees_a_busy_process_outside_the_run(monkeypatch):
    # a shared 2-core host may give the spinner well under a core: any measurable share counts here
    monkeypatch.setattr(host_state, "BUSY_CORE_SHARE", 0.01)
    monkeypatch.setattr(host_state, "TOP_PROCESSES", 1000)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(0.3)
        found = host_state.snapshot(gpu=False)
    finally:
        spinner.kill()
        spinner.wait()
    assert spinner.pid in [p["pid"] for p in found["busy_processes"]]
    assert len(found["load_avg"]) == 3 and found["cpus"] >= 1
    assert found["gpu"] == {"available": False, "reason": "CPU run"}


def test_without_nvml_the_gpu_state_is_recorded_as_unavailable():
    state = host_state.gpu_state()
    assert state["available"] is False and ("nvidia-ml-py" in state["reason"] or "NVML" in state["reason"])


def test_ranks_that_waited_for_a_core_disturb_the_run_and_say_how_long_each():
    reasons = host_state.disturbances([snap(), snap()], local_ranks=2, wait_shares=[0.04, 0.31])
    assert reasons == ["ranks waited for a core 34% of the timed steps (rank 0 4%, rank 1 31%)"]
    assert host_state.disturbances([snap(), snap()], local_ranks=2, wait_shares=[0.05, None]) == []
    # each under the threshold, together over it: the ranks move in lock-step, so either one's wait stalls both
    assert host_state.disturbances([snap(), snap()], local_ranks=2, wait_shares=[0.06, 0.06]) == [
        "ranks waited for a core 12% of the timed steps (rank 0 6%, rank 1 6%)"]
    record = host_state.host_record(snap(), snap(), 2, [0.04, 0.31])
    assert record["core_wait_shares"] == [0.04, 0.31] and record["disturbed"] and "waiting for a core" in record["rule"]


def spin(seconds_of_work: int) -> float:
    """Wall seconds a fixed amount of pure-Python work takes on this thread."""
    start = time.perf_counter()
    total = 0
    for i in range(seconds_of_work):
        total += i * i
    return time.perf_counter() - start


def own_time(work: int):
    """(wall seconds, wait share) of the work, the wait read as the runtime reads it."""
    wait = host_state.core_wait_s()
    wall = spin(work)
    return wall, host_state.core_wait_share(host_state.core_wait_s() - wait, wall)


def _alone_then_beside_a_spinner(cpu: int, work: int):
    """own_time of the work pinned to `cpu`, then again with a busy loop pinned beside it."""
    alone = own_time(work)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        os.sched_setaffinity(spinner.pid, {cpu})
        time.sleep(0.2)
        return alone, own_time(work)
    finally:
        spinner.kill()
        spinner.wait()


def test_a_contender_on_the_same_core_shows_as_core_wait_and_the_rule_recovers_the_own_time():
    """Pinned with a spinner to one core, this thread waits for it about half the time, and the wall time less
    the waits (time_model.under_core_wait's rule) is the work's own time, as without the contender; on a shared
    host other load adds waits to both measurements, which the rule removes alike. What the guest kernel cannot
    see (a hypervisor's steal) can still move one pair by a third, so up to three pairs are taken; without the
    rule every pair would differ by the spinner's factor of two."""
    from harness.plan.time_model import under_core_wait

    if host_state.core_wait_s() is None:
        raise AssertionError(f"{host_state.SCHEDSTAT} is unreadable on this Linux host")
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        for _ in range(3):
            (alone, alone_share), (shared, shared_share) = _alone_then_beside_a_spinner(cpu, 3_000_000)
            own_alone, own_shared = alone * (1 - alone_share), shared * (1 - shared_share)
            if own_shared == pytest.approx(own_alone, rel=0.3):
                break
    finally:
        os.sched_setaffinity(0, before)
    assert shared_share > 0.3
    assert own_shared == pytest.approx(own_alone, rel=0.3)
    assert under_core_wait(own_shared, [shared_share]) == pytest.approx(shared)


def test_the_processes_a_run_descends_from_are_not_counted_as_sharing_its_gpu():
    """`make gpu-check` keeps a CUDA context after its reference losses and waits on each run it starts in a new
    session: NVML lists it on the GPU, and it must not mark every run disturbed."""
    probe = ("import os; from harness.runtime import host_state; "
             f"print({os.getpid()} in host_state.ancestors(), os.getpid() in host_state.ancestors())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         start_new_session=True).stdout.split()
    assert out == ["True", "False"]
    assert os.getpid() not in host_state.ancestors() and os.getppid() in host_state.ancestors()
