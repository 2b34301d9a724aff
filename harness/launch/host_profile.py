"""This host's profile for the time model: measured once, before the first run that asks for it
(cluster.profile=host), by `harness calibrate` in a subprocess, then read from its cache."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from harness.plan.hardware import cpu_profile_name, load_profile, profile_path


def measure_host_profile(cfg: Any) -> bool:
    """Measure the host profile the run asks for (cluster.profile=host) when it is missing or older than
    this calibration; True when it was measured now."""
    return getattr(cfg.cluster, "profile", None) == "host" and measure_missing_host_profile()


def measure_missing_host_profile() -> bool:
    """Measure this host's cached profile when it is missing or older than this calibration; True when it was
    measured now. A failed measurement is reported and the caller goes on without a time prediction."""
    if load_profile(profile_path(cpu_profile_name())) is not None:
        return False
    print("[harness] measuring this host for the time model (once, about 20 s; `harness calibrate` redoes it)",
          file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, "-m", "harness.runtime.calibrate"], capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"[harness] host calibration failed (exit {proc.returncode}: {tail}); step time is not predicted",
              file=sys.stderr, flush=True)
        return False
    return True
