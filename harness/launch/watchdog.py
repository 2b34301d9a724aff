"""The process that owns a local run's process tree: it dies with the harness, enforces the time limit, and
records how each rank ended.

`python -m harness.launch.watchdog RUN_DIR HARNESS_PID TIMEOUT_S -- LAUNCHER ARGV...` is started by
harness.launch.local in its own session. torchrun starts every rank in a session of its own, so killing a
process group cannot reach them; the watchdog instead walks its descendants (as a child subreaper, ranks
orphaned by a dead launcher stay its descendants). A parent-death signal tells it when the harness is gone,
even by SIGKILL; the time limit is its own, so it holds without the harness.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import psutil

from harness.launch.oom import KillEvidence, cgroup_oom_kills, host_oom
from harness.rundir import (
    CANCELLED,
    LAUNCH_LOG,
    TIMEOUT,
    RankError,
    error_file,
    read_fatal_report,
    write_json,
    write_status,
)
from harness.runtime.lifecycle import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl

# Exit codes the harness reads back (beside the launcher's own, which is passed through).
EXIT_TIMEOUT = 124  # as coreutils `timeout`
EXIT_STOPPED = 130  # the harness died or asked the run to stop
POLL_S = 0.02  # short enough to see a dead rank before its launcher reaps it (torchrun polls every 0.1 s)
DISCOVER_EVERY = 5
GRACE_S = 10.0  # SIGTERM, then SIGKILL: ranks get this long to flush


class Stop(Exception):
    """SIGTERM / SIGINT / the parent-death signal reached the watchdog."""


@dataclass
class RankSeen:
    pid: int
    rank: int
    last_alive: float
    rss: int = 0
    available: int = 0
    exit_status: Optional[int] = None  # waitpid-style status read from the zombie, when caught


@dataclass
class Tree:
    """The launcher and the ranks under it, sampled every POLL_S."""

    launcher: subprocess.Popen
    ranks: Dict[int, RankSeen] = field(default_factory=dict)
    gone: List[RankSeen] = field(default_factory=list)
    samples: int = 0

    def sample(self) -> None:
        now = time.time()
        available = psutil.virtual_memory().available
        # Looking for new ranks walks every process of the machine: a few times a second is enough.
        if self.samples % DISCOVER_EVERY == 0:
            for child in _descendants(self.launcher.pid):
                if child.pid not in self.ranks and child.pid not in {seen.pid for seen in self.gone}:
                    rank = _rank_of(child)
                    if rank is not None:
                        self.ranks[child.pid] = RankSeen(child.pid, rank, now)
        self.samples += 1
        for pid, seen in list(self.ranks.items()):
            state = _proc_state(pid)
            if state is None or state[0] == "Z":
                seen.exit_status = state[1] if state else None
                self.gone.append(self.ranks.pop(pid))
                continue
            seen.last_alive, seen.available = now, available
            seen.rss = max(seen.rss, state[2])


def _descendants(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _rank_of(process: psutil.Process) -> Optional[int]:
    try:
        rank = process.environ().get("RANK")
    except psutil.Error:
        return None
    return int(rank) if rank is not None and rank.isdigit() else None


def _proc_state(pid: int):
    """(state letter, exit status of a zombie or None, resident bytes) from /proc/PID/stat; None when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Fields after the command: state is field 3, rss (pages) field 24, exit_code field 52 (Linux 3.5+).
    exit_status = int(fields[49]) if fields[0] == "Z" and len(fields) > 49 else None
    return fields[0], exit_status, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def kill_tree(root: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM every descendant of `root` (any session), then SIGKILL what is left after `grace_s`."""
    try:
        processes = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return
    for process in processes:
        _signal(process, signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        _signal(process, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)


def _signal(process: psutil.Process, signum: int) -> None:
    try:
        process.send_signal(signum)
    except psutil.Error:
        pass


def record_signal_deaths(run_dir: Path, gone: List[RankSeen], total_memory: int, oom_kills: int = 0) -> None:
    """errors/rank<N>.json for each rank that died without writing its own (a signal leaves no record),
    stamped with the last time it was seen alive so the first failure sorts first. `oom_kills`: how far
    the memory cgroup's oom_kill counter rose during the run (harness.launch.oom decides what is OOM)."""
    for seen in gone:
        path = run_dir / error_file(seen.rank)
        status = seen.exit_status
        if path.exists() or (status is not None and os.WIFEXITED(status)):
            continue
        if read_fatal_report(run_dir, seen.rank) is not None:
            continue  # the rank wrote its own stack as the signal killed it (harness.runtime.fatal_report)
        signum = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
        name = signal.Signals(signum).name if signum else "killed"
        oom = host_oom(KillEvidence(signal=signum, cgroup_oom_kills=oom_kills, host_available=seen.available,
                                    host_total=total_memory))
        how = f"exit signal {signum} ({name})" if signum else "ended without an error record or exit status"
        evidence = (f"; host memory available {seen.available / 2**30:.2f} of {total_memory / 2**30:.2f} GiB, "
                    f"rank RSS {seen.rss / 2**30:.2f} GiB at the last sample")
        message = f"{how}{evidence}" + (f"; {oom}" if oom else "")
        write_json(path, RankError(seen.rank, name, message, oom is not None).to_dict())
        os.utime(path, (seen.last_alive, seen.last_alive))


def supervise(run_dir: Path, harness_pid: int, timeout_s: float, argv: List[str]) -> int:
    """Run the launcher to its end, the time limit, or the harness's death; the exit code says which."""
    deadline = time.monotonic() + timeout_s
    with open(run_dir / LAUNCH_LOG, "ab") as log:
        launcher = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    tree = Tree(launcher)
    total_memory = psutil.virtual_memory().total
    oom_kills_before = cgroup_oom_kills()
    try:
        while launcher.poll() is None:
            if os.getppid() != harness_pid:
                raise Stop("the harness died")
            if time.monotonic() > deadline:
                kill_tree(os.getpid())
                write_status(run_dir, TIMEOUT, f"local time limit reached (launcher.timeout_s={timeout_s:g})")
                return EXIT_TIMEOUT
            tree.sample()
            time.sleep(POLL_S)
    except Stop as stop:
        kill_tree(os.getpid())
        write_status(run_dir, CANCELLED, f"stopped: {stop}")
        return EXIT_STOPPED
    tree.sample()
    record_signal_deaths(run_dir, tree.gone, total_memory, cgroup_oom_kills() - oom_kills_before)
    kill_tree(os.getpid(), grace_s=2.0)  # anything the launcher left behind
    return launcher.returncode


def _stop(signum, _frame) -> None:
    raise Stop(f"{signal.Signals(signum).name} received (the harness was interrupted or died)")


def main(args: List[str]) -> int:
    run_dir, harness_pid, timeout_s = Path(args[0]), int(args[1]), float(args[2])
    argv = args[args.index("--") + 1:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != harness_pid:  # the harness died before the death signal was armed
        return EXIT_STOPPED
    try:
        return supervise(run_dir, harness_pid, timeout_s, argv)
    except Stop as stop:  # a signal between two checks of the loop
        kill_tree(os.getpid())
        write_status(run_dir, CANCELLED, f"stopped: {stop}")
        return EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

