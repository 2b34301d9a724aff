"""This host's profile for the time model: measured once, before the first run that asks for it
(cluster.profile=host), by `harness calibrate` in a subprocess, then read from its cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from harness.plan.hardware import cpu_profile_name, load_profile, profile_path
from harness.runtime.host_state import CORE_WAIT_SHARE
from harness.terminal import print_fitted

# A profile is measured on CALIBRATION_RANKS processes (harness.runtime.calibrate's default); load beyond them
# above this share of the CPUs means its micro-benchmarks shared their cores (runtime.host_state's rule).
CALIBRATION_RANKS = 2
LOADED_SHARE = 0.5


def measure_host_profile(cfg: Any) -> bool:
    """Measure the host profile the run asks for (cluster.profile=host) when it is missing or older than
    this calibration; True when it was measured now."""
    return getattr(cfg.cluster, "profile", None) == "host" and measure_missing_host_profile()


def loaded(load: float, cpus: int) -> bool:
    return load - CALIBRATION_RANKS > LOADED_SHARE * cpus


def stale_reason(path: Path, load_now: float, cpus: int) -> Optional[str]:
    """Why a cached profile should be measured again, or None: it was measured under load and the host is
    quieter now, or on a host with another number of cores (the cache is keyed by host name only)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    cores = data.get("cores_per_node") or 0
    if cores and cores != cpus:
        return f"it was measured on {cores} cores and this host has {cpus}"
    raw = data.get("raw") or {}
    then = (raw.get("load_average") or [0.0])[0]
    wait = raw.get("core_wait_share")
    # Measured under load: its ranks waited for a core over the runtime's threshold (a direct measure, where the
    # profile has it), or the load average says their cores were shared.
    under = (f"while its ranks waited for a core {wait:.0%} of the time (load {then:.1f} on {cpus} CPUs)"
             if wait is not None and wait > CORE_WAIT_SHARE else
             f"under load {then:.1f} on {cpus} CPUs" if loaded(then, cpus) else None)
    if under and not loaded(load_now, cpus):
        return f"it was measured {under} and the load is {load_now:.1f} now"
    if under:
        print_fitted(f"[harness] warning: this host's profile was measured {under}; predicted step times may be too "
                     "slow (`harness calibrate` on a quiet host redoes it)", sys.stderr)
    return None


def measure_missing_host_profile() -> bool:
    """Measure this host's cached profile when it is missing, older than this calibration, or stale (see
    stale_reason); True when it was measured now. A failed measurement is reported and the caller goes on
    without a time prediction."""
    path = profile_path(cpu_profile_name())
    if load_profile(path) is not None:
        reason = stale_reason(path, os.getloadavg()[0], len(os.sched_getaffinity(0)))
        if reason is None:
            return False
        print_fitted(f"[harness] warning: measuring this host's profile again: {reason}", sys.stderr)
    print_fitted("[harness] measuring this host for the time model (once, about 20 s; `harness calibrate` redoes it)",
                 sys.stderr)
    proc = subprocess.run([sys.executable, "-m", "harness.runtime.calibrate"], capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print_fitted(f"[harness] host calibration failed (exit {proc.returncode}: {tail}); step time is not predicted",
                     sys.stderr)
        return False
    return True
