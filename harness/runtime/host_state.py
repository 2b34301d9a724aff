"""What could disturb a measurement, recorded at a run's start and end: load, busy processes, CPU clock, GPUs.

Read from /proc and /sys (Linux) and, on GPUs, from NVML through nvidia-ml-py, imported only when a GPU run asks;
whatever cannot be read is recorded as unavailable, with the reason, never guessed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness.plan.time_model import lockstep_wait_share

# A process outside the run using more than this share of one core during the sample is "busy".
BUSY_CORE_SHARE = 0.5
SAMPLE_S = 0.5
TOP_PROCESSES = 5
CPU_FREQ = Path("/sys/devices/system/cpu")
# The scheduler's per-thread statistics: time on a CPU, time runnable but waiting for one (run delay), slices.
SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _cpu_ticks() -> Dict[int, tuple]:
    """pid -> (name, session id, utime + stime in clock ticks) of every readable process (proc(5))."""
    ticks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        # after the name: state(0) ppid(1) pgrp(2) session(3) ... utime(11) stime(12)
        ticks[int(entry.name)] = (name, int(fields[3]), int(fields[11]) + int(fields[12]))
    return ticks


def busy_processes(sample_s: float = SAMPLE_S) -> List[Dict[str, Any]]:
    """Processes outside this run's session that used over BUSY_CORE_SHARE of a core in `sample_s` seconds,
    busiest first (the run's ranks share the session of the launcher or watchdog that started them)."""
    own_session = os.getsid(0)
    hertz = os.sysconf("SC_CLK_TCK")
    before = _cpu_ticks()
    time.sleep(sample_s)
    after = _cpu_ticks()
    busy = []
    for pid, (name, session, ticks) in after.items():
        if session == own_session or pid not in before:
            continue
        share = (ticks - before[pid][2]) / hertz / sample_s
        if share > BUSY_CORE_SHARE:
            busy.append({"pid": pid, "name": name, "cores": round(share, 2)})
    return sorted(busy, key=lambda p: -p["cores"])[:TOP_PROCESSES]


def core_wait_s() -> Optional[float]:
    """Seconds this thread has so far spent runnable but waiting for a CPU, or None where unreadable: the second
    field of its schedstat, in nanoseconds (Linux Documentation/scheduler/sched-stats.rst, "time spent waiting on
    a runqueue"). Other processes on the rank's cores show here directly, with no lag, however many share them
    (the load average lags by a minute; a contender below BUSY_CORE_SHARE is never named busy)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class CoreWaitClock:
    """Wall time and this thread's wait for a core (core_wait_s) since the clock was made."""

    def __init__(self) -> None:
        self._wait, self._start = core_wait_s(), time.perf_counter()

    def read(self) -> Tuple[float, Optional[float]]:
        """(wall seconds, seconds waited for a core or None where unreadable) so far."""
        wall, wait = time.perf_counter() - self._start, core_wait_s()
        return wall, (None if self._wait is None or wait is None else wait - self._wait)

    def share(self) -> Optional[float]:
        """The share of the wall time so far spent waiting for a core (core_wait_share)."""
        wall, waited = self.read()
        return core_wait_share(waited, wall)


def core_wait_share(wait_s: Optional[float], wall_s: float) -> Optional[float]:
    """The share of `wall_s` a rank waited for a core (None when unreadable)."""
    if wait_s is None or wall_s <= 0:
        return None
    return min(1.0, max(0.0, wait_s / wall_s))


def cpu_mhz() -> Optional[List[float]]:
    """Current clock of each CPU (cpufreq in kHz, else /proc/cpuinfo's `cpu MHz`), None where neither is readable."""
    found = []
    for path in sorted(CPU_FREQ.glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            found.append(int(path.read_text()) / 1000.0)
        except (OSError, ValueError):
            continue
    if not found:
        try:
            lines = Path("/proc/cpuinfo").read_text().splitlines()
        except OSError:
            return None
        found = [float(line.split(":", 1)[1]) for line in lines if line.startswith("cpu MHz")]
    return found or None


def gpu_state() -> Dict[str, Any]:
    """Per GPU: SM and memory clocks, temperature, power, throttle reasons and other processes on it (NVML)."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as error:
        return {"available": False, "reason": f"nvidia-ml-py not installed ({error})"}
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return {"available": False, "reason": f"NVML: {error}"}
    try:
        return {"available": True, "devices": [_one_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]}
    finally:
        pynvml.nvmlShutdown()


def _one_gpu(nvml, index: int) -> Dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    processes = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) if hasattr(
        nvml, "nvmlDeviceGetCurrentClocksEventReasons") else nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    idle = getattr(nvml, "nvmlClocksEventReasonGpuIdle", 0x1)
    return {"index": index, "sm_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "memory_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "temperature_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "throttle_reasons": int(reasons) & ~int(idle),
            "other_processes": [pid for pid in processes if _session(pid) != os.getsid(0) and pid not in ancestors()]}


def ancestors() -> set:
    """The pids this process descends from: whatever started the run (a launcher, `make gpu-check`, whose
    reference losses leave it a CUDA context) waits on it, so holding the GPU it does not compete for it."""
    found, pid = set(), os.getppid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(text[text.rindex(")") + 2:].split()[1])  # after the name: state, then ppid
    return found


def _session(pid: int) -> Optional[int]:
    """A process's session id; None when it is not visible here (another container: not this run's)."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def snapshot(gpu: bool) -> Dict[str, Any]:
    """The host's condition now (rank 0, outside the timed steps)."""
    load = os.getloadavg()
    return {"time": time.time(), "load_avg": [round(x, 2) for x in load], "cpus": os.cpu_count(),
            "busy_processes": busy_processes(), "cpu_mhz": cpu_mhz(),
            "gpu": gpu_state() if gpu else {"available": False, "reason": "CPU run"}}


# NVML's clock event reasons that mean the GPU slowed itself down (nvml.h: HW slowdown 0x8, SW thermal 0x20,
# HW thermal 0x40, HW power brake 0x80); the software power cap (0x4) is a busy GPU's normal state.
SLOWDOWN_REASONS = 0x8 | 0x20 | 0x40 | 0x80
# Load beyond the run's own ranks above this share of the CPUs disturbs a run: its ranks wait for cores.
FOREIGN_LOAD_SHARE = 0.5
# Ranks that waited for a core (one or another of them: time_model.lockstep_wait_share) over this share of their
# timed steps ran over 1 / (1 - 0.1) = 1.11 times as long as on cores of their own (time_model.under_core_wait): a
# stretch near the time-model check's 15% median target, which that check could no longer tell from the model's
# own error.
CORE_WAIT_SHARE = 0.1


def disturbances(snapshots: List[Dict[str, Any]], local_ranks: int,
                 wait_shares: Sequence[Optional[float]] = ()) -> List[str]:
    """Why a run's timing may be disturbed, from its start and end snapshots and each rank's core-wait share over
    the timed steps; empty when nothing did.

    A run is disturbed when, at start or end, a process outside it was busy (over BUSY_CORE_SHARE of a core),
    the 1-minute load beyond its own ranks exceeded FOREIGN_LOAD_SHARE of the CPUs, a GPU slowed itself down
    (SLOWDOWN_REASONS) or another process ran on a GPU; or when its ranks waited for a core (one or another of
    them) over CORE_WAIT_SHARE of the timed steps.
    """
    found: List[str] = []
    waits = [share for share in wait_shares if share is not None]
    if waits and lockstep_wait_share(waits) > CORE_WAIT_SHARE:
        each = ", ".join(f"rank {rank} {share:.0%}" for rank, share in enumerate(wait_shares) if share is not None)
        found.append(f"ranks waited for a core {lockstep_wait_share(waits):.0%} of the timed steps ({each})")
    for when, snap in zip(("start", "end"), snapshots):
        busy = ", ".join(f"{p['name']} ({p['pid']}) {p['cores']:.1f} cores" for p in snap.get("busy_processes", []))
        if busy:
            found.append(f"busy at {when}: {busy}")
        cpus = snap.get("cpus") or 1
        foreign = snap["load_avg"][0] - local_ranks
        if foreign > FOREIGN_LOAD_SHARE * cpus:
            found.append(f"load {snap['load_avg'][0]:.2f} at {when} on {cpus} CPUs with {local_ranks} ranks")
        for gpu in (snap.get("gpu") or {}).get("devices", []):
            if gpu["throttle_reasons"] & SLOWDOWN_REASONS:
                found.append(f"GPU {gpu['index']} slowing down at {when} (reasons {gpu['throttle_reasons']:#x})")
            if gpu["other_processes"]:
                found.append(f"GPU {gpu['index']} shared at {when} with pids {gpu['other_processes']}")
    return found


def host_record(start: Dict[str, Any], end: Dict[str, Any], local_ranks: int,
                wait_shares: Sequence[Optional[float]] = ()) -> Dict[str, Any]:
    """metrics.json `measured.host`: both snapshots, each rank's core-wait share over the timed steps (None where
    unreadable), and whether (and why) the run counts as disturbed."""
    reasons = disturbances([start, end], local_ranks, wait_shares)
    return {"start": start, "end": end, "core_wait_shares": list(wait_shares), "disturbed": bool(reasons),
            "disturbances": reasons,
            "rule": f"busy process > {BUSY_CORE_SHARE} core, load beyond the ranks > {FOREIGN_LOAD_SHARE} x CPUs, "
                    f"GPU slowdown or shared GPU, at start or end; ranks waiting for a core > {CORE_WAIT_SHARE:.0%} "
                    "of the timed steps"}
