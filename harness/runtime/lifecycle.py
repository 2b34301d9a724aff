"""A rank's tie to its launcher: it dies with it, and hears the time limit's warning.

The local watchdog (harness.launch.watchdog) and Slurm's step cleanup stop a run's tree from above; this is
the tie from below, for the case where everything above a rank is killed at once (kill -9 of a process
group, a launcher crash on a node that keeps running): the kernel then signals the rank itself.
"""

from __future__ import annotations

import ctypes
import os
import signal

from harness.plan.time_limit import WARNING_SIGNAL

# prctl options from <linux/prctl.h>.
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Ask the kernel for `signum` when the parent (the launcher that started this rank) exits.

    The parent may already be gone by the time the request is made (the rank is then a child of a subreaper
    or init): that is checked after arming, and the rank signals itself.
    """
    parent = os.getppid()
    prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), signum)


class WarningSignal:
    """Slurm's warning ahead of the time limit (`harness.plan.time_limit.WARNING_SIGNAL`, asked for by the job
    script's --signal), noted when it arrives. The rank acts on it only at a step boundary, where every rank
    agrees to stop after the same step (`harness.runtime.bench.agreed_to_stop`) and writes what it measured."""

    def __init__(self, name: str = WARNING_SIGNAL):
        self.received = False
        signal.signal(getattr(signal, f"SIG{name}"), self._note)

    def _note(self, signum, frame) -> None:
        self.received = True
