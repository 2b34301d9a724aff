"""The host's condition on record: what a snapshot holds, and the rule that marks a run disturbed."""

from __future__ import annotations

import subprocess
import sys
import time

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
